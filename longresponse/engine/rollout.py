"""Rollout: one whole agent rollout, its conversation and its sampling loop.

Theory of operation
-------------------
A Rollout owns the conversation: its config in effect (model, tools,
instructions, sampling params), its context (append-only items), its
rendered-token cache (append-only), its sampler (reusable across pauses), its
inbox, and the counts of tokens processed. It writes to one
:class:`~longresponse.engine.reply.Reply` at a time, the Response the client
is reading; the Reply's state lives in the protocol core.

:meth:`Rollout.turn` is the one place a model turn happens: pre-inference on
the NEW items only (render + tokenize into the cache, or, far from the window,
after the first output: ``longresponse.engine.counting``), sampling, and the
output streamed out as events. Two drivers run turns:

- :meth:`Rollout.run`, the append-mode loop (an asyncio task owned by the
  session) around :meth:`Rollout.settle`: turn; if the model ended in client
  tool calls still unanswered, pause — send ``response.done`` with ``status:
  requires_action`` and await the inbox (with a pause timeout) — and when
  every pending call has its output, take the inbox in and turn again; with
  nothing new, complete. It always ends with exactly one terminal
  ``response.done`` unless the connection is gone (nobody is left to tell).
- :class:`~longresponse.engine.segment.Segment`, the shipped shape: one turn
  under a Reply of its own, ending at the first pause (or, multi-agent,
  ``settle`` under it: the Reply waits in place without a word).

Invariant: ``tokens(history + new) == tokens(history) + tokens(render(new))``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from protocol import ResponseState
from protocol.events import (
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseInProgress,
)
from protocol.items import Item, as_items
from protocol.response import Response, ResponseError

from ..config import MAX_RESPONSE_EVENTS, MAX_RESPONSE_OUTPUT_TOKENS, Switches
from . import counting
from . import sampling as models
from .admission import Pipeline
from .classifier import Verdict
from .compaction import Compactor, Intake, compact_rollout, compact_threshold, intake, start_window
from .failures import UpstreamError, cut_short, failure, fit_window, kept, upstream_error_event
from .render import TokenCache, render_prefix
from .reply import Reply, TokenCounts
from .sampling import ItemEnd, ModelSpec, Sampler, SampleRequest, Stop, TextDelta, ToolCallStart
from .stream import EventSink, StreamClosed
from .timing import TurnTiming

if TYPE_CHECKING:
    from .segment import Boundary

__all__ = ["INCOMPLETE_STOPS", "Rollout"]

log = logging.getLogger(__name__)

#: What one Boundary holds beside its prefix, about (its Response object and
#: pending calls; measured on the simulated model's short answers).
_BOUNDARY_BYTES: Final = 4096
#: How :meth:`Rollout.settle` may stop short: the Response ends ``incomplete``.
INCOMPLETE_STOPS: Final = frozenset({"max_output_tokens", "max_events", "pause_timeout"})


class Rollout:
    """One conversation and its sampling loop; it writes to one Reply at a time."""

    def __init__(
        self,
        *,
        request: ResponseCreate,
        model: ModelSpec,
        pause_timeout: float,
        pipeline: Pipeline | None = None,
        resolve: Callable[[str], ModelSpec] | None = None,
        input_items: list[Item] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        max_events: int = MAX_RESPONSE_EVENTS,
        max_output_tokens: int = MAX_RESPONSE_OUTPUT_TOKENS,
    ) -> None:
        self.pipeline = pipeline or Pipeline(Switches())
        #: Resolves a model name again every turn when resolution reuse is off.
        self.resolve_model = resolve
        #: The config in effect: the create's, or the latest segment's.
        self.request = request
        self.model = model
        self.sampler: Sampler = model.make_sampler()
        self.pause_timeout = pause_timeout
        self.clock = clock
        #: Per-Response caps (the server's): events sent, output tokens written.
        self.max_events = max_events
        self.max_output_tokens = max_output_tokens
        #: The Response being written now (set by :meth:`open_reply`).
        self.reply: Reply | None = None
        #: Classifier findings of every input item taken in, in arrival order
        #: (kept so later turns need not read those items again).
        self.verdicts: list[Verdict] = []
        #: Post-inference work of a finished append-mode rollout (usage ledger),
        #: run before its terminal event is sent; the serve layer sets it.
        self.on_terminal: Callable[[Response], Awaitable[None]] | None = None
        #: Called with each finished turn's timing (the server's metrics).
        self.on_timing: Callable[[TurnTiming], None] | None = None
        #: Stage times measured at admission, for the next turn's timing.
        self._admission: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self.context: list[Item] = []
        self.tokens = TokenCache(render_prefix(request.instructions, request.tools))
        #: What the token cache's prefix was rendered from (instructions, tools).
        self._prefix_key: tuple[str | None, bytes] = (
            request.instructions,
            self.pipeline.tools_key(request.tools),
        )
        self._inbox: list[Item] = (
            list(input_items) if input_items is not None else as_items(request.input)
        )
        self._wakeup = asyncio.Event()
        self._resume_mark: float | None = clock()
        self._cancel_requested = False
        self._started = False
        #: The task running :meth:`run`; set by its owner, the session.
        self.task: asyncio.Task[None] | None = None
        #: Input tokens processed so far, and of those the cached (shared with
        #: the Replies, which report usage from them).
        self.counts = TokenCounts()
        #: The append-mode Response is ending (post-inference under way): a
        #: cancel comes too late, and it no longer counts as live.
        self._finishing = False
        #: Tokens the model has already processed (its reusable prefix): what
        #: the next turn counts as ``cached_tokens``. Nothing on the first turn.
        self.model_seen = 0
        self.timings: list[TurnTiming] = []
        self._timed = 0  # timings already reported
        #: Where each finished shipped-shape segment ended (to continue or fork).
        self.boundaries: list[Boundary] = []
        self.truncated = False
        self.rendered_seen = 0  # token cache counters already added to the pipeline's
        self.items_seen = 0
        #: A segment is running (the shipped shape); a second one must fork.
        self.busy = False
        #: A segment failed half-way; the context may hold a partial turn.
        self.broken = False
        #: Seals and opens compaction items for the rollout's owner (serve layer).
        self.compactor: Compactor | None = None
        self._waiting = False  # paused: awaiting the outputs of client calls
        #: This turn's new input: where it starts in the token cache, and whether it
        #: waits there uncounted (``longresponse.engine.counting``).
        self.input_from, self.uncounted = 0, False

    def open_reply(
        self,
        response_id: str,
        sink: EventSink,
        *,
        append: bool,
        stream_id: str | None = None,
        send_timing: bool = False,
    ) -> Reply:
        """Start writing a new Response; the rollout's counts so far are not its usage."""
        self.reply = Reply(
            response_id,
            self.request,
            model=self.model.name,
            sink=sink,
            counts=self.counts,
            append=append,
            stream_id=stream_id,
            send_timing=send_timing,
        )
        return self.reply

    def _current(self) -> Reply:
        if self.reply is None:  # pragma: no cover - a serve-layer bug
            raise RuntimeError("the rollout has no Reply to write to")
        return self.reply

    # --- called by the serve layer (already checked by the protocol core) ----

    def accept(self, items: list[Item], received_at: float) -> None:
        """Queue appended items; resume the loop if no call is pending any more."""
        self._inbox.extend(items)
        if not self._current().pending_calls:
            paused = self._waiting or self.state is ResponseState.REQUIRES_ACTION
            if paused and self._resume_mark is None:
                self._resume_mark = received_at
            self._wakeup.set()

    def note_admission(
        self, verdicts: list[Verdict], *, decode: float, validate: float, classify: float
    ) -> None:
        """Keep an admission's verdicts and stage times (for the next turn).

        The Response's flags cover its own input: every admission of an
        append-mode rollout, or this segment's alone in the shipped shape.
        """
        self.verdicts.extend(verdicts)
        reply = self._current()
        reply.verdicts.extend(verdicts)
        reply.flags = Pipeline.flagged(reply.verdicts)
        d, v, c = self._admission
        self._admission = (d + decode, v + validate, c + classify)

    def history(self) -> list[Item]:
        """Everything taken in so far: the context and what waits in the inbox."""
        return [*self.context, *self._inbox]

    def request_cancel(self) -> None:
        """End the rollout ``cancelled`` now, wherever its loop is waiting."""
        if self.terminal or self._cancel_requested:
            return
        self._cancel_requested = True
        # A task cancelled before its first step never runs a line of run();
        # one that has not started yet sees the flag there instead.
        if self.task is not None and self._started:
            self.task.cancel()

    @property
    def state(self) -> ResponseState:
        return self._current().state

    @property
    def terminal(self) -> bool:
        """Ended, or ending (its terminal event is on its way)."""
        return self._finishing or self._current().terminal

    @property
    def awaiting_input(self) -> bool:
        """Paused, waiting for client tool outputs or an append: no turn is running."""
        return self._waiting

    @property
    def reply_terminal(self) -> bool:
        """The current Response's terminal event has gone out."""
        return self._current().terminal

    @property
    def error(self) -> ResponseError | None:
        """Why the current Response failed, once it has."""
        return self._current().error

    def snapshot(self) -> Response:
        return self._current().snapshot()

    @property
    def nbytes(self) -> int:
        """Approximate memory held: tokens, the items (about as large again), and
        the boundaries (their prefixes, each distinct one once, and their Responses)."""
        prefixes = {id(b.prefix): len(b.prefix) * b.prefix.itemsize for b in self.boundaries}
        return (
            2 * self.tokens.nbytes
            + 64 * len(self.context)
            + sum(prefixes.values())
            + _BOUNDARY_BYTES * len(self.boundaries)
        )

    # --- config --------------------------------------------------------------

    def configure(self, request: ResponseCreate, model: ModelSpec) -> bool:
        """Take a new request's config (a shipped-shape continuation); True if the
        token prefix changed, so nothing the model processed is a cache prefix."""
        self.request = request
        if model is not self.model:
            # Another model: nothing it could reuse, but the tokens are the
            # same (one tokenizer for every model here).
            self.model, self.sampler = model, model.make_sampler()
            self.model_seen = 0
        # Clients resend instructions and tools every turn: compare their
        # encoding first, and render the prefix only when it changed.
        key = (request.instructions, self.pipeline.tools_key(request.tools))
        if key == self._prefix_key:
            return False
        self._prefix_key = key
        prefix = render_prefix(request.instructions, request.tools)
        if self.tokens.tokens[: self.tokens.prefix_length].tolist() == prefix:
            return False
        # The prefix is re-rendered and the items' tokens reused.
        self.tokens = self.tokens.rebase(prefix)
        self.model_seen = 0
        return True

    def take_in(self, items: list[Item], received_at: float) -> None:
        """The next Response's new input (a segment's), to be taken in by its turn."""
        self._inbox = list(items)
        self._resume_mark = received_at

    # --- the loop ------------------------------------------------------------

    async def run(self) -> None:
        """The append-mode loop. Cancelled from outside only when the connection is gone."""
        self._started = True
        reply = self._current()
        try:
            if self._cancel_requested:
                await self.finish(ResponseState.CANCELLED)
                return
            if reply.track is None:
                await reply.announce(ResponseCreated)
            await reply.announce(ResponseInProgress)
            stop = await self.settle()
            reply.incomplete_reason = stop if stop in INCOMPLETE_STOPS else None
            await self.finish(
                ResponseState.INCOMPLETE if reply.incomplete_reason else ResponseState.COMPLETED
            )
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._cancel_requested and task is not None and task.uncancel() == 0:
                # Our own client asked (response.cancel): report it.
                await self.finish(ResponseState.CANCELLED)
                return
            reply.abandon()  # the connection is gone
            raise
        except StreamClosed:
            reply.abandon()  # nobody is left to tell
            raise
        except Exception as exc:
            reply.error = failure(exc, reply.id)
            with contextlib.suppress(Exception):
                await self.finish(ResponseState.FAILED)

    async def settle(self, *, prefix_changed: bool = False) -> str:
        """Turns, pausing in place for client tool outputs, until the model stops
        with nothing pending: the last stop reason, or ``pause_timeout``."""
        reply = self._current()
        while True:
            try:
                stop = await self.turn(prefix_changed=prefix_changed)
            except UpstreamError as exc:
                if not reply.append or not exc.transient:  # a refusal, or the shipped shape
                    raise
                if not await self._pause(exc):  # append mode waits for any append (SPEC §16)
                    return "pause_timeout"
                continue
            prefix_changed = False
            if stop in ("max_output_tokens", "max_events"):
                return stop
            if reply.pending_calls and not await self._pause():
                return "pause_timeout"
            if not self._inbox:
                return stop

    async def turn(self, *, prefix_changed: bool = False) -> str:
        """One run of the model over the context plus whatever is in the inbox.

        Its events go to the current Reply. With ``prefix_changed`` nothing
        counts as cached: the model must prefill the whole context again (the
        tokenizer work is still reused). Returns the sampler's stop reason.
        """
        reply = self._current()
        timing = TurnTiming(turn=len(self.timings) + 1)
        timing.decode, timing.validate, timing.classify = self._admission
        self._admission = (0.0, 0.0, 0.0)
        started = self.clock()
        pipeline = self.pipeline
        if not pipeline.switches.resolution_reuse and self.resolve_model is not None:
            model = self.resolve_model(self.model.name)  # the work a stateless server repeats
            if model is not self.model:  # pragma: no cover - the registry is stable
                self.model, self.sampler = model, model.make_sampler()
        resolved = self.clock()
        taken = self._take_inbox()
        self.context.extend(taken.items)
        cached = 0 if prefix_changed else min(self.model_seen, len(self.tokens))
        request = self.request
        threshold = compact_threshold(request, self.model.context_window)
        bound = counting.hold_input(self, taken.items, trigger=taken.trigger, threshold=threshold)
        if self.uncounted:  # counted after the first output (it cannot reach the window)
            rendered = self.clock()
            uncached = bound - cached
        else:  # tokenizing first: queued events go out before it (untimed)
            waited = self.clock()
            await asyncio.sleep(0)
            waited = self.clock() - waited
            started, resolved = started + waited, resolved + waited
            added = counting.tokenize_input(self)
            rendered = self.clock()
            counting.note_rendering(self)
            if taken.trigger or (threshold is not None and len(self.tokens) > threshold):
                await compact_rollout(self, reply, cached)
                cached = 0  # the model reads the new window afresh
                if taken.trigger:  # a compaction turn: the compaction item is its output
                    self.timings.append(timing)
                    return "stop"
            if fit_window(self):
                cached = 0
            uncached = counting.count_input(self, timing, cached, added)
        sample_request = SampleRequest.for_turn(
            request,
            self.context,
            cached_tokens=cached,
            uncached_tokens=uncached,
            cap=self.max_output_tokens,
            spent=reply.builder.output_tokens,
        )
        sampling_started = self.clock()
        timing.before_sampling(started, resolved, rendered, sampling_started)
        if self._resume_mark is not None:
            timing.resume = sampling_started - self._resume_mark
            self._resume_mark = None
        first = first_flush = True
        stop = "stop"
        builder, sink = reply.builder, reply.sink
        first_output = len(builder.output)
        output_before = builder.output_tokens
        failed: UpstreamError | None = None
        try:
            async with contextlib.aclosing(self.sampler.sample(sample_request)) as chunks:
                async for chunk in chunks:
                    if first:
                        timing.time_to_first_token = self.clock() - sampling_started
                        first = False
                    if isinstance(chunk, models.Usage):  # a real engine's own counts
                        counting.settle_count(self, timing, cached)
                        spent = builder.output_tokens - output_before
                        reply.bill_upstream(chunk, (len(self.tokens), cached, spent))
                        continue
                    if isinstance(chunk, Stop):
                        stop = chunk.reason
                    elif (
                        isinstance(chunk, TextDelta | ToolCallStart)
                        and sink.track(reply.id).next_sequence >= self.max_events
                    ):  # never with a call half written
                        stop, chunk = "max_events", ItemEnd(incomplete=True)  # close it, stop
                    await sink.room()
                    pushing = self.clock()
                    for event in builder.feed(chunk):  # no await: all of them, or none
                        sink.push(event)
                    timing.encode += self.clock() - pushing
                    if first_flush:  # the writer's turn: the first output goes out now
                        first_flush = False
                        await asyncio.sleep(0)
                        counting.settle_count(self, timing, cached)
                    if stop == "max_events":
                        break
        except UpstreamError as exc:  # what the model wrote stays; the open item is cut
            failed = exc
            counting.settle_count(self, timing, cached)
            await cut_short(self, reply, None if not first else (len(self.tokens), cached))
        finally:  # no output at all, or cancelled
            counting.settle_count(self, timing, cached)
        timing.inference = self.clock() - sampling_started
        produced = kept(builder.output[first_output:])
        # The model's own output joins the context and the token cache; it is
        # not new input next turn (a real model already holds it).
        self.context.extend(produced)
        self.tokens.extend(produced)
        self.rendered_seen = self.tokens.tokens_rendered
        self.items_seen = self.tokens.items_rendered
        self.model_seen = len(self.tokens)
        self.timings.append(timing)
        if failed is not None:
            raise failed
        return stop

    def _take_inbox(self) -> Intake:
        """The inbox as it joins the context; a compaction item in it replaces the context."""
        taken, self._inbox = intake(self._inbox, self.compactor), []
        if taken.replaces:
            start_window(self)
        return taken

    async def _pause(self, failed: UpstreamError | None = None) -> bool:
        """Block until every pending call has its output (after an upstream failure with
        none pending, until an append comes, or not at all if one came meanwhile).
        False if the pause timed out."""
        reply = self._current()
        self._wakeup.clear()
        if failed is not None:
            await reply.sink.room()
            reply.push(upstream_error_event(failed, reply.id))
        if await reply.pause():
            await self.report_timing()
        self._waiting = True
        try:
            async with asyncio.timeout(self.pause_timeout):
                if failed is not None and not reply.pending_calls and not self._inbox:
                    await self._wakeup.wait()
                while reply.pending_calls:
                    await self._wakeup.wait()
                    self._wakeup.clear()
        except TimeoutError:
            return False
        finally:
            self._waiting = False
        await reply.resume()
        await asyncio.sleep(0)  # the writer's turn: when many resume at once, each
        return True  # rollout's response.in_progress leaves before any turn runs

    async def finish(self, state: ResponseState) -> None:
        """End the append-mode Response with ``state``: post-inference, then ``response.done``."""
        reply = self._current()
        self._finishing = True
        await reply.sink.room()
        response = reply.snapshot(state)
        if self.on_terminal is not None:
            started = self.clock()
            await self.on_terminal(response)
            if self.timings:
                self.timings[-1].post_inference += self.clock() - started
            await reply.sink.room()
        reply.push(reply.builder.lifecycle(ResponseDone, response))
        await self.report_timing()

    async def report_timing(self) -> None:
        """Report the finished turn: to the metrics, and as an event if asked for."""
        if not self.timings or self._timed >= len(self.timings):
            return
        self._timed = len(self.timings)
        if self.on_timing is not None:
            self.on_timing(self.timings[-1])
        await self._current().send_timing(self.timings[-1].as_metrics())
