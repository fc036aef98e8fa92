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
``response.incomplete`` at the token limit), and leaves a
:class:`~longresponse.engine.boundary.Boundary` (:meth:`Rollout.mark_boundary`):
where the segment ended, enough to continue in place or to fork a new Rollout
from it later (:meth:`Rollout.fork`). A segment that fails sends
``response.failed`` and leaves its Rollout ``broken`` (its earlier boundaries
stay valid to fork from). Only this module assigns a Segment's fields; the
rollout's are changed through its methods.

A segment that ``waits`` (the multi-agent beta) runs the rollout's
:meth:`~Rollout.run_turns` instead of one turn: at client tool calls its
Response stays ``in_progress`` and waits in place, without a word, until
``response.inject`` brings the outputs; it ends at the rollout's real end
(or ``incomplete``, ``pause_timeout``, if the outputs never come).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from protocol import Mode, ResponseState
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

from .boundary import Boundary
from .failures import failure, untraced
from .reply import Reply
from .rollout import Rollout
from .sampling import ModelSpec
from .stream import EventSink, StreamClosed
from .turn_loop import INCOMPLETE_STOPS

__all__ = ["Segment"]


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
        #: Its turns are over: input that comes now can no longer be delivered.
        self.finishing = False
        #: Why the segment failed, once it has (the HTTP status and hints of an
        #: upstream engine's failure come from it).
        self.exception: Exception | None = None
        #: The token prefix changed: nothing the model processed counts as cached.
        #: (A sampler another model replaced is released when the segment runs.)
        self._prefix_changed = rollout.configure(request, model)
        self.reply: Reply = rollout.open_reply(
            segment_id, sink, mode=Mode.SHIPPED, stream_id=stream_id, send_timing=send_timing
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
        rollout.enter_segment()
        failed = False
        try:
            await rollout.release_replaced()
            rollout.deliver_segment_input(new_items, received_at)
            await reply.announce(ResponseCreated, ResponseState.QUEUED if queued else None)
            await reply.announce(ResponseInProgress, ResponseState.IN_PROGRESS)
            stop = "stop"
            if self.request.warm_up:
                rollout.prefill(prefix_changed=self._prefix_changed)
            elif self.waits:
                stop = await rollout.run_turns(prefix_changed=self._prefix_changed)
            else:
                stop = await rollout.turn(prefix_changed=self._prefix_changed)
            self.finishing = True
            terminal: Callable[..., ServerEvent] = ResponseCompleted
            state = ResponseState.COMPLETED
            if stop in INCOMPLETE_STOPS:
                reply.note_incomplete(stop)
                terminal, state = ResponseIncomplete, ResponseState.INCOMPLETE
            await reply.sink.room()
            response = reply.snapshot(state)
            if on_finish is not None:
                finishing = rollout.clock()
                await on_finish(response)
                rollout.note_post_inference(rollout.clock() - finishing)
                await reply.sink.room()
            boundary = rollout.mark_boundary(
                self.id,
                pending=dict(reply.pending_calls),
                response=response,
                stream_id=self.stream_id,
            )
            reply.push(reply.builder.lifecycle(terminal, response))
            await rollout.report_timing()
            return boundary
        except (asyncio.CancelledError, StreamClosed):
            failed = True
            reply.abandon()
            raise
        except Exception as exc:
            failed = True
            reply.fail(failure(exc, self.id))  # logged there, traceback and all
            self.exception = untraced(exc)
            with contextlib.suppress(Exception):
                await reply.announce(ResponseFailed, ResponseState.FAILED)
            return None
        finally:
            self.finishing = True
            rollout.leave_segment(failed=failed)
