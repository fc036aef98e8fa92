"""Rollout: one whole agent rollout as ONE long-running Response.

A Rollout owns its config (model, tools, instructions, sampling params), its
context (append-only items), its rendered-token cache (append-only), its
sampler (reusable across pauses), its status, its pending tool calls and its
inbox. :meth:`Rollout.run` is its sampling loop, an asyncio task owned by the
Session:

1. pre-inference on the NEW items only (render + tokenize into the cache);
2. sample; stream output items out as events;
3. if the turn ended in client tool calls still unanswered: pause — send
   ``response.done`` with ``status: requires_action`` and await the inbox
   (with a pause timeout); when every pending call has its output, resume;
4. items that arrived while sampling (steering) are taken in at the boundary
   and sampling continues; with nothing new, the rollout completes.

The loop always ends with exactly one terminal ``response.done`` unless the
connection is gone (then there is nobody to tell).

The shipped shape drives the same Rollout one **segment** at a time
(:meth:`Rollout.run_segment`): each shipped Response is one run of the loop
between pauses, with its own id, its own events (``sequence_number`` from 0)
and only its own output. The context, the token cache and the sampler stay
with the Rollout between segments, so a continuation costs the new input only.
Each finished segment leaves a :class:`Boundary` to continue or fork from.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from protocol import ResponseState
from protocol.events import (
    ResponseCompleted,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ServerEvent,
    TimingEvent,
)
from protocol.items import FunctionCall, FunctionCallOutput, Item, as_items
from protocol.response import (
    IncompleteDetails,
    InputTokensDetails,
    OutputTokensDetails,
    RequiredAction,
    Response,
    ResponseError,
    Usage,
)

from ..config import Switches
from .admission import Pipeline
from .classifier import Finding
from .models import ModelSpec, Sampler, SampleRequest, Stop
from .render import TokenCache, render_item, render_prefix
from .stream import EventSink, StreamBuilder, StreamClosed

__all__ = ["Boundary", "ContextLengthExceeded", "Rollout", "TurnTiming"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class TurnTiming:
    """Server-side times of one sampling turn, in seconds."""

    turn: int
    #: From the decoded append that completed the outputs (or the create) to
    #: the sampler being called: validation, render, tokenize, resolution.
    resume: float = 0.0
    #: Decoding the client event that started this turn.
    decode: float = 0.0
    #: Pre-inference, all stages, and each stage: validation and
    #: classification (at admission), resolution, render + tokenize.
    pre_inference: float = 0.0
    validate: float = 0.0
    classify: float = 0.0
    resolve: float = 0.0
    render: float = 0.0
    time_to_first_token: float = 0.0
    inference: float = 0.0
    #: Encoding and queueing this turn's events for the transport.
    encode: float = 0.0
    #: Post-inference work done before the terminal event (the ledger and
    #: store writes when overlapped post-inference is off; else ~0).
    post_inference: float = 0.0
    new_tokens: int = 0
    cached_tokens: int = 0

    def as_metrics(self) -> dict[str, float]:
        return {
            "turn": self.turn,
            "resume_ms": self.resume * 1000,
            "decode_ms": self.decode * 1000,
            "pre_inference_ms": self.pre_inference * 1000,
            "validate_ms": self.validate * 1000,
            "classify_ms": self.classify * 1000,
            "resolve_ms": self.resolve * 1000,
            "render_ms": self.render * 1000,
            "time_to_first_token_ms": self.time_to_first_token * 1000,
            "inference_ms": self.inference * 1000,
            "encode_ms": self.encode * 1000,
            "post_inference_ms": self.post_inference * 1000,
            "new_tokens": self.new_tokens,
            "cached_tokens": self.cached_tokens,
        }

    #: The phases exported on /metrics and in Server-Timing.
    PHASES = (
        "decode",
        "validate",
        "classify",
        "resolve",
        "render",
        "pre_inference",
        "time_to_first_token",
        "inference",
        "encode",
        "post_inference",
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Boundary:
    """Where a shipped-shape segment ended: enough to continue or fork from it."""

    segment_id: str
    #: ``len(context)`` and ``len(tokens)`` at the end of the segment.
    items: int
    tokens: int
    #: Tokens of the items alone (after the prefix), and the prefix in effect
    #: then: a later segment may have swapped the prefix in place.
    item_tokens: int
    prefix: tuple[int, ...]
    #: Client tool calls of the segment still waiting for their outputs.
    pending: dict[str, str]
    #: The finished segment's Response object.
    response: Response
    #: The lane (``stream_id``) the segment ran on; ``None`` = the default lane.
    stream_id: str | None = None


class ContextLengthExceeded(Exception):
    """The context is longer than the model's window and truncation is off."""


