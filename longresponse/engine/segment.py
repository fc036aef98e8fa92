"""Segment: the shipped shape's view of a rollout, one Response at a time.

Theory of operation
-------------------
A shipped-shape client continues with ``previous_response_id``; each of its
Responses is one **segment** of a :class:`Rollout`: one model turn, under a
:class:`~longresponse.engine.reply.Reply` of its own (its own id, events from
``sequence_number`` 0, only its own output and usage). The context, the token
cache and the sampler stay with the Rollout between segments, so a
continuation costs the new input only.

:meth:`Segment.run` emits ``response.created``, ``response.in_progress``,
the output, and one terminal event (``response.completed``, or
``response.incomplete`` at the token limit), and leaves a :class:`Boundary`:
where the segment ended, enough to continue in place or to :func:`fork` a new
Rollout from it later. A segment that fails sends ``response.failed`` and
leaves its Rollout ``broken`` (its earlier boundaries stay valid to fork from).

A segment that ``waits`` (the multi-agent beta) runs the rollout's
:meth:`~Rollout.settle` instead of one turn: at client tool calls its
Response stays ``in_progress`` and waits in place, without a word, until
``response.inject`` brings the outputs; it ends at the rollout's real end
(or ``incomplete``, ``pause_timeout``, if the outputs never come).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from array import array
from collections.abc import Awaitable, Callable

from protocol import ResponseState
from protocol.events import (
    ResponseCompleted,
    ResponseCreate,
    ResponseCreated,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ServerEvent,
)
from protocol.items import Item
from protocol.response import Response

from .failures import failure, fit_window
from .reply import Reply, TokenCounts
from .rollout import INCOMPLETE_STOPS, Rollout
from .sampling import ModelSpec, release
from .stream import EventSink, StreamClosed

__all__ = ["Boundary", "Segment", "fork"]


@dataclasses.dataclass(frozen=True, slots=True)
class Boundary:
    """Where a shipped-shape segment ended: enough to continue or fork from it."""

    segment_id: str
    #: ``len(context)`` and ``len(tokens)`` at the end of the segment.
    items: int
    tokens: int
    #: Tokens of the items alone (after the prefix), and the prefix in effect
    #: then: a later segment may have swapped the prefix in place. The prefix
    #: is one array shared by the boundaries that had the same one.
    item_tokens: int
    prefix: array[int]
    #: Client tool calls of the segment still waiting for their outputs.
    pending: dict[str, str]
    #: The finished segment's Response object.
    response: Response
    #: The lane (``stream_id``) the segment ran on; ``None`` = the default lane.
    stream_id: str | None = None


class Segment:
    """One shipped-shape Response over ``rollout`` (see the module docstring)."""

    def __init__(
        self,
        rollout: Rollout,
        *,
        segment_id: str,
        request: ResponseCreate,
        model: ModelSpec,
        sink: EventSink,
        stream_id: str | None = None,
        send_timing: bool = False,
        waits: bool = False,
    ) -> None:
        self.rollout = rollout
        self.id = segment_id
        self.request = request
        self.model = model
        self.stream_id = stream_id
        #: Waits in place at client tool calls (multi-agent) instead of ending there.
        self.waits = waits
        #: Its turns are over: input that comes now can no longer be taken in.
        self.finishing = False
        #: Why the segment failed, once it has (the HTTP status and hints of an
        #: upstream engine's failure come from it).
        self.exception: Exception | None = None
        sampler = rollout.sampler
        self._prefix_changed = rollout.configure(request, model)
        #: Another model's sampler replaced this one: released when the segment runs.
        self._replaced = sampler if rollout.sampler is not sampler else None
        self.reply: Reply = rollout.open_reply(
            segment_id, sink, append=False, stream_id=stream_id, send_timing=send_timing
        )

    async def run(
        self,
        new_items: list[Item],
        *,
        received_at: float,
        on_finish: Callable[[Response], Awaitable[None]] | None = None,
        queued: bool = False,
    ) -> Boundary | None:
        """Run the segment over ``new_items``; return its boundary, or ``None`` if it failed.

        A warm-up (``generate: false``, or a prewarm) takes the input in
        (rendered, prefilled) without sampling. ``on_finish`` gets the finished Response before its
        terminal event is sent (persistence registers it there, so it is
        readable by the time a client can name it). ``queued`` (a background
        response): ``response.created`` carries status ``queued``, and
        ``response.in_progress`` starts it.
        """
        rollout, reply = self.rollout, self.reply
        rollout.busy = True
        try:
            if self._replaced is not None:
                await release(self._replaced)
            rollout.take_in(new_items, received_at)
            await reply.announce(ResponseCreated, ResponseState.QUEUED if queued else None)
            await reply.announce(ResponseInProgress, ResponseState.IN_PROGRESS)
            stop = "stop"
            if self.request.warm_up:
                take_in_without_sampling(rollout, self._prefix_changed)
            elif self.waits:
                stop = await rollout.settle(prefix_changed=self._prefix_changed)
            else:
                stop = await rollout.turn(prefix_changed=self._prefix_changed)
            self.finishing = True
            terminal: Callable[..., ServerEvent] = ResponseCompleted
            state = ResponseState.COMPLETED
            if stop in INCOMPLETE_STOPS:
                reply.incomplete_reason = stop
                terminal, state = ResponseIncomplete, ResponseState.INCOMPLETE
            await reply.sink.room()
            response = reply.snapshot(state)
            if on_finish is not None:
                finishing = rollout.clock()
                await on_finish(response)
                if rollout.timings:
                    rollout.timings[-1].post_inference += rollout.clock() - finishing
                await reply.sink.room()
            tokens = rollout.tokens
            boundary = Boundary(
                segment_id=self.id,
                items=len(rollout.context),
                tokens=len(tokens),
                item_tokens=len(tokens) - tokens.prefix_length,
                prefix=_shared_prefix(rollout, tokens.tokens[: tokens.prefix_length]),
                pending=dict(reply.pending_calls),
                response=response,
                stream_id=self.stream_id,
            )
            rollout.boundaries.append(boundary)
            reply.push(reply.builder.lifecycle(terminal, response))
            await rollout.report_timing()
            return boundary
        except (asyncio.CancelledError, StreamClosed):
            rollout.broken = True
            reply.abandon()
            raise
        except Exception as exc:
            rollout.broken = True
            self.exception = exc
            reply.error = failure(exc, self.id)
            with contextlib.suppress(Exception):
                await reply.announce(ResponseFailed, ResponseState.FAILED)
            return None
        finally:
            self.finishing = True
            rollout.busy = False


def take_in_without_sampling(rollout: Rollout, prefix_changed: bool) -> None:
    """A warm-up: render, tokenize and prefill the inbox without sampling; the
    next turn reads it all as cached. Raises :class:`ContextLengthExceeded`."""
    new_items = rollout._take_inbox().items
    rollout.context.extend(new_items)
    cached = 0 if prefix_changed else min(rollout.model_seen, len(rollout.tokens))
    rollout.tokens.extend(new_items)
    if fit_window(rollout):
        cached = 0
    rollout.counts.input_tokens += len(rollout.tokens)
    rollout.counts.cached_tokens += cached
    rollout.model_seen = len(rollout.tokens)


def fork(parent: Rollout, boundary: Boundary) -> Rollout:
    """A new Rollout holding ``parent``'s context up to ``boundary`` (shared prefix)."""
    child = Rollout(
        request=parent.request,
        model=parent.model,
        pause_timeout=parent.pause_timeout,
        pipeline=parent.pipeline,
        resolve=parent.resolve_model,
        input_items=[],
        clock=parent.clock,
        max_events=parent.max_events,
        max_output_tokens=parent.max_output_tokens,
    )
    child.context = parent.context[: boundary.items]
    child.tokens = parent.tokens.fork_items(boundary.prefix, boundary.item_tokens)
    child._prefix_key = (None, b"")  # unknown: the next segment compares the tokens
    index = parent.boundaries.index(boundary)
    child.boundaries = parent.boundaries[: index + 1]
    child.counts = TokenCounts(parent.counts.input_tokens, parent.counts.cached_tokens)
    # A model server's prefix cache is shared by every request, so the fork's
    # prefix counts as processed, unless the prefix changed since.
    same_prefix = parent.tokens.tokens[: parent.tokens.prefix_length] == boundary.prefix
    child.model_seen = min(parent.model_seen, boundary.tokens) if same_prefix else 0
    return child


def _shared_prefix(rollout: Rollout, prefix: array[int]) -> array[int]:
    """``prefix``, or the previous boundary's equal one (one copy for a whole chain)."""
    if rollout.boundaries and rollout.boundaries[-1].prefix == prefix:
        return rollout.boundaries[-1].prefix
    return prefix
