"""The turn loop: a rollout's model turns, each one or more samplings streamed out as events.

Theory of operation
-------------------
:class:`TurnLoop` drives the model over a rollout's conversation, which it
reaches through :class:`Conversation` (the rollout, ``engine/rollout.py``).
It never changes the conversation itself: every change to the context, the
token cache, the counts, the timings and the inbox is a method of the
rollout, which the loop calls at its steps. So the rule "only its own module
changes a Rollout" holds with the loop outside it.

- :meth:`TurnLoop.run_turns`: turns until the model stops with no client call
  pending; at calls still unanswered the rollout pauses (``Rollout.pause``)
  and, once every call has its output, the loop turns again. Append mode also
  pauses after a transient upstream failure, for any append (SPEC §16).
- :meth:`TurnLoop.turn`: one model turn. A model that calls a hosted tool (an
  MCP server's) samples again as soon as the call's output is in its context,
  in the same turn and under one timing: the rollout never pauses for the
  server's own calls (``engine/hosted.py``).
- one sampling: the rollout takes the new input in
  (:meth:`Conversation.begin_sampling`: pre-inference, which may count it
  after the first output, ``engine/counting.py``); the loop asks the model
  (:meth:`TurnLoop.sample_request`); a :class:`Sampling` feeds its chunks to
  the turn's Reply; the rollout takes the model's output into its context
  (:meth:`Conversation.take_output`).

A :class:`Sampling` stops early at a shipped-shape steering point
(``steered``), at the Response's event cap (``max_events``, never with a call
half written), and cuts its open item short when the engine fails. While the
model is silent it sends ``keepalive`` events (:class:`Keepalive`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Final, Protocol

import msgspec

from protocol.events import ResponseCreate
from protocol.items import Item, ToolChoice, ToolChoiceAllowed

from .counting import CountedInput, DeferredCount
from .failures import kept, log_upstream_failure
from .hosted import HostedCalls
from .limits import EngineLimits
from .render import TokenCache
from .reply import Reply
from .sampling import (
    ItemEnd,
    ModelSpec,
    SampleChunk,
    Sampler,
    SampleRequest,
    Stop,
    TextDelta,
    ToolCallStart,
    UpstreamError,
    Usage,
)
from .timing import TurnTiming

__all__ = [
    "ENDING_STOPS",
    "INCOMPLETE_STOPS",
    "Conversation",
    "Keepalive",
    "Sampling",
    "TurnInput",
    "TurnLoop",
]

#: How :meth:`TurnLoop.run_turns` may stop short: the Response ends ``incomplete``.
#: ``steered``: a shipped-shape segment stopped at a safe point for steering input.
INCOMPLETE_STOPS: Final = frozenset(
    {"max_output_tokens", "context_length_exceeded", "max_events", "pause_timeout", "steered"}
)
#: Stops after which the model cannot go on: the Response ends there, however it was to go on.
ENDING_STOPS: Final = frozenset({"max_output_tokens", "context_length_exceeded", "max_events"})


@dataclasses.dataclass(slots=True)
class TurnInput:
    """A sampling's input as the rollout took it in (:meth:`Conversation.begin_sampling`)."""

    #: The sampling's timing, its pre-inference phases measured so far.
    timing: TurnTiming
    #: The new input's count, which may still be waiting for the first output.
    held: DeferredCount
    #: Tokens of the context the model has already processed, and the others.
    cached: int
    uncached: int
    #: Clock readings: the sampling started, the model was resolved, the input
    #: rendered (shifted past the time spent on hosted calls and on waiting).
    started: float
    resolved: float
    rendered: float
    #: When the input that resumed a paused rollout arrived, if it did.
    resumed_at: float | None


