"""Append mode: a whole rollout as ONE long-running Response on one connection.

Theory of operation
-------------------
``response.create`` starts a :class:`Rollout` whose sampling loop runs as a
task of the session; its ``response.created`` goes out at once, so an append
or cancel without ``response_id`` that follows targets it. When the model
asks for client tools the loop pauses (``response.done`` with
``requires_action``); ``response.append`` brings the outputs (or steering
input) and the loop resumes in place. ``response.cancel`` ends it.
``response.inject`` (the multi-agent beta's append, ``longresponse.serve.ws.live_input``)
does what an append does, and is answered with ``response.inject.created``.

An append or inject is admitted (validated, classified, redacted or refused by the
secrets policy) by :meth:`AppendShape.admit`, which the protocol core calls
after its own checks and before it records the append: a refused append
changes nothing, and its calls stay pending.

A rollout that finishes bills its usage before its terminal event; one cut
off by a disconnect is billed without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from protocol import ErrorCode, ProtocolError, RemoteProtocolError, ResponseTrack
from protocol.events import (
    ClientEvent,
    ResponseAppend,
    ResponseCancel,
    ResponseCreate,
    ResponseInject,
    ResponseResume,
)
from protocol.items import as_items
from protocol.response import Response

from ...config import ServerConfig
from ...engine.rollout import Rollout
from ...engine.stream import EventSink, StreamClosed
from ...storage.records import StoreError
from ..checkpoints import CheckpointWriter
from ..continuation import Continuation, check_continuation
from ..input_budget import InputLedger
from ..transport import Transport
from ..turns import Caller, Turns
from .admitted import Admitted
from .live_input import admit_input, deliver_input, send_receipt

__all__ = ["AppendShape"]

log = logging.getLogger(__name__)


class AppendShape:
    """Serves one append-mode connection's client events."""

    def __init__(
        self,
        config: ServerConfig,
        turns: Turns,
        sink: EventSink,
        *,
        ledger: InputLedger,
        spawn: Callable[[Coroutine[Any, Any, None]], Any],
        report: Callable[[ProtocolError], None],
        send_timing: bool = False,
        owner: str = "",
    ) -> None:
        self.config = config
        self.turns = turns
        self.sink = sink
        #: The bytes of input this connection's rollouts hold in their inboxes.
        self.ledger = ledger
        self._spawn = spawn
        #: Sends an ``error`` event (a request refused after its message was handled).
        self._report = report
        self.send_timing = send_timing
        self.owner = owner
        #: Response id → its rollout (finished ones are forgotten at the next create).
        self.rollouts: dict[str, Rollout] = {}
        #: Running rollouts whose usage record is written (each leaves as its task ends).
        self._billed: set[str] = set()
        #: The checkpoints of the running rollouts that keep them (``store: true``).
        self._writers: dict[str, CheckpointWriter] = {}

    @property
    def billed(self) -> frozenset[str]:
        """Running rollouts whose usage record is written (each leaves as its task ends)."""
        return frozenset(self._billed)

    # --- admission, before the protocol core records the event ----------------

    def admit(self, event: ClientEvent, track: ResponseTrack | None, size: int) -> Admitted:
        """Validate and classify an append's or inject's items (a message of
        ``size`` bytes): the event with the admitted items, its target, its
        admission and the bytes it holds.

        Raises :class:`ProtocolError` to refuse it (the protocol core then
        records nothing); an inject also when its rollout is already ending,
        and either when the rollout or the key holds too much input already.
        """
        if not isinstance(event, ResponseAppend | ResponseInject) or track is None:
            return Admitted(event, track)
        rollout = self._target(track)
        finished = isinstance(event, ResponseInject) and rollout.terminal
        event, admission, hold = admit_input(
            self.turns,
            rollout,
            event,
            track.response_id,
            ledger=self.ledger,
            size=size,
            finished=finished,
        )
        return Admitted(event, track, admission, hold)

    # --- recorded events --------------------------------------------------------

    def handle(self, admitted: Admitted, received_at: float, decode: float) -> None:
        event = admitted.event
        if isinstance(event, ResponseCreate):
            self._create(event, decode, admitted.continuation or Continuation())
        elif isinstance(event, ResponseAppend | ResponseInject):
            self._append(admitted, received_at, decode)
            if isinstance(event, ResponseInject):
                send_receipt(self.sink, self.sink.track(event.response_id))
        elif isinstance(event, ResponseCancel):
            self._target(admitted.track).request_cancel()
        elif isinstance(event, ResponseResume):
            self._check_room(event.response_id)
            self._spawn(self._take_up(event.response_id, decode))
        # response.processed: tolerated, never answered

    def _check_room(self, resumed: str | None = None) -> None:
        """Refuse one more rollout past ``--max-rollouts-per-connection`` (429); the
        refusal of a resume names the response (``resumed``) it leaves where it is."""
        live = sum(1 for r in self.rollouts.values() if not r.terminal)
        if live >= self.config.max_rollouts_per_connection:
            raise RemoteProtocolError(
                f"This connection already runs {live} rollouts; the limit is "
                f"{self.config.max_rollouts_per_connection}.",
                code=ErrorCode.TOO_MANY_ROLLOUTS,
                status=429,
                response_id=resumed,
            )

    def _caller(self, decode: float) -> Caller:
        return Caller(
            Transport.APPEND,
            self.sink,
            self.owner,
            send_timing=self.send_timing,
            decode=decode,
            on_terminal=self._post_inference,
            checkpoint=self._checkpoints_of,
        )

    def _checkpoints_of(self, response_id: str) -> CheckpointWriter:
        writer = self.turns.checkpoints.writer(owner=self.owner, response_id=response_id)
        self._writers[response_id] = writer
        return writer

    async def _take_up(self, response_id: str, decode: float) -> None:
        """``response.resume``: the response taken over from its checkpoint, then run
        on this connection; an ``error`` naming it when it cannot be."""
        caller = self._caller(decode)
        try:
            started = await self.turns.take_up(response_id, caller)
            if started is None:
                raise RemoteProtocolError(
                    f"Response {RemoteProtocolError.clip(response_id)!r} has no checkpoint to "
                    "take up: it was created with store: false, it ended, or it expired "
                    "(--checkpoint-ttl).",
                    code=ErrorCode.RESPONSE_NOT_FOUND,
                    param="response_id",
                    status=404,
                    response_id=response_id,
                )
        except ProtocolError as error:
            self._report(error)
            return
        except StoreError:
            log.exception("response %s: its checkpoint could not be read", response_id)
            self._report(
                RemoteProtocolError(
                    "The response's checkpoint could not be read; retry when the store is back.",
                    code=ErrorCode.SERVER_ERROR,
                    status=500,
                    error_type="server_error",
                    response_id=response_id,
                )
            )
            return
        rollout = started.rollout
        writer = started.rollout.on_checkpoint
        if isinstance(writer, CheckpointWriter):
            self._writers[response_id] = writer
        self._forget_finished()
        self.rollouts[response_id] = rollout
        task = asyncio.current_task()
        if task is not None:
            rollout.adopt(task)
        await self._run(rollout, response_id)

    def _create(self, event: ResponseCreate, decode: float, continuation: Continuation) -> None:
        self.turns.check_background(event, transport=Transport.APPEND)
        self._check_room()
        if event.conversation is not None:
            # One long Response has no turns to append: refused, never ignored.
            raise RemoteProtocolError(
                "'conversation' is not supported in append mode; use the shipped "
                "WebSocket or HTTP, or send the conversation's items as input.",
                code=ErrorCode.INVALID_VALUE,
                param="conversation",
            )
        model = self.turns.resolve(event)
        self.turns.check_metadata(event, model)
        new_items = as_items(event.input)
        # A new rollout has no calls yet: outputs must answer calls of the same input.
        check_continuation(new_items, {})
        caller = self._caller(decode)
        started = self.turns.start_turn(event, new_items, caller, continuation, model=model)
        rollout, reply = started.rollout, started.reply
        self._forget_finished()
        self.rollouts[reply.id] = rollout
        reply.announce_created()
        rollout.adopt(self._spawn(self._run(rollout, reply.id)))

    async def _run(self, rollout: Rollout, response_id: str) -> None:
        try:
            await rollout.run()
        except StreamClosed:
            pass
        except Exception:  # one rollout's bug must not end the connection
            log.exception("rollout %s crashed", response_id)
        finally:
            writer = self._writers.pop(response_id, None)
            if response_id in self._billed:
                self._billed.discard(response_id)  # nothing asks after this: the set stays small
            elif writer is None or writer.epoch is None:
                # Cut off (the connection went away): the tokens it used are
                # still billed. Nothing may wait here, so the record is queued
                # without waiting for room.
                self.turns.bill_nowait(
                    rollout.snapshot(), owner=self.owner, transport=Transport.APPEND
                )
            # (else its last checkpoint billed it so far, and whoever takes it up
            # bills the rest: the turn cut off here runs again there)
            await rollout.close()  # the rollout is over: an upstream socket closes

    async def _post_inference(self, response: Response) -> None:
        """A rollout finished: its usage record (and metrics), before its terminal
        event; its checkpoint, if it kept one, goes."""
        self._billed.add(response.id)
        await self.turns.bill(response, owner=self.owner, transport=Transport.APPEND)
        writer = self._writers.get(response.id)
        if writer is not None:
            with contextlib.suppress(StoreError):
                await writer.forget()

    def release(self) -> None:
        """The connection is closing: forget the rollouts that finished (their
        creates, contexts and outputs), so that they are freed with the
        connection rather than by a full collection of its reference cycles."""
        self._forget_finished()

    def _forget_finished(self) -> None:
        # Only those whose terminal event went out: until then the protocol
        # core still accepts appends and cancels that name them.
        for rollout_id in [rid for rid, r in self.rollouts.items() if r.reply_terminal]:
            del self.rollouts[rollout_id]

    def _target(self, track: ResponseTrack | None) -> Rollout:
        """The rollout of the response ``track`` (an append's or a cancel's target,
        as the protocol core found it)."""
        target_id = track.response_id if track is not None else None
        rollout = self.rollouts.get(target_id or "")
        if rollout is None:  # pragma: no cover - the protocol core found it live
            raise RemoteProtocolError(
                f"Response {target_id!r} is already finished.",
                code=ErrorCode.RESPONSE_ALREADY_COMPLETED,
                param="response_id",
                status=409,
                response_id=target_id,
            )
        return rollout

    def _append(self, admitted: Admitted, received_at: float, decode: float) -> None:
        if admitted.admission is None:  # pragma: no cover - admit() admits every append
            raise RuntimeError("an append reached handle() without its admission")
        rollout = self._target(admitted.track)
        deliver_input(
            rollout, admitted.admission, admitted.hold, received_at=received_at, decode=decode
        )

    # --- graceful shutdown ----------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A turn is running: a rollout whose loop is alive and not paused for tool outputs."""
        return any(
            rollout.task is not None and not rollout.task.done() and not rollout.awaiting_input
            for rollout in self.rollouts.values()
        )

    def stop_intake(self) -> None:
        """Shutdown: nothing waits to start in append mode (a create starts at once)."""

    def hand_back(self, why: str) -> None:
        """The server closes the connection now: append mode has no steers to hand
        back (an append's input is its rollout's once accepted, and goes where the
        rollout goes)."""