class Rollout:
    """One long-running Response and its sampling loop."""

    def __init__(
        self,
        *,
        response_id: str,
        request: ResponseCreate,
        model: ModelSpec,
        sink: EventSink,
        pause_timeout: float,
        send_timing: bool = False,
        shipped: bool = False,
        pipeline: Pipeline | None = None,
        resolve: Callable[[str], ModelSpec] | None = None,
        input_items: list[Item] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.id = response_id
        self.pipeline = pipeline or Pipeline(Switches())
        #: Resolves a model name again every turn when resolution reuse is off.
        self._resolve = resolve
        #: Classifier findings of every input item taken in, in arrival order
        #: (kept so later turns need not read those items again).
        self.verdicts: list[tuple[Finding, ...]] = []
        #: What the classifier flagged, recorded on the response's metadata.
        self.flags: dict[str, str] = {}
        #: Post-inference work of a finished append-mode rollout (usage ledger),
        #: run before its terminal event is sent; the Session sets it.
        self.on_terminal: Callable[[Response], Awaitable[None]] | None = None
        #: Called with each finished turn's timing (the server's metrics).
        self.on_timing: Callable[[TurnTiming], None] | None = None
        #: Stage times measured at admission, for the next turn's timing.
        self._admission: tuple[float, float, float] = (0.0, 0.0, 0.0)
        #: The shipped shape: one Response per segment, no ``required_action``,
        #: per-segment usage. Otherwise append mode: one Response for everything.
        self.shipped = shipped
        self.request = request
        self.model = model
        self.sampler: Sampler = model.make_sampler()
        self.pause_timeout = pause_timeout
        self.send_timing = send_timing
        self._sink = sink
        self._clock = clock
        self.created_at = int(time.time())
        self.state = ResponseState.IN_PROGRESS
        self.context: list[Item] = []
        self.tokens = TokenCache(render_prefix(request.instructions, request.tools))
        #: What the token cache's prefix was rendered from (instructions, tools).
        self._prefix_key: tuple[str | None, bytes] = (
            request.instructions,
            self.pipeline.tools_key(request.tools),
        )
        self.stream = StreamBuilder(response_id, tag_response_id=True)
        self.pending_calls: dict[str, str] = {}  # call_id -> name, awaiting output
        self._inbox: list[Item] = (
            list(input_items) if input_items is not None else as_items(request.input)
        )
        self._wakeup = asyncio.Event()
        self._resume_mark: float | None = clock()
        self._cancel_requested = False
        self._started = False
        #: The task running :meth:`run`; set by its owner, the Session.
        self.task: asyncio.Task[None] | None = None
        self._incomplete_reason: str | None = None
        self._error: ResponseError | None = None
        self.input_tokens = 0
        self.cached_tokens = 0
        self._usage_base = (0, 0)
        #: Tokens the model has already processed (its reusable prefix): what
        #: the next turn counts as ``cached_tokens``. Nothing on the first turn.
        self.model_seen = 0
        self.timings: list[TurnTiming] = []
        self._timed = 0  # timings already sent
        self._stream_id: str | None = None
        self.boundaries: list[Boundary] = []
        self.truncated = False
        self._rendered_seen = 0  # token cache counters already added to the pipeline's
        self._items_seen = 0
        #: A segment is running (the shipped shape); a second one must fork.
        self.busy = False
        #: A segment failed half-way; the context may hold a partial turn.
        self.broken = False

    # --- called by the Session (already checked by the protocol core) ------

    def accept(self, items: list[Item], received_at: float) -> None:
        """Queue appended items; resume the loop if no call is pending any more."""
        for item in items:
            if isinstance(item, FunctionCallOutput):
                self.pending_calls.pop(item.call_id, None)
        self._inbox.extend(items)
        if not self.pending_calls:
            if self.state is ResponseState.REQUIRES_ACTION and self._resume_mark is None:
                self._resume_mark = received_at
            self._wakeup.set()

    def note_admission(
        self,
        verdicts: list[tuple[Finding, ...]],
        *,
        decode: float,
        validate: float,
        classify: float,
    ) -> None:
        """Keep an admission's verdicts and stage times (for the next turn).

        The response's flags cover its own input: every admission of an
        append-mode rollout, or this segment's alone in the shipped shape.
        """
        self.verdicts.extend(verdicts)
        self.flags = Pipeline.flagged(verdicts if self.shipped else self.verdicts)
        d, v, c = self._admission
        self._admission = (d + decode, v + validate, c + classify)

    @property
    def error(self) -> ResponseError | None:
        """Why the response failed, once it has."""
        return self._error

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
    def terminal(self) -> bool:
        return self.state in (
            ResponseState.COMPLETED,
            ResponseState.INCOMPLETE,
            ResponseState.FAILED,
            ResponseState.CANCELLED,
        )

    # --- the Response object ----------------------------------------------

    def snapshot(self) -> Response:
        req = self.request
        fields: dict[str, Any] = {}
        if self.state is ResponseState.REQUIRES_ACTION and not self.shipped:
            fields["required_action"] = RequiredAction(call_ids=list(self.pending_calls))
        return Response(
            id=self.id,
            created_at=self.created_at,
            status=self.state.value,
            completed_at=int(time.time()) if self.terminal else None,
            error=self._error,
            incomplete_details=(
                IncompleteDetails(reason=self._incomplete_reason)
                if self._incomplete_reason
                else None
            ),
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            max_tool_calls=req.max_tool_calls,
            model=self.model.name,
            output=list(self.stream.output),
            parallel_tool_calls=req.parallel_tool_calls,
            previous_response_id=req.previous_response_id,
            prompt_cache_key=req.prompt_cache_key,
            reasoning=req.reasoning,
            safety_identifier=req.safety_identifier,
            store=req.store,
            temperature=req.temperature if req.temperature is not None else 1.0,
            tool_choice=req.tool_choice,
            tools=list(req.tools),
            top_p=req.top_p if req.top_p is not None else 1.0,
            truncation=req.truncation or "disabled",
            usage=self.usage(),
            user=req.user,
            metadata={**req.metadata, **self.flags} if self.flags else dict(req.metadata),
            **fields,
        )

    def usage(self) -> Usage:
        """Usage of the Response: the whole rollout (append) or the segment (shipped)."""
        output = self.stream.output_tokens
        input_tokens = self.input_tokens - self._usage_base[0]
        cached = self.cached_tokens - self._usage_base[1]
        return Usage(
            input_tokens=input_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=cached),
            output_tokens=output,
            output_tokens_details=OutputTokensDetails(),
            total_tokens=input_tokens + output,
        )

    @property
    def nbytes(self) -> int:
        """Approximate memory held: tokens, plus the items (about as large again)."""
        return 2 * self.tokens.nbytes + 64 * len(self.context)

    # --- the shipped shape: one segment at a time ---------------------------

    def fork(self, boundary: Boundary) -> Rollout:
        """A new Rollout holding this one's context up to ``boundary`` (shared prefix)."""
        child = Rollout(
            response_id=boundary.segment_id,
            request=self.request,
            model=self.model,
            sink=self._sink,
            pause_timeout=self.pause_timeout,
            send_timing=self.send_timing,
            shipped=self.shipped,
            pipeline=self.pipeline,
            resolve=self._resolve,
            clock=self._clock,
        )
        child._inbox = []
        child.context = self.context[: boundary.items]
        child.tokens = self.tokens.fork_items(boundary.prefix, boundary.item_tokens)
        child._prefix_key = (None, b"")  # unknown: the next segment compares the tokens
        child.pending_calls = dict(boundary.pending)
        index = self.boundaries.index(boundary)
        child.boundaries = self.boundaries[: index + 1]
        child.input_tokens, child.cached_tokens = self.input_tokens, self.cached_tokens
        # A model server's prefix cache is shared by every request, so the
        # fork's prefix counts as processed, unless the prefix changed since.
        same_prefix = self.tokens.tokens[: self.tokens.prefix_length].tolist() == list(
            boundary.prefix
        )
        child.model_seen = min(self.model_seen, boundary.tokens) if same_prefix else 0
        return child

    async def run_segment(
        self,
        *,
        segment_id: str,
        request: ResponseCreate,
        model: ModelSpec,
        new_items: list[Item],
        sink: EventSink,
        stream_id: str | None,
        received_at: float,
        on_finish: Callable[[Response], Awaitable[None]] | None = None,
    ) -> Boundary | None:
        """Run one shipped-shape Response over ``new_items``; return its boundary.

        Emits ``response.created``, ``response.in_progress``, the output items
        and one terminal event. With ``generate: false`` the input is taken in
        (rendered, cached) without sampling. Returns ``None`` if the segment
        failed (``response.failed`` was sent; the Rollout is then ``broken``).
        ``on_finish`` gets the finished Response before its terminal event is
        sent (persistence registers it there, so it is readable by the time a
        client can name it).
        """
        self.busy = True
        try:
            self._sink = sink
            self.request = request
            if model is not self.model:
                # Another model: nothing it could reuse, but the tokens are
                # the same (one tokenizer for every model here).
                self.model, self.sampler = model, model.make_sampler()
                self.model_seen = 0
            # Clients resend instructions and tools every turn: compare their
            # encoding first, and render the prefix only when it changed.
            key = (request.instructions, self.pipeline.tools_key(request.tools))
            prefix_changed = False
            if key != self._prefix_key:
                prefix = render_prefix(request.instructions, request.tools)
                prefix_changed = self.tokens.tokens[: self.tokens.prefix_length].tolist() != prefix
                self._prefix_key = key
            if prefix_changed:
                # Instructions or tools changed: the prefix is re-rendered and
                # the items' tokens reused; nothing before them is a valid
                # cache prefix for the model any more.
                self.tokens = self.tokens.rebase(prefix)
                self.model_seen = 0
            self.id = segment_id
            self._stream_id = stream_id
            self.created_at = int(time.time())
            self.stream = StreamBuilder(segment_id, tag_response_id=False, stream_id=stream_id)
            self.state = ResponseState.IN_PROGRESS
            self._error, self._incomplete_reason = None, None
            self._usage_base = (self.input_tokens, self.cached_tokens)
            for item in new_items:
                if isinstance(item, FunctionCallOutput):
                    self.pending_calls.pop(item.call_id, None)
            self._inbox = list(new_items)
            self._resume_mark = received_at
            await self._announce(ResponseCreated)
            await self._announce(ResponseInProgress)
            stop = "stop"
            if request.generate is False:
                self._take_in_without_sampling(prefix_changed)
            else:
                stop = await self._turn(prefix_changed=prefix_changed)
            terminal: Callable[..., ServerEvent] = ResponseCompleted
            state = ResponseState.COMPLETED
            if stop == "max_output_tokens":
                self._incomplete_reason = "max_output_tokens"
                terminal, state = ResponseIncomplete, ResponseState.INCOMPLETE
            await self._sink.room()
            self.state = state
            response = self.snapshot()
            if on_finish is not None:
                finishing = self._clock()
                await on_finish(response)
                if self.timings:
                    self.timings[-1].post_inference += self._clock() - finishing
                await self._sink.room()
            boundary = Boundary(
                segment_id=segment_id,
                items=len(self.context),
                tokens=len(self.tokens),
                item_tokens=len(self.tokens) - self.tokens.prefix_length,
                prefix=tuple(self.tokens.tokens[: self.tokens.prefix_length]),
                pending=dict(self.pending_calls),
                response=response,
                stream_id=stream_id,
            )
            self.boundaries.append(boundary)
            self._sink.push(self.stream.lifecycle(terminal, response))
            await self._send_timing()
            return boundary
        except (asyncio.CancelledError, StreamClosed):
            self.broken = True
            raise
        except Exception as exc:
            self.broken = True
            self._error = _failure(exc, segment_id)
            with contextlib.suppress(Exception):
                await self._announce(ResponseFailed, ResponseState.FAILED)
            self.state = ResponseState.FAILED
            return None
        finally:
            self.busy = False

    def _take_in_without_sampling(self, prefix_changed: bool) -> None:
        new_items, self._inbox = self._inbox, []
        self.context.extend(new_items)
        # Rendered and tokenized now; the model has not processed them yet.
        cached = 0 if prefix_changed else min(self.model_seen, len(self.tokens))
        self.tokens.extend(new_items)
        self.input_tokens += len(self.tokens)
        self.cached_tokens += cached

    # --- the loop ----------------------------------------------------------

    async def run(self) -> None:
        """The sampling loop. Cancelled from outside only when the connection is gone."""
        self._started = True
        try:
            if self._cancel_requested:
                await self._finish(ResponseState.CANCELLED)
                return
            if self.stream.sequence == 0:
                await self._announce(ResponseCreated)
            await self._announce(ResponseInProgress)
            while True:
                stop = await self._turn()
                if stop == "max_output_tokens":
                    self._incomplete_reason = "max_output_tokens"
                    await self._finish(ResponseState.INCOMPLETE)
                    return
                if self.pending_calls:
                    if not await self._pause():
                        return
                if not self._inbox:
                    await self._finish(ResponseState.COMPLETED)
                    return
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._cancel_requested and task is not None and task.uncancel() == 0:
                # Our own client asked (response.cancel): report it.
                await self._finish(ResponseState.CANCELLED)
                return
            self.state = ResponseState.CANCELLED  # the connection is gone
            raise
        except StreamClosed:
            self.state = ResponseState.CANCELLED  # nobody is left to tell
            raise
        except Exception as exc:
            self._error = _failure(exc, self.id)
            with contextlib.suppress(Exception):
                await self._finish(ResponseState.FAILED)

    async def _turn(self, *, prefix_changed: bool = False) -> str:
        """One run of the model over the context plus whatever is in the inbox.

        With ``prefix_changed`` nothing counts as cached: the model must
        prefill the whole context again (the tokenizer work is still reused).
        """
        timing = TurnTiming(turn=len(self.timings) + 1)
        timing.decode, timing.validate, timing.classify = self._admission
        self._admission = (0.0, 0.0, 0.0)
        started = self._clock()
        pipeline = self.pipeline
        if not pipeline.switches.resolution_reuse and self._resolve is not None:
            model = self._resolve(self.model.name)  # the work a stateless server repeats
            if model is not self.model:  # pragma: no cover - the registry is stable
                self.model, self.sampler = model, model.make_sampler()
        resolved = self._clock()
        new_items, self._inbox = self._inbox, []
        self.context.extend(new_items)
        cached = 0 if prefix_changed else min(self.model_seen, len(self.tokens))
        if pipeline.switches.token_cache:
            added = self.tokens.extend(new_items)
        else:
            # No token cache: render and tokenize the whole context again.
            before = len(self.tokens)
            prefix = render_prefix(self.request.instructions, self.request.tools)
            self.tokens = self.tokens.rerendered(prefix, self.context)
            added = len(self.tokens) - before
        pipeline.counters.tokens_rendered += self.tokens.tokens_rendered - self._rendered_seen
        pipeline.counters.items_rendered += self.tokens.items_rendered - self._items_seen
        self._rendered_seen = self.tokens.tokens_rendered
        self._items_seen = self.tokens.items_rendered
        rendered = self._clock()
        self._check_context_window()
        uncached = len(self.tokens) - cached
        self.input_tokens += cached + uncached
        self.cached_tokens += cached
        timing.new_tokens, timing.cached_tokens = added, cached
        request = self.request
        sample_request = SampleRequest(
            context=self.context,
            tools=request.tools,
            tool_choice=request.tool_choice,
            parallel_tool_calls=request.parallel_tool_calls,
            metadata=request.metadata,
            cached_tokens=cached,
            uncached_tokens=uncached,
            max_output_tokens=request.max_output_tokens,
        )
        sampling_started = self._clock()
        timing.resolve = resolved - started
        timing.render = rendered - resolved
        timing.pre_inference = (
            sampling_started - started + timing.decode + timing.validate + timing.classify
        )
        if self._resume_mark is not None:
            timing.resume = sampling_started - self._resume_mark
            self._resume_mark = None
        first = True
        stop = "stop"
        first_output = len(self.stream.output)
        async for chunk in self.sampler.sample(sample_request):
            if first:
                timing.time_to_first_token = self._clock() - sampling_started
                first = False
            if isinstance(chunk, Stop):
                stop = chunk.reason
            await self._sink.room()
            pushing = self._clock()
            for event in self.stream.feed(chunk):  # no await: all of them, or none
                self._sink.push(event)
            timing.encode += self._clock() - pushing
        timing.inference = self._clock() - sampling_started
        produced = self.stream.output[first_output:]
        for item in produced:
            if isinstance(item, FunctionCall) and not self._answered(item.call_id):
                self.pending_calls[item.call_id] = item.name
        # The model's own output joins the context and the token cache; it is
        # not new input next turn (a real model already holds it).
        self.context.extend(produced)
        self.tokens.extend(produced)
        self._rendered_seen = self.tokens.tokens_rendered
        self._items_seen = self.tokens.items_rendered
        self.model_seen = len(self.tokens)
        self.timings.append(timing)
        return stop

    def _check_context_window(self) -> None:
        """History + new tokens against the model's window (shipped ``truncation`` rules).

        ``truncation: "auto"`` drops the oldest items until the context fits
        (the rest is rendered again; the model has to prefill it all);
        otherwise :class:`ContextLengthExceeded` ends the response ``failed``.
        """
        window = self.model.context_window
        if len(self.tokens) <= window:
            return
        if self.request.truncation != "auto":
            raise ContextLengthExceeded(
                f"Your input is {len(self.tokens)} tokens; the context window of "
                f"{self.model.name} is {window}."
            )
        prefix = render_prefix(self.request.instructions, self.request.tools)
        # Each item's length once, then drop from the front until the rest fits.
        lengths = [len(render_item(item)) for item in self.context]
        total = len(prefix) + sum(lengths)
        dropped = 0
        while dropped < len(lengths) and total > window:
            total -= lengths[dropped]
            dropped += 1
        del self.context[:dropped]
        self.tokens = self.tokens.rerendered(prefix, self.context)
        self.model_seen = 0
        self.truncated = True

    def _answered(self, call_id: str) -> bool:
        return any(
            isinstance(item, FunctionCallOutput) and item.call_id == call_id for item in self._inbox
        )

    async def _pause(self) -> bool:
        """Block until every pending call has its output. False if the rollout ended."""
        self._wakeup.clear()
        await self._announce(ResponseDone, ResponseState.REQUIRES_ACTION)
        await self._send_timing()
        try:
            async with asyncio.timeout(self.pause_timeout):
                while self.pending_calls:
                    await self._wakeup.wait()
                    self._wakeup.clear()
        except TimeoutError:
            self._incomplete_reason = "pause_timeout"
            await self._finish(ResponseState.INCOMPLETE)
            return False
        await self._announce(ResponseInProgress, ResponseState.IN_PROGRESS)
        return True

    async def _finish(self, state: ResponseState) -> None:
        await self._sink.room()
        self.state = state
        response = self.snapshot()
        if self.on_terminal is not None:
            started = self._clock()
            await self.on_terminal(response)
            if self.timings:
                self.timings[-1].post_inference += self._clock() - started
            await self._sink.room()
        self._sink.push(self.stream.lifecycle(ResponseDone, response))
        await self._send_timing()

    def announce_created(self) -> None:
        """Send ``response.created`` now, without waiting (at admission).

        The protocol core learns the response exists in the order of the
        client's messages, so an append or cancel without ``response_id``
        that follows this create targets this rollout.
        """
        self._sink.push(self.stream.lifecycle(ResponseCreated, self.snapshot()))

    async def _announce(
        self, cls: Callable[..., ServerEvent], state: ResponseState | None = None
    ) -> None:
        """Wait for room, then change state and send a lifecycle event (no gap between)."""
        await self._sink.room()
        if state is not None:
            self.state = state
        self._sink.push(self.stream.lifecycle(cls, self.snapshot()))

    async def _send_timing(self) -> None:
        """Report the finished turn: to the metrics, and as an event if asked for."""
        if not self.timings or self._timed >= len(self.timings):
            return
        self._timed = len(self.timings)
        if self.on_timing is not None:
            self.on_timing(self.timings[-1])
        if self.send_timing:
            await self._sink.room()
            self._sink.push(
                TimingEvent(
                    timing_metrics=self.timings[-1].as_metrics(),
                    response_id=self.id,
                    stream_id=self._stream_id if self._stream_id is not None else msgspec.UNSET,
                )
            )


def _failure(exc: Exception, response_id: str) -> ResponseError:
    """The ``error`` of a response that failed while running."""
    if isinstance(exc, ContextLengthExceeded):
        return ResponseError(code="context_length_exceeded", message=str(exc))
    log.exception("response %s failed", response_id, exc_info=exc)
    return ResponseError(code="server_error", message="The model failed.")