class Conversation(CountedInput, Protocol):
    """What the turn loop asks of its rollout (``engine/rollout.py``), which alone
    changes the conversation: the attributes are read, the methods change it (a
    deferred count's among them, :class:`~longresponse.engine.counting.CountedInput`)."""

    @property
    def limits(self) -> EngineLimits: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def request(self) -> ResponseCreate: ...

    @property
    def model(self) -> ModelSpec: ...

    @property
    def sampler(self) -> Sampler: ...

    @property
    def context(self) -> Sequence[Item]: ...

    @property
    def tokens(self) -> TokenCache: ...

    @property
    def chain(self) -> str: ...

    @property
    def hosted(self) -> HostedCalls | None: ...

    @property
    def timings(self) -> Sequence[TurnTiming]: ...

    @property
    def has_input(self) -> bool:
        """Input waits in the inbox for the next turn."""
        ...

    async def begin_sampling(self, reply: Reply, *, prefix_changed: bool) -> TurnInput | None:
        """Take the inbox in (pre-inference); ``None``: a compaction turn, done."""
        ...

    def take_output(self, produced: list[Item], timing: TurnTiming) -> None:
        """The model's output joins the context and the token cache; the timing is kept."""
        ...

    def merge_timings(self, first: int) -> None:
        """The timings since ``first`` are one turn's: one timing."""
        ...

    def steer_now(self, reply: Reply, chunk: SampleChunk | None) -> bool:
        """Steering input waits and the turn is at a safe point (before ``chunk``)."""
        ...

    def bill_upstream(self, counted: Usage, billed: tuple[int, int]) -> None:
        """Replace the turn's (input, cached) tokens billed so far with the engine's own."""
        ...

    async def cut_short(self, reply: Reply, unbilled: tuple[int, int] | None) -> None:
        """The item being written ends ``incomplete``; ``unbilled`` is taken back."""
        ...

    async def pause(self, failed: UpstreamError | None = None) -> bool:
        """Wait for the pending calls' outputs (or an append); False if it timed out."""
        ...


class TurnLoop:
    """The model turns over one rollout's conversation (see the module docstring)."""

    __slots__ = ("conversation",)

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation

    async def run_turns(self, reply: Reply, *, prefix_changed: bool = False) -> str:
        """Turns, pausing in place for client tool outputs, until the model stops
        with nothing pending: the last stop reason, or ``pause_timeout``."""
        conversation = self.conversation
        while True:
            try:
                stop = await self.turn(reply, prefix_changed=prefix_changed)
            except UpstreamError as exc:
                if not reply.append or not exc.transient:  # a refusal, or the shipped shape
                    raise
                if not await conversation.pause(exc):  # append mode waits for any append
                    return "pause_timeout"
                continue
            prefix_changed = False
            if stop in ENDING_STOPS:
                return stop
            if reply.pending_calls and not await conversation.pause():
                return "pause_timeout"
            if not conversation.has_input:
                return stop

    async def turn(self, reply: Reply, *, prefix_changed: bool = False) -> str:
        """One run of the model over the context plus whatever is in the inbox.

        Its events go to ``reply``. With ``prefix_changed`` nothing counts as
        cached: the model must prefill the whole context again (the tokenizer
        work is still reused). Returns the sampler's stop reason.
        """
        conversation = self.conversation
        first = len(conversation.timings)
        try:
            again = False
            while True:
                stop = await self._sample(reply, prefix_changed=prefix_changed, again=again)
                prefix_changed, again = False, True
                conversation.merge_timings(first)  # one turn: one timing
                hosted = conversation.hosted
                if (
                    hosted is None
                    or not hosted.ran
                    or stop in INCOMPLETE_STOPS
                    or stop == "max_events"
                    or reply.pending_calls
                ):
                    return stop
        finally:
            if conversation.hosted is not None:  # no MCP session outlives its turn
                await conversation.hosted.aclose()

    async def _sample(self, reply: Reply, *, prefix_changed: bool, again: bool) -> str:
        """One sampling of the model (see :meth:`turn`): the input taken in, the
        model asked, its output streamed out and taken into the context."""
        conversation = self.conversation
        taken = await conversation.begin_sampling(reply, prefix_changed=prefix_changed)
        if taken is None:  # a compaction turn: the compaction item is its output
            return "stop"
        sampling = Sampling(conversation, reply, taken)
        stop = await sampling.run(self.sample_request(reply, taken, again=again))
        conversation.take_output(sampling.produced(), taken.timing)
        if sampling.failed is not None:
            raise sampling.failed
        return stop

    def sample_request(self, reply: Reply, taken: TurnInput, *, again: bool) -> SampleRequest:
        """What the model is asked to sample over the context; ``again``: after a
        hosted call in the same turn, where a ``tool_choice`` that forces a call
        has had its call and the model chooses freely (``auto``)."""
        conversation = self.conversation
        request = conversation.request
        sample_request = SampleRequest.for_turn(
            request,
            conversation.context,
            cached_tokens=taken.cached,
            uncached_tokens=taken.uncached,
            cap=conversation.limits.max_output_tokens,
            spent=reply.output_tokens(),
            chain=conversation.chain,
        )
        if again:  # a model that may make no more hosted calls must answer
            choice = _chosen_freely(sample_request.tool_choice)
            if conversation.hosted is not None:
                choice = conversation.hosted.tool_choice_again(choice)
            sample_request = dataclasses.replace(sample_request, tool_choice=choice)
        limit = request.max_tool_calls
        if limit is not None and reply.calls_made >= limit:  # the model answers now
            sample_request = dataclasses.replace(sample_request, tool_choice="none")
        return sample_request


