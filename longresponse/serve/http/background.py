"""Background responses: HTTP ``background: true``, owned by the server, not the request.

Theory of operation
-------------------
A ``POST /v1/responses`` with ``background: true`` is checked and admitted
like any HTTP request (``serve/http.py``, ``serve/turns.py``), then handed to
the app's :class:`BackgroundResponses`, which owns it from then on: its task
runs the segment (``engine/segment.py``) whatever becomes of the request that
started it, and the app's lifespan stops what is still running at shutdown.

Its sink is an :class:`EventLog`: every event goes through a protocol
``Connection`` with SSE framing (checked and recorded like any other), and the
record is kept in a log bounded in bytes, oldest first out. The log never
makes the response wait: readers follow it at their own pace, any number at
once, from any ``sequence_number`` (``starting_after``); one that asks for, or
falls behind to, a record no longer held goes on from the oldest one still
held (the gap shows in ``sequence_number``; the terminal event carries the
whole Response anyway). The response opens ``queued`` (``response.created``
carries that status) and ``response.in_progress`` starts it. A follower
(``stream: true``, ``GET ?stream=true``) is a :class:`~longresponse.serve.deadline.DeadlineStream`:
its queue is its place in the log, so it holds at most the log's bytes, and
one whose write waits ``slow_reader_timeout`` is cut off (dropped, and the
log let go).

How it ends:

- finished (``completed``, ``incomplete``) or ``failed``: billed and stored
  (``store=true`` is required, so a poll finds it after its log is gone);
- cancelled (:meth:`BackgroundResponses.cancel`): unless post-inference has
  begun (then it is too late, the response completes), the stream ends with
  ``response.failed`` carrying status ``cancelled`` and no output, the task
  is cancelled, and the cancelled Response is billed and stored;
- at shutdown (:meth:`BackgroundResponses.aclose`): the same, ending
  ``failed`` with ``server_error``;
- after ``max_duration`` seconds (``--background-max-duration``): stopped the
  same way, but ending ``incomplete`` with reason ``max_duration`` and its
  finished output items (an open one is cut, as when an upstream fails
  mid-item), as the server's own per-Response caps end one (``max_events``,
  ``max_output_tokens``): nothing failed, the output is cut short. It fires
  wherever the run waits (a long first token, a stalled upstream).

What survives this process (issue 30). The response is durable before the
client hears of it: the task's first step stores it ``queued`` (a store that
fails the write fails the create: 503 ``store_unavailable``), held by this
process's *lease* (``longresponse.storage.records``), then ``in_progress``; the
create's answer waits for both. While it runs, :meth:`BackgroundResponses.beat`
(every third of ``lease``, ``--background-lease``, 30 s: the app's lifespan
runs :meth:`BackgroundResponses.keep_leases`) renews the leases this process
holds and stores each response as it is now (its output and usage so far),
then takes over every response on the store whose lease ran out (its process
was killed, or lost the store for a whole lease) and ends it ``failed``
(``server_error``, :data:`STOPPED`), stored and billed with what it had
written at its last beat; a ``GET``, cancel or ``DELETE`` of such a response
does the same at once (a cancel ends it ``cancelled``). Taking over is atomic
on the store and the end is written only while the taker holds the lease, so
one process ends it, and the ledger (one record per response id) bills it
once. A process that finds it lost a lease (it stalled for a whole lease and
another process ended the response) stops the response ``failed`` as well.
It is not run again: a response is never completed by another process.

Then what the log still holds moves to a byte-bounded table of finished
logs (oldest out first), so a late ``GET ?stream=true`` replays it from its
first event, or after ``starting_after``, as a running one is followed: the
SDKs' ``stream(response_id=...)`` needs ``response.created`` first. A log
that was trimmed while it ran starts at the oldest record it kept; one larger
than the whole table keeps its terminal event alone. At most
``max_running`` responses run at once; one more gets a 429
(``too_many_background_responses``), and so does one more of an API key
that runs ``max_per_key`` already (with keys on: keys off is one
tenant). Only the owner (API key) of a response finds it here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Final

import msgspec
from starlette.responses import Response as HTTPResponse

from protocol import (
    Connection,
    ErrorCode,
    Framing,
    Mode,
    RemoteProtocolError,
    ResponseState,
    ResponseTrack,
    Role,
)
from protocol.events import (
    ResponseCreate,
    ResponseCreated,
    ResponseFailed,
    ResponseIncomplete,
    ServerEvent,
)
from protocol.items import Item
from protocol.response import Response, ResponseError

from ...config import (
    BACKGROUND_ENDINGS_BYTES,
    BACKGROUND_LEASE,
    BACKGROUND_LOG_BYTES,
    BACKGROUND_MAX_DURATION,
    MAX_BACKGROUND,
    MAX_BACKGROUND_PER_KEY,
    SLOW_READER_TIMEOUT,
)
from ...engine.sampling import ModelSpec
from ...engine.turn import Started
from ...storage.persistence import Persistence, StoreWriteFailed, stored_input_items
from ...storage.records import UNFINISHED, StoredResponse, StoreError, is_running
from ..continuation import Continuation
from ..deadline import DeadlineStream
from ..inspector.watched import WatchedSink
from ..transport import Transport
from ..turns import Caller, Turns
from .sinks import SSE_DONE

__all__ = [
    "LEASE_BEATS",
    "LEASE_LOST",
    "MAX_DURATION_REASON",
    "STOPPED",
    "TOO_MANY_BACKGROUND_RESPONSES",
    "BackgroundResponse",
    "BackgroundResponses",
    "EventLog",
    "check_cancellable",
]

#: The error code of a create beyond the limit of running background responses.
TOO_MANY_BACKGROUND_RESPONSES: Final = "too_many_background_responses"
#: ``incomplete_details.reason`` of a response stopped at ``max_duration``.
MAX_DURATION_REASON: Final = "max_duration"
#: Beats per lease: a process renews its leases every ``lease / LEASE_BEATS``
#: seconds, and looks for leases that ran out as often.
LEASE_BEATS: Final = 3
#: The error of a background response whose server process stopped (its lease
#: ran out), as the process that took it over ends it.
STOPPED: Final = ResponseError(
    code="server_error",
    message="The server process that ran this background response stopped before it "
    "finished; create it again.",
)
#: The error of a background response this process lost its lease on (it was
#: taken over while this process did not renew it).
LEASE_LOST: Final = ResponseError(
    code="server_error",
    message="The server process that ran this background response stopped renewing it "
    "before it finished; create it again.",
)
_encoder = msgspec.json.Encoder()
log = logging.getLogger(__name__)


def check_cancellable(response: Response) -> None:
    """The answer to cancelling ``response``, which is not running (any more).

    Returns for a cancelled one (cancelling again changes nothing); raises
    :class:`RemoteProtocolError` (400, param ``response_id``) for one that was
    not a background response, or that ended otherwise.
    """
    if not response.background:
        raise RemoteProtocolError(
            "Only responses created with background=true can be cancelled; "
            f"response '{response.id}' was not.",
            code=ErrorCode.INVALID_VALUE,
            param="response_id",
        )
    if response.status != "cancelled":
        raise RemoteProtocolError(
            f"Cannot cancel a {response.status} response.",
            code=ErrorCode.RESPONSE_ALREADY_COMPLETED,
            param="response_id",
        )


class EventLog:
    """The sink of one background response: its SSE records, bounded in bytes."""

    def __init__(self, budget_bytes: int = BACKGROUND_LOG_BYTES) -> None:
        self.connection = Connection(Role.SERVER, Mode.SHIPPED, framing=Framing.SSE)
        self.budget_bytes = budget_bytes
        self._records: collections.deque[tuple[int, bytes]] = collections.deque()
        self.nbytes = 0
        #: The Response ``response.created`` carried (``None`` until it is out).
        self.created: Response | None = None
        #: Set once ``response.created`` is out, or the log closed without it.
        self.opened = asyncio.Event()
        self.closed = False
        self._changed = asyncio.Event()

    async def room(self) -> None:
        return None  # readers never hold a background response back

    def push(self, event: ServerEvent) -> None:
        record = self.connection.send(event)
        if isinstance(event, ResponseCreated):
            self.created = event.response
            self.opened.set()
        sequence = getattr(event, "sequence_number", None)
        assert isinstance(sequence, int)  # a response's events only: no timing, no errors
        self._records.append((sequence, record))
        self.nbytes += len(record)
        while self.nbytes > self.budget_bytes and len(self._records) > 1:
            _, dropped = self._records.popleft()
            self.nbytes -= len(dropped)
        self._wake()

    def track(self, response_id: str) -> ResponseTrack:
        track = self.connection.response(response_id)
        assert track is not None  # asked only after response.created
        return track

    @property
    def last(self) -> tuple[int, bytes] | None:
        """The newest record and its ``sequence_number``."""
        return self._records[-1] if self._records else None

    def held(self) -> list[tuple[int, bytes]]:
        """The records still held, oldest first, each with its ``sequence_number``."""
        return list(self._records)

    def close(self) -> None:
        """No more records will come; readers end once they have read the last."""
        self.closed = True
        self.opened.set()
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(self, after: int) -> AsyncIterator[bytes]:
        """Every record after ``sequence_number`` ``after``, as it comes, until the log closes."""
        wanted = after + 1
        while True:
            changed = self._changed
            while self._records and wanted <= self._records[-1][0]:
                index = max(0, wanted - self._records[0][0])
                sequence, record = self._records[index]
                wanted = sequence + 1
                yield record
            if self.closed:
                return
            await changed.wait()


class BackgroundResponse:
    """One background response while it runs: its turn, its log, its task."""

    def __init__(self, started: Started, *, owner: str, log: EventLog) -> None:
        assert started.segment is not None  # background responses are HTTP segments
        self.id = started.reply.id
        self.owner = owner
        self.started = started
        self.log = log
        self.task: asyncio.Task[None] | None = None
        #: Stops it at ``max_duration`` (cancelled as it ends).
        self.timer: asyncio.TimerHandle | None = None
        #: Post-inference has begun: too late to cancel.
        self.finishing = False
        #: The Response as it ended (set as it ends, before it is billed).
        self.final: Response | None = None
        #: The run is over, billed and stored (or queued to be).
        self.ended = asyncio.Event()
        #: Its input as stored (ids given once, for every write of it).
        self.input_items = stored_input_items(started.items)
        #: Held while one of its writes to the store is under way: they land in order.
        self.writing = asyncio.Lock()
        #: Stored, with this process's lease on it.
        self.held = False
        #: Why it could not be stored before it ran (it never ran).
        self.refused: StoreWriteFailed | None = None

    @property
    def over(self) -> bool:
        """Its end is decided: only the end is written from now on."""
        return self.finishing or self.final is not None or self.started.reply.terminal

    def hold(self) -> None:
        """It is stored, with this process's lease on it."""
        self.held = True

    def refuse(self, why: StoreWriteFailed) -> None:
        """It could not be stored before it ran: it never runs."""
        self.refused = why

    def attach(self, task: asyncio.Task[None], timer: asyncio.TimerHandle) -> None:
        """It runs in ``task``, stopped by ``timer`` at ``max_duration``."""
        self.task, self.timer = task, timer

    def finishing_as(self, response: Response) -> None:
        """Post-inference has begun on ``response``: too late to cancel."""
        self.finishing = True
        self.final = response

    def end_as(self, response: Response) -> None:
        """It ended as ``response`` (before it is billed)."""
        self.final = response

    def snapshot(self) -> Response:
        """The Response now: live while it runs, as it ended after."""
        return self.final if self.final is not None else self.started.reply.snapshot()


