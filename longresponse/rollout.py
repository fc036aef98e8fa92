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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from protocol import (
    FunctionCall,
    FunctionCallOutput,
    IncompleteDetails,
    InputTokensDetails,
    Item,
    Message,
    OutputTokensDetails,
    RequiredAction,
    Response,
    ResponseCreate,
    ResponseDone,
    ResponseError,
    ResponseInProgress,
    ResponseState,
    ServerEvent,
    TimingEvent,
    Usage,
)
from protocol.events import ResponseCreated

from .render import TokenCache, render_prefix
from .sampler import ModelSpec, Sampler, SampleRequest, Stop
from .stream import StreamBuilder, StreamClosed

__all__ = ["Rollout", "TurnTiming"]

log = logging.getLogger(__name__)

Emit = Callable[[ServerEvent], Awaitable[None]]


@dataclasses.dataclass(slots=True)
class TurnTiming:
    """Server-side times of one sampling turn, in seconds."""

    turn: int
    #: From the decoded append that completed the outputs (or the create) to
    #: the sampler being called: validation, render, tokenize, resolution.
    resume: float = 0.0
    pre_inference: float = 0.0
    time_to_first_token: float = 0.0
    inference: float = 0.0
    new_tokens: int = 0
    cached_tokens: int = 0

    def as_metrics(self) -> dict[str, float]:
        return {
            "turn": self.turn,
            "resume_ms": self.resume * 1000,
            "pre_inference_ms": self.pre_inference * 1000,
            "time_to_first_token_ms": self.time_to_first_token * 1000,
            "inference_ms": self.inference * 1000,
            "new_tokens": self.new_tokens,
            "cached_tokens": self.cached_tokens,
        }


def _input_items(value: str | list[Item]) -> list[Item]:
    if isinstance(value, str):
        return [Message(role="user", content=value)]
    return list(value)


class Rollout:
    """One long-running Response and its sampling loop."""

    def __init__(
        self,
        *,
        response_id: str,
        request: ResponseCreate,
        model: ModelSpec,
        emit: Emit,
        pause_timeout: float,
        send_timing: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.id = response_id
        self.request = request
        self.model = model
        self.sampler: Sampler = model.make_sampler()
        self.pause_timeout = pause_timeout
        self.send_timing = send_timing
        self._emit = emit
        self._clock = clock
        self.created_at = int(time.time())
        self.state = ResponseState.IN_PROGRESS
        self.context: list[Item] = []
        self.tokens = TokenCache(render_prefix(request.instructions, request.tools))
        self.stream = StreamBuilder(response_id, tag_response_id=True)
        self.pending_calls: dict[str, str] = {}  # call_id -> name, awaiting output
        self._inbox: list[Item] = _input_items(request.input)
        self._wakeup = asyncio.Event()
        self._resume_mark: float | None = clock()
        self._cancel_requested = False
        #: The task running :meth:`run`; set by its owner, the Session.
        self.task: asyncio.Task[None] | None = None
        self._incomplete_reason: str | None = None
        self._error: ResponseError | None = None
        self.input_tokens = 0
        self.cached_tokens = 0
        self.timings: list[TurnTiming] = []

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

    def request_cancel(self) -> None:
        """End the rollout ``cancelled`` now, wherever its loop is waiting."""
        if self.task is not None and not self.terminal and not self._cancel_requested:
            self._cancel_requested = True
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
        if self.state is ResponseState.REQUIRES_ACTION:
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
            metadata=dict(req.metadata),
            **fields,
        )

    def usage(self) -> Usage:
        output = self.stream.output_tokens
        return Usage(
            input_tokens=self.input_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=self.cached_tokens),
            output_tokens=output,
            output_tokens_details=OutputTokensDetails(),
            total_tokens=self.input_tokens + output,
        )

    # --- the loop ----------------------------------------------------------

    async def run(self) -> None:
        """The sampling loop. Cancelled from outside only when the connection is gone."""
        try:
            await self._emit(self.stream.lifecycle(ResponseCreated, self.snapshot()))
            await self._emit(self.stream.lifecycle(ResponseInProgress, self.snapshot()))
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
        except Exception:
            log.exception("rollout %s failed", self.id)
            self._error = ResponseError(code="server_error", message="The model failed.")
            with contextlib.suppress(Exception):
                await self._finish(ResponseState.FAILED)

    async def _turn(self) -> str:
        """One run of the model over the context plus whatever is in the inbox."""
        timing = TurnTiming(turn=len(self.timings) + 1)
        started = self._clock()
        new_items, self._inbox = self._inbox, []
        self.context.extend(new_items)
        cached = len(self.tokens)
        added = self.tokens.extend(new_items)
        self.input_tokens += cached + added
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
            uncached_tokens=added,
            max_output_tokens=request.max_output_tokens,
        )
        sampling_started = self._clock()
        timing.pre_inference = sampling_started - started
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
            for event in self.stream.feed(chunk):
                await self._emit(event)
        timing.inference = self._clock() - sampling_started
        produced = self.stream.output[first_output:]
        for item in produced:
            if isinstance(item, FunctionCall) and not self._answered(item.call_id):
                self.pending_calls[item.call_id] = item.name
        # The model's own output joins the context and the token cache; it is
        # not new input next turn (a real model already holds it).
        self.context.extend(produced)
        self.tokens.extend(produced)
        self.timings.append(timing)
        return stop

    def _answered(self, call_id: str) -> bool:
        return any(
            isinstance(item, FunctionCallOutput) and item.call_id == call_id for item in self._inbox
        )

    async def _pause(self) -> bool:
        """Block until every pending call has its output. False if the rollout ended."""
        self.state = ResponseState.REQUIRES_ACTION
        self._wakeup.clear()
        await self._emit(self.stream.lifecycle(ResponseDone, self.snapshot()))
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
        self.state = ResponseState.IN_PROGRESS
        await self._emit(self.stream.lifecycle(ResponseInProgress, self.snapshot()))
        return True

    async def _finish(self, state: ResponseState) -> None:
        self.state = state
        await self._emit(self.stream.lifecycle(ResponseDone, self.snapshot()))
        await self._send_timing()

    async def _send_timing(self) -> None:
        if self.send_timing and self.timings:
            await self._emit(
                TimingEvent(timing_metrics=self.timings[-1].as_metrics(), response_id=self.id)
            )