class Sampling:
    """One pass over the sampler's chunks, fed to the turn's Reply as events.

    It owns what one sampling tracks: whether the first chunk and the first
    output have come, the stop reason, where its output starts, and the
    upstream failure that ended it (raised by the loop once the output is in
    the context). The conversation is changed through its methods only.
    """

    __slots__ = (
        "_billed",
        "_first",
        "_first_flush",
        "_first_output",
        "_output_before",
        "_reply",
        "_started",
        "_taken",
        "conversation",
        "failed",
        "stop",
    )

    def __init__(self, conversation: Conversation, reply: Reply, taken: TurnInput) -> None:
        self.conversation = conversation
        self._reply = reply
        self._taken = taken
        self._first = self._first_flush = True
        self._started = 0.0
        self._first_output = len(reply.builder.output)
        self._output_before = reply.begin_output()
        #: The engine's (input, cached) counts billed so far, in place of the estimate.
        self._billed: tuple[int, int] | None = None
        self.stop = "stop"
        #: The engine failed mid-sampling: what it wrote stays, its open item cut.
        self.failed: UpstreamError | None = None

    async def run(self, request: SampleRequest) -> str:
        """Sample ``request`` to its stop; the stop reason (``failed`` says if the
        engine broke off). Whatever way it ends, the input is counted."""
        conversation, reply, taken = self.conversation, self._reply, self._taken
        timing, clock = taken.timing, conversation.clock
        self._started = started = clock()
        hosted_before = timing.hosted  # listings and approved calls, before sampling
        timing.before_sampling(taken.started, taken.resolved, taken.rendered, started)
        if taken.resumed_at is not None:
            timing.resume = started - taken.resumed_at
        keepalive = Keepalive.start(reply, conversation.limits.keepalive_interval)
        try:
            async with contextlib.aclosing(conversation.sampler.sample(request)) as chunks:
                async for chunk in chunks:
                    if not await self._take(chunk):
                        break
        except UpstreamError as exc:  # what the model wrote stays; the open item is cut
            await self._broken_off(exc)
        finally:  # no output at all, or cancelled
            if keepalive is not None:
                keepalive.stop()
            taken.held.settle(conversation)
        timing.inference = clock() - started - (timing.hosted - hosted_before)
        return self.stop

    def produced(self) -> list[Item]:
        """The model's output items of this sampling that join the context."""
        return kept(self._reply.builder.output[self._first_output :])

    async def _take(self, chunk: SampleChunk) -> bool:
        """Take one chunk from the model; False: the sampling stops here."""
        conversation, reply = self.conversation, self._reply
        if isinstance(chunk, Usage):  # a real engine's own counts so far
            self._bill(chunk)
            return True
        if self._first:
            self._taken.timing.time_to_first_token = conversation.clock() - self._started
            self._first = False
        if conversation.steer_now(reply, chunk):
            self.stop = "steered"
            return False
        chunk = self._within_limits(chunk)
        await self._feed(chunk)
        if self._first_flush:  # the writer's turn: the first output goes out now
            self._first_flush = False
            await asyncio.sleep(0)
            await self._taken.held.settle_stepwise(conversation)
        if self.stop == "max_events":
            return False
        if isinstance(chunk, ItemEnd) and conversation.steer_now(reply, None):
            self.stop = "steered"
            return False
        return True

    def _bill(self, counted: Usage) -> None:
        """The engine's own counts replace what is billed for the sampling so far:
        the estimate (its input counted first), or the engine's earlier counts.
        The latest stands however the sampling ends (cut short included)."""
        conversation, taken = self.conversation, self._taken
        taken.held.settle(conversation)
        billed = self._billed or (len(conversation.tokens), taken.cached)
        conversation.bill_upstream(counted, billed)
        self._billed = (counted.input_tokens, counted.cached_tokens)
        self._reply.count_output(self._output_before, counted.output_tokens)

    def _within_limits(self, chunk: SampleChunk) -> SampleChunk:
        """``chunk``, or the end of the open item when the Response has sent all the
        events it may (never with a call half written): then the stop is ``max_events``."""
        if isinstance(chunk, Stop):
            self.stop = chunk.reason
        elif (
            isinstance(chunk, TextDelta | ToolCallStart)
            and self._reply.sink.track(self._reply.id).next_sequence
            >= self.conversation.limits.max_events
        ):
            self.stop = "max_events"
            return ItemEnd(incomplete=True)  # close it, stop
        return chunk

    async def _feed(self, chunk: SampleChunk) -> None:
        """Feed ``chunk`` to the Reply's builder and push its events; a hosted call it
        completes runs now (the model samples again with its output)."""
        conversation, reply = self.conversation, self._reply
        hosted = conversation.hosted
        if isinstance(chunk, ToolCallStart) and hosted is not None:
            chunk = hosted.approval_kind(chunk, conversation.context)
        builder, sink, clock = reply.builder, reply.sink, conversation.clock
        await sink.room()
        pushing = clock()
        for event in builder.feed(chunk):  # no await: all of them, or none
            sink.push(event)
        self._taken.timing.encode += clock() - pushing
        if builder.hosted_call is not None:  # the server runs it now
            assert hosted is not None
            await hosted.run_written(reply, self._taken.timing)

    async def _broken_off(self, exc: UpstreamError) -> None:
        """The engine failed: its output so far stays, the open item is cut short,
        and a turn that produced nothing, and of which the engine counted
        nothing, takes its input estimate back."""
        conversation, reply, taken = self.conversation, self._reply, self._taken
        self.failed = exc
        log_upstream_failure(exc, model=conversation.model.name, response_id=reply.id)
        taken.held.settle(conversation)
        nothing = self._first and self._billed is None
        unbilled = (len(conversation.tokens), taken.cached) if nothing else None
        await conversation.cut_short(reply, unbilled)