class BackgroundResponses:
    """The server's background responses (see the module docstring); one per app."""

    def __init__(
        self,
        turns: Turns,
        *,
        max_running: int = MAX_BACKGROUND,
        max_per_key: int = MAX_BACKGROUND_PER_KEY,
        max_duration: float = BACKGROUND_MAX_DURATION,
        slow_reader_timeout: float = SLOW_READER_TIMEOUT,
        log_bytes: int = BACKGROUND_LOG_BYTES,
        endings_bytes: int = BACKGROUND_ENDINGS_BYTES,
        lease: float = BACKGROUND_LEASE,
    ) -> None:
        self.turns = turns
        self.max_running = max_running
        self.max_per_key = max_per_key
        self.max_duration = max_duration
        self.slow_reader_timeout = slow_reader_timeout
        self.log_bytes = log_bytes
        self.endings_bytes = endings_bytes
        self.lease = lease
        #: This process's name on the leases it holds (host, pid, a random part).
        self.holder = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"
        self._running: dict[str, BackgroundResponse] = {}
        #: Running responses by owner (API key).
        self._per_key: collections.Counter[str] = collections.Counter()
        #: id -> (owner, its records) of finished responses: what their logs held at
        #: the end, each record with its sequence_number, the terminal event last.
        self._endings: collections.OrderedDict[str, tuple[str, list[tuple[int, bytes]]]] = (
            collections.OrderedDict()
        )
        self._endings_nbytes = 0
        self._closing = False

    @property
    def running(self) -> int:
        """How many run now."""
        return len(self._running)

    def check_room(self, owner: str) -> None:
        """Raises :class:`RemoteProtocolError` (429) when no more may start now, or
        none more of ``owner`` (an API key's owner; ``""``, keys off, has no quota)."""
        if self._closing or len(self._running) >= self.max_running:
            raise RemoteProtocolError(
                f"Too many background responses are running ({self.max_running} at most); "
                "wait for one to finish or cancel one.",
                code=TOO_MANY_BACKGROUND_RESPONSES,
                status=429,
            )
        if owner and self._per_key[owner] >= self.max_per_key:
            raise RemoteProtocolError(
                f"Too many background responses of this API key are running "
                f"({self.max_per_key} at most); wait for one to finish or cancel one.",
                code=TOO_MANY_BACKGROUND_RESPONSES,
                status=429,
            )

    def start(
        self, started: Started, *, owner: str, history: Sequence[Item], received_at: float
    ) -> BackgroundResponse:
        """Run ``started`` (admitted, its sink an :class:`EventLog`) in a task owned here.

        Raises :class:`RemoteProtocolError` (429, nothing started) beyond the limit.
        """
        self.check_room(owner)
        log = started.reply.sink
        if isinstance(log, WatchedSink):  # the inspector's note-taker around it
            log = log.sink
        assert isinstance(log, EventLog)
        entry = BackgroundResponse(started, owner=owner, log=log)
        self._running[entry.id] = entry
        self._per_key[owner] += 1
        loop = asyncio.get_running_loop()
        run = self._run(entry, history, received_at)
        task = loop.create_task(run, name=f"background {entry.id}")
        entry.attach(task, loop.call_later(self.max_duration, self._expire, entry))
        # Cleanup runs however the task ends, even cancelled before its first step.
        task.add_done_callback(lambda _: self._ended(entry))
        return entry

    def get(self, response_id: str, *, owner: str) -> BackgroundResponse | None:
        """The running response ``response_id`` of ``owner`` (anyone else's is not found)."""
        entry = self._running.get(response_id)
        return entry if entry is not None and entry.owner == owner else None

    def ending(self, response_id: str, *, owner: str) -> list[tuple[int, bytes]] | None:
        """The kept records of a finished response, oldest first, each with its
        ``sequence_number``; the terminal event is the last."""
        kept = self._endings.get(response_id)
        if kept is None or kept[0] != owner:
            return None
        return kept[1]

    async def check_deletable(
        self, response_id: str, *, owner: str, persistence: Persistence
    ) -> None:
        """Raises :class:`RemoteProtocolError` (400) while the response runs, here
        or in another process on the store; one whose process stopped is ended
        (:meth:`settle`) and may be deleted. Raises :class:`StoreError`."""
        running = self.get(response_id, owner=owner) is not None
        if not running:
            record = await persistence.get(response_id, owner=owner)
            running = record is not None and (await self.settle(record)).status in UNFINISHED
        if running:
            raise RemoteProtocolError(
                f"Response '{response_id}' is still running; cancel it or let it finish "
                "before deleting it.",
                code=ErrorCode.INVALID_VALUE,
                param="response_id",
            )

    def forget(self, response_id: str) -> None:
        """Drop what is kept of a finished response (it was deleted)."""
        kept = self._endings.pop(response_id, None)
        if kept is not None:
            self._endings_nbytes -= _size(kept[1])

    async def create(
        self,
        request: ResponseCreate,
        new_items: list[Item],
        continuation: Continuation,
        *,
        owner: str,
        model: ModelSpec,
        received_at: float,
        decode: float,
    ) -> HTTPResponse:
        """Admit a checked ``background: true`` create continuing from the store
        (``continuation``), start it (:meth:`start`) and answer it: the Response
        ``response.created`` carried (status ``queued``), or, with
        ``stream: true``, its events as they come.

        Raises :class:`RemoteProtocolError` (nothing started): admission's
        errors, 429 beyond the limit; 500 when it failed before ``response.created``.
        """
        self.check_room(owner)
        # Stateless, as any HTTP request: the whole history is checked again.
        caller = Caller(Transport.HTTP, EventLog(self.log_bytes), owner, decode=decode)
        started = self.turns.start_turn(request, new_items, caller, continuation, model=model)
        entry = self.start(
            started, owner=owner, history=continuation.history, received_at=received_at
        )
        await entry.log.opened.wait()
        created = entry.log.created
        if created is None and entry.refused is not None:
            raise RemoteProtocolError(
                "The background response could not be stored, so it was not started; "
                "retry when the store is back.",
                code="store_unavailable",
                status=503,
                error_type="server_error",
            )
        if created is None:
            raise RemoteProtocolError(
                "The server had an error while processing your request.",
                code=ErrorCode.SERVER_ERROR,
                status=500,
                error_type="server_error",
            )
        if request.stream:
            return self._follower(entry.log.follow(-1))
        return HTTPResponse(_encoder.encode(created), media_type="application/json")

    async def stream(
        self, response_id: str, starting_after: str | None, owner: str, persistence: Persistence
    ) -> HTTPResponse | None:
        """``GET /v1/responses/{id}?stream=true&starting_after=N``: the events after
        ``sequence_number`` N (all without it); ``None`` when ``owner`` has no such response.

        A running response is followed live from its log; a finished one replays
        what its log held at the end (from the first event, or after N; nothing
        if N is not before its terminal event). Raises
        :class:`RemoteProtocolError` (400): ``starting_after`` not a non-negative
        integer; param ``stream`` for a response that was not a background one,
        that runs in another process, or whose terminal event is no longer kept.
        """
        after = _sequence_number(starting_after)
        entry = self.get(response_id, owner=owner)
        if entry is not None:
            return self._follower(entry.log.follow(after))
        record = await persistence.get(response_id, owner=owner)
        if record is None:
            return None
        if not record.response.background:
            raise RemoteProtocolError(
                f"Response '{response_id}' cannot be streamed: it was not created with "
                "background=true.",
                code=ErrorCode.INVALID_VALUE,
                param="stream",
            )
        if (await self.settle(record)).status in UNFINISHED:
            raise RemoteProtocolError(
                f"Response '{response_id}' runs in another server process, which alone "
                "streams its events; retrieve it without stream=true.",
                code=ErrorCode.INVALID_VALUE,
                param="stream",
            )
        ending = self.ending(response_id, owner=owner)
        if ending is None:
            raise RemoteProtocolError(
                f"The event stream of response '{response_id}' is no longer kept; "
                "retrieve it without stream=true.",
                code=ErrorCode.INVALID_VALUE,
                param="stream",
            )
        return self._follower(_replay([record for number, record in ending if number > after]))

    def _follower(self, records: AsyncIterator[bytes]) -> DeadlineStream:
        """A reader of a log, ``data: [DONE]`` after its last record: cut off when a
        write waits ``slow_reader_timeout``."""
        return DeadlineStream(
            _then_done(records),
            timeout=self.slow_reader_timeout,
            why="slow background stream reader",
        )

    async def cancel(self, response_id: str, *, owner: str) -> Response | None:
        """Cancel a running response and wait until it is stored; return how it ended.

        ``None`` when ``owner`` has no such running response. A response already
        in post-inference is not cancelled: its finished Response is returned.
        """
        entry = self.get(response_id, owner=owner)
        if entry is None:
            return None
        self._stop(entry, ResponseState.CANCELLED)
        await entry.ended.wait()
        return entry.snapshot()

    async def cancel_stored(self, record: StoredResponse) -> Response:
        """The stored Response a cancel of ``record`` (not running here) decides on:
        one whose process stopped (its lease ran out) is ended ``cancelled`` now.

        Raises :class:`RemoteProtocolError` (400, param ``response_id``) for one
        that runs in another process (which alone can stop it), and
        :class:`StoreError`.
        """
        response = await self._settle(record, ResponseState.CANCELLED)
        if response.status in UNFINISHED:
            raise RemoteProtocolError(
                f"Response '{record.id}' runs in another server process, which alone can "
                "cancel it; send the cancel there, or wait for it to end.",
                code=ErrorCode.INVALID_VALUE,
                param="response_id",
            )
        return response

    async def settle(self, record: StoredResponse) -> Response:
        """The Response of ``record`` as it stands: a background response whose
        process stopped (its lease ran out) is ended ``failed`` (:data:`STOPPED`)
        here first, stored and billed; one still held by a process is as it last
        stored it. Raises :class:`StoreError`."""
        return await self._settle(record, ResponseState.FAILED)

    async def _settle(self, record: StoredResponse, status: ResponseState) -> Response:
        persistence = self.turns.persistence
        if not is_running(record) or persistence is None:
            return record.response
        for taken in await persistence.take_expired(
            holder=self.holder, lease=self.lease, response_id=record.id
        ):
            ended = await self._end_taken(taken, status)
            if ended is not None:
                return ended
        return record.response

    async def keep_leases(self) -> None:
        """Beat (:meth:`beat`) now and every ``lease / LEASE_BEATS`` seconds, for as
        long as the app runs (its lifespan owns the task and cancels it); a beat
        the store fails is logged, and the next one tries again."""
        while True:
            try:
                await self.beat()
            except StoreError as exc:
                log.warning("background leases: the store failed a beat: %s", exc)
            await asyncio.sleep(self.lease / LEASE_BEATS)

    async def beat(self) -> None:
        """Renew this process's leases and store each of its responses as it is
        now; stop ``failed`` (:data:`LEASE_LOST`) any whose lease was taken over;
        then take over the responses on the store whose lease ran out and end
        them ``failed`` (:data:`STOPPED`). Raises :class:`StoreError` (what was
        done stays done)."""
        persistence = self.turns.persistence
        if persistence is None or self._closing:
            return
        held = [entry for entry in self._running.values() if entry.held and not entry.over]
        if held:
            ids = [entry.id for entry in held]
            lost = await persistence.renew_leases(ids, holder=self.holder, lease=self.lease)
            for entry in held:
                if entry.id in lost:
                    log.warning("background response %s: its lease was taken over", entry.id)
                    self._stop(entry, ResponseState.FAILED, LEASE_LOST)
                    continue
                with contextlib.suppress(StoreWriteFailed):  # logged; the next beat retries
                    await self._checkpoint(entry, ResponseState.IN_PROGRESS)
        for taken in await persistence.take_expired(holder=self.holder, lease=self.lease):
            await self._end_taken(taken, ResponseState.FAILED)

    async def _end_taken(self, taken: StoredResponse, status: ResponseState) -> Response | None:
        """End ``taken`` (a response this process took over) with ``status``:
        stored and billed, while the lease is still this process's; ``None`` if
        it is not any more. Raises :class:`StoreError`."""
        persistence = self.turns.persistence
        assert persistence is not None  # only what the store gave is taken
        fields: dict[str, object] = {"status": status.value, "completed_at": int(time.time())}
        if status is ResponseState.CANCELLED:
            fields["output"] = []  # as a cancel of a running one answers
        else:
            fields["error"] = STOPPED
        response = msgspec.structs.replace(taken.response, **fields)
        transport = Transport.HTTP
        if not await persistence.end_taken(
            taken, response, holder=self.holder, transport=transport
        ):
            return None
        log.warning(
            "background response %s: its process stopped (lease ran out); ended %s",
            taken.id,
            response.status,
        )
        if self.turns.metrics is not None:
            self.turns.metrics.response_finished(transport, response.status)
        return response

    async def aclose(self) -> None:
        """Shutdown: refuse new ones, end the running ones ``failed``, wait until stored."""
        self._closing = True
        error = ResponseError(
            code="server_error", message="The server shut down before the response finished."
        )
        running = list(self._running.values())
        for entry in running:
            self._stop(entry, ResponseState.FAILED, error)
        for entry in running:
            await entry.ended.wait()

    # --- the run -------------------------------------------------------------------

    def _expire(self, entry: BackgroundResponse) -> None:
        """``max_duration`` is up: the response ends ``incomplete`` (``max_duration``)."""
        self._stop(entry, ResponseState.INCOMPLETE, reason=MAX_DURATION_REASON)

    def _stop(
        self,
        entry: BackgroundResponse,
        status: ResponseState,
        error: ResponseError | None = None,
        *,
        reason: str | None = None,
    ) -> None:
        """End ``entry`` now with ``status``, unless it is ending already.

        The terminal event goes into the log before the task is cancelled, with
        no ``await`` between: the rollout is suspended at an ``await`` of its
        own, never between building events and pushing them.
        """
        reply = entry.started.reply
        if entry.finishing or entry.final is not None or reply.terminal:
            return
        assert entry.task is not None
        if reply.track is not None:
            if error is not None:
                reply.fail(error)
            if reason is not None:
                reply.note_incomplete(reason)
            final = reply.snapshot(status)
            if status is ResponseState.CANCELLED:
                final = msgspec.structs.replace(final, output=[])
            ending = ResponseIncomplete if status is ResponseState.INCOMPLETE else ResponseFailed
            reply.push(reply.builder.lifecycle(ending, final))
            entry.end_as(final)
        entry.task.cancel()

    async def _run(
        self, entry: BackgroundResponse, history: Sequence[Item], received_at: float
    ) -> None:
        started = entry.started
        segment = started.segment
        assert segment is not None

        start = len(started.rollout.context) - started.known + len(history)

        async def finishing(response: Response) -> None:
            entry.finishing_as(response)
            async with entry.writing:
                await self.turns.acknowledge(
                    started,
                    response,
                    owner=entry.owner,
                    transport=Transport.HTTP,
                    context_from=start,
                    input_items=entry.input_items,
                )

        try:
            try:  # durable before the client hears of it: queued, then started
                await self._checkpoint(entry, ResponseState.QUEUED)
            except StoreWriteFailed as exc:
                entry.refuse(exc)  # never ran: nothing to bill
                return
            with contextlib.suppress(StoreWriteFailed):  # queued it stays, until a beat
                await self._checkpoint(entry, ResponseState.IN_PROGRESS)
            boundary = await segment.run(
                [*history, *started.items][started.known :],
                received_at=received_at,
                on_finish=finishing,
                queued=True,
            )
            if boundary is None:  # failed: its response.failed is in the log
                entry.end_as(started.reply.snapshot(ResponseState.FAILED))
                await self._bill(entry, entry.snapshot())
        except asyncio.CancelledError:
            if entry.final is None:
                raise  # cancelled before response.created: nothing to bill
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await self._bill(entry, entry.final)  # stopped: its terminal event is in the log
        finally:
            await started.rollout.close()  # the rollout ends: an upstream socket closes

    async def _checkpoint(self, entry: BackgroundResponse, status: ResponseState) -> None:
        """Store ``entry`` as it is now, with ``status`` (it has not ended), held by
        this process's lease; nothing once its end is decided, or without a store.

        A caller cancelled meanwhile still waits for the write to land, so the
        entry's writes land in order (its end last). Raises :class:`StoreWriteFailed`.
        """
        persistence = self.turns.persistence
        if persistence is None:
            return
        async with entry.writing:
            if entry.over:
                return
            write = persistence.persist_running(
                entry.started.reply.snapshot(status),
                owner=entry.owner,
                input_items=entry.input_items,
                previous_response_id=entry.started.reply.request.previous_response_id,
                holder=self.holder,
                lease=self.lease,
            )
            await _landed(write)
            entry.hold()

    async def _bill(self, entry: BackgroundResponse, response: Response) -> None:
        """A background response that did not complete: billed, and stored when the
        store takes it (a poll then finds it); a store that is down loses only that."""
        request = entry.started.reply.request
        async with entry.writing:
            try:
                await self.turns.bill(
                    response,
                    owner=entry.owner,
                    transport=Transport.HTTP,
                    store_input=entry.input_items,
                    previous_response_id=request.previous_response_id,
                )
            except StoreWriteFailed:
                await self.turns.bill(response, owner=entry.owner, transport=Transport.HTTP)

    def _ended(self, entry: BackgroundResponse) -> None:
        if self._running.pop(entry.id, None) is not None:
            self._per_key[entry.owner] -= 1
            if not self._per_key[entry.owner]:
                del self._per_key[entry.owner]
        if entry.timer is not None:
            entry.timer.cancel()
        entry.log.close()
        records = entry.log.held()
        if records and entry.started.reply.terminal:
            self._keep_ending(entry.id, entry.owner, records)
        entry.ended.set()

    def _keep_ending(self, response_id: str, owner: str, records: list[tuple[int, bytes]]) -> None:
        """Keep a finished log for late readers; one larger than the whole table
        keeps its terminal event alone (as it would once the table had no room)."""
        if _size(records) > self.endings_bytes:
            records = records[-1:]
        self._endings[response_id] = (owner, records)
        self._endings_nbytes += _size(records)
        while self._endings_nbytes > self.endings_bytes and self._endings:
            _, (_, dropped) = self._endings.popitem(last=False)
            self._endings_nbytes -= _size(dropped)


async def _landed(write: Awaitable[None]) -> None:
    """Await ``write``; cancelled meanwhile, wait for it to land all the same
    (then the cancellation goes on), so that no later write overtakes it."""
    task = asyncio.ensure_future(write)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise


def _size(records: list[tuple[int, bytes]]) -> int:
    return sum(len(record) for _, record in records)


async def _then_done(records: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for record in records:
        yield record
    yield SSE_DONE


async def _replay(records: list[bytes]) -> AsyncIterator[bytes]:
    for record in records:
        yield record


def _sequence_number(value: str | None) -> int:
    """``starting_after``: absent is -1 (everything)."""
    if value is None:
        return -1
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise RemoteProtocolError(
            "Invalid 'starting_after': expected a sequence_number (a non-negative integer).",
            code=ErrorCode.INVALID_VALUE,
            param="starting_after",
        )
    return int(value)
