"""The shipped shape's lanes: requests by ``stream_id``, FIFO within a lane, lanes in parallel.

Theory of operation
-------------------
A shipped-shape request runs on the **lane** its ``stream_id`` names (absent:
the default lane). :class:`Lanes` keeps the connection's lanes: FIFO within a
lane, lanes in parallel, at most ``max_in_flight`` requests running at once
across lanes (the rest wait, queued), at most ``max_lanes`` named lanes and
``max_queued`` waiting requests on the connection. Each lane with requests
has one task, started through the session's task set, that takes its
requests one at a time and runs each with the ``run`` it was given (the
shipped shape's turn). An error of a request is answered on its lane
(``report``); a bug in one becomes a ``server_error`` there, and the lane goes
on. Everything here is changed by this module only: :class:`Lane` by its
methods, called by :class:`Lanes`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, NoReturn

from protocol import ErrorCode, ProtocolError, RemoteProtocolError
from protocol.events import ResponseCreate

from ...engine.stream import StreamClosed

__all__ = ["STREAM_ID_PATTERN", "Lane", "Lanes", "Queued"]

log = logging.getLogger(__name__)

#: What a ``stream_id`` may be: 1-256 characters of ``[A-Za-z0-9_.-]``.
STREAM_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_.\-]{1,256}")

#: How a request is run once its lane reaches it.
Run = Callable[[ResponseCreate, "str | None", float, float], Awaitable[None]]


@dataclasses.dataclass(frozen=True, slots=True)
class Queued:
    """A request waiting on its lane: when it was received, how long decoding took."""

    request: ResponseCreate
    received_at: float
    decode: float = 0.0


class Lane:
    """One ``stream_id``: its FIFO of requests and the task serving it."""

    __slots__ = ("name", "queue", "task")

    def __init__(self, name: str | None) -> None:
        self.name = name
        self.queue: collections.deque[Queued] = collections.deque()
        self.task: asyncio.Task[None] | None = None

    def push(self, queued: Queued, start: Callable[[], asyncio.Task[None]]) -> None:
        """Queue a request; ``start()`` the lane's task if none is running."""
        self.queue.append(queued)
        if self.task is None or self.task.done():
            self.task = start()
            self.task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        """A lane lets go of its task once done: a cancelled task keeps its
        error, whose traceback holds the frame serving this lane (a cycle,
        freed only by a full collection, with the requests' input in it)."""
        if self.task is task:
            self.task = None
    def drop_queued(self) -> int:
        """Drop the requests still waiting; how many there were."""
        count = len(self.queue)
        self.queue.clear()
        return count


class Lanes:
    """A connection's lanes and the limits on them (see the module docstring)."""

    def __init__(
        self,
        *,
        max_lanes: int,
        max_queued: int,
        max_in_flight: int,
        run: Run,
        report: Callable[[ProtocolError, str | None], None],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
    ) -> None:
        self.max_lanes = max_lanes
        self.max_queued = max_queued
        self._lanes: dict[str | None, Lane] = {}
        self._run = run
        self._report = report
        self._spawn = spawn
        self._in_flight = asyncio.Semaphore(max_in_flight)
        #: Requests waiting in their lanes.
        self.queued = 0
        #: Requests past their lane's queue and not yet finished.
        self.active = 0

    def __len__(self) -> int:
        """The lanes used so far (the default one included)."""
        return len(self._lanes)

    def check_name(self, request: ResponseCreate) -> str | None:
        """The lane ``request`` names (``None``: the default one). Raises
        :class:`RemoteProtocolError` for a bad ``stream_id``, or a new named lane
        past ``max_lanes``; nothing changes."""
        stream_id = request.stream_id if isinstance(request.stream_id, str) else None
        if stream_id is not None and not STREAM_ID_PATTERN.fullmatch(stream_id):
            raise RemoteProtocolError(
                "Invalid 'stream_id': use 1-256 characters from [A-Za-z0-9_.-].",
                code=ErrorCode.INVALID_STREAM_ID,
                param="stream_id",
            )
        if stream_id is not None and stream_id not in self._lanes:
            named = sum(1 for name in self._lanes if name is not None)
            if named >= self.max_lanes:
                raise RemoteProtocolError(
                    f"This connection already uses {named} named streams; the limit is "
                    f"{self.max_lanes}.",
                    code=ErrorCode.WEBSOCKET_STREAM_LIMIT_REACHED,
                    param="stream_id",
                )
        return stream_id

    def submit(self, stream_id: str | None, queued: Queued) -> None:
        """Queue a request (its lane checked by :meth:`check_name`) on its lane.
        Raises :class:`RemoteProtocolError` past ``max_queued``; nothing changes."""
        if self.queued >= self.max_queued:
            raise RemoteProtocolError(
                f"{self.queued} requests are already waiting on this connection; the limit is "
                f"{self.max_queued}.",
                code=ErrorCode.WEBSOCKET_QUEUE_LIMIT_REACHED,
                status=429,
            )
        lane = self._lanes.get(stream_id)
        if lane is None:
            lane = self._lanes[stream_id] = Lane(stream_id)
        self.queued += 1
        lane.push(queued, lambda: self._spawn(self._serve(lane)))

    def stop_intake(self) -> None:
        """Drop the requests still waiting in their lanes (they have sent nothing)."""
        for lane in self._lanes.values():
            self.queued -= lane.drop_queued()

    def release(self) -> None:
        """The connection is over: forget the lanes and the hooks into the shape
        that owns them. A hook is a bound method of its owner, so the two make a
        cycle that only a full collection frees (the server's collector runs
        those rarely), with the connection's outbox and protocol state in it."""
        self.stop_intake()
        self._lanes.clear()
        self._run = _closed
        self._report = _closed
        self._spawn = _closed

    async def _serve(self, lane: Lane) -> None:
        while lane.queue:
            async with self._in_flight:
                if not lane.queue:  # dropped by a graceful shutdown while waiting
                    return
                queued = lane.queue.popleft()
                self.queued -= 1
                self.active += 1
                try:
                    await self._run(queued.request, lane.name, queued.received_at, queued.decode)
                except StreamClosed:
                    return
                except ProtocolError as error:
                    self._report(error, lane.name)
                except Exception:  # a bug in one request must not end the connection
                    log.exception("request on lane %r failed", lane.name)
                    self._report(
                        RemoteProtocolError(
                            "The server had an error while processing your request.",
                            code=ErrorCode.SERVER_ERROR,
                            status=500,
                            error_type="server_error",
                        ),
                        lane.name,
                    )
                finally:
                    self.active -= 1


def _closed(*_: object) -> NoReturn:
    """A hook of :class:`Lanes` after :meth:`Lanes.release`: never called, as
    nothing reaches a closed connection's lanes."""
    raise RuntimeError("the connection's lanes are released")