def _chosen_freely(choice: ToolChoice) -> ToolChoice:
    """``choice`` once its forced call was made: ``allowed_tools`` keeps its tools
    (``auto``); a choice naming a tool, or ``required``, becomes ``auto``."""
    if isinstance(choice, ToolChoiceAllowed):
        return msgspec.structs.replace(choice, mode="auto")
    return choice if choice in ("auto", "none") else "auto"


class Keepalive:
    """While a turn samples: a ``keepalive`` event whenever the response has sent
    nothing for ``interval`` seconds (the model is silent: a long prefill, a slow
    engine), so clients' watchdogs and proxies see it alive.

    A timer callback, not a task: it runs only while the turn awaits, so never
    between a chunk's events (they are pushed with no await in between), and
    pushes at the response's next ``sequence_number``. It wakes every quarter
    interval, so a silence lasts at most 1.25 intervals.
    """

    __slots__ = ("_handle", "_interval", "_last", "_reply", "_seen")

    def __init__(self, reply: Reply, interval: float) -> None:
        self._reply = reply
        self._interval = interval
        loop = asyncio.get_running_loop()
        self._seen = reply.sink.track(reply.id).next_sequence
        self._last = loop.time()
        self._handle = loop.call_later(interval / 4, self._tick)

    @classmethod
    def start(cls, reply: Reply, interval: float) -> Keepalive | None:
        return cls(reply, interval) if interval > 0 else None

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        track = self._reply.sink.track(self._reply.id)
        now = loop.time()
        if track.next_sequence != self._seen:
            self._last = now
        elif now - self._last >= self._interval and not track.terminal:
            self._reply.sink.push(self._reply.builder.keepalive())
            self._last = now
        self._seen = track.next_sequence
        self._handle = loop.call_later(self._interval / 4, self._tick)

    def stop(self) -> None:
        self._handle.cancel()
