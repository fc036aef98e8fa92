"""The compat layer: the shipped WebSocket shape, translated onto Rollouts.

Theory of operation
-------------------
A shipped-shape client sends ``response.create`` with the body of
``POST /v1/responses`` and continues with ``previous_response_id``. Each
shipped Response is one **segment** of a :class:`Rollout` (one run of its loop
between pauses). The connection keeps a :class:`SegmentCache`: segment id →
(Rollout, :class:`Boundary`). A continuation that names

- the latest segment of an idle Rollout → the new input is appended and the
  loop resumes in place: O(new input) work (instructions or tools that changed
  re-render only the prefix; the items' tokens are reused);
- an older segment, or one whose Rollout is busy on another lane → a fork: a
  new Rollout sharing the context and tokens up to that boundary;
- an id the cache does not hold → hydrated from the store when it was stored
  (``store=true``, same owner): the chain is rebuilt and rendered in full;
  otherwise ``previous_response_not_found``.

A continuation whose input does not answer every pending call of its parent,
or answers a call that is not pending, fails with a 400 and evicts the parent
(when both are on the same lane, as shipped).

Requests run on **lanes** named by ``stream_id`` (absent = the default lane):
FIFO within a lane, lanes in parallel, at most ``max_in_flight`` responses
running at once across lanes (the rest wait, queued), at most ``max_lanes``
named lanes and ``max_queued`` waiting requests per connection. Every event of
a named lane carries its ``stream_id``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import re
from collections.abc import Callable, Coroutine
from typing import Any, Final

from protocol import ErrorCode, ProtocolError, RemoteProtocolError
from protocol.events import ResponseCreate
from protocol.items import FunctionCall, FunctionCallOutput, Item, as_items
from protocol.response import Response

from ..config import ServerConfig, Switches
from ..engine.admission import Pipeline
from ..engine.models import ModelRegistry, check_sim_metadata
from ..engine.rollout import Boundary, Rollout
from ..engine.stream import EventSink, StreamClosed
from ..ids import new_id
from ..storage.persistence import Persistence
from .metrics import ServerMetrics

__all__ = [
    "STREAM_ID_PATTERN",
    "Lane",
    "SegmentCache",
    "ShippedShape",
    "check_continuation",
    "stored_history",
]

#: What a ``stream_id`` may be: 1-256 characters of ``[A-Za-z0-9_.-]``.
log = logging.getLogger(__name__)

STREAM_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_.\-]{1,256}")

EmitError = Callable[[ProtocolError, "str | None"], None]


class SegmentCache:
    """Segment id → (Rollout, Boundary), within a byte budget (LRU by Rollout)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._segments: dict[str, tuple[Rollout, Boundary]] = {}
        self._rollouts: collections.OrderedDict[int, tuple[Rollout, list[str]]] = (
            collections.OrderedDict()
        )
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._segments)

    def lookup(self, segment_id: str) -> tuple[Rollout, Boundary] | None:
        found = self._segments.get(segment_id)
        if found is not None:
            self._rollouts.move_to_end(id(found[0]))
        return found

    def add(self, rollout: Rollout, boundary: Boundary) -> None:
        self._segments[boundary.segment_id] = (rollout, boundary)
        entry = self._rollouts.get(id(rollout))
        if entry is None:
            self._rollouts[id(rollout)] = (rollout, [boundary.segment_id])
        else:
            entry[1].append(boundary.segment_id)
            self._rollouts.move_to_end(id(rollout))
        self._enforce_budget(keep=rollout)

    def evict(self, segment_id: str) -> None:
        """Forget one segment id (its Rollout stays while other ids name it)."""
        found = self._segments.pop(segment_id, None)
        if found is None:
            return
        rollout = found[0]
        entry = self._rollouts.get(id(rollout))
        if entry is not None:
            entry[1].remove(segment_id)
            if not entry[1]:
                del self._rollouts[id(rollout)]

    def drop_rollout(self, rollout: Rollout) -> None:
        entry = self._rollouts.pop(id(rollout), None)
        if entry is not None:
            for segment_id in entry[1]:
                self._segments.pop(segment_id, None)

    @property
    def nbytes(self) -> int:
        return sum(rollout.nbytes for rollout, _ in self._rollouts.values())

    def _enforce_budget(self, keep: Rollout) -> None:
        total = self.nbytes
        while total > self.budget_bytes and len(self._rollouts) > 1:
            oldest_key = next(iter(self._rollouts))
            rollout, _ = self._rollouts[oldest_key]
            if rollout is keep:
                break
            total -= rollout.nbytes
            self.drop_rollout(rollout)
            self.evictions += 1


@dataclasses.dataclass(slots=True)
class _Queued:
    request: ResponseCreate
    received_at: float
    decode: float = 0.0


class Lane:
    """One ``stream_id``: its FIFO of requests and the task serving it."""

    __slots__ = ("name", "queue", "task")

    def __init__(self, name: str | None) -> None:
        self.name = name
        self.queue: collections.deque[_Queued] = collections.deque()
        self.task: asyncio.Task[None] | None = None


def check_continuation(new_items: list[Item], pending: dict[str, str]) -> None:
    """Check tool outputs against the parent's pending calls (and the new input's own calls).

    Raises :class:`RemoteProtocolError` (400, param ``input``/``input[i].call_id``).
    """
    open_calls = dict(pending)
    answered: set[str] = set()
    for index, item in enumerate(new_items):
        if isinstance(item, FunctionCall):
            open_calls[item.call_id] = item.name
        elif isinstance(item, FunctionCallOutput):
            if item.call_id not in open_calls or item.call_id in answered:
                raise RemoteProtocolError(
                    f"No tool call found for function call output with call_id {item.call_id!r}.",
                    code=ErrorCode.UNKNOWN_CALL_ID,
                    param=f"input[{index}].call_id",
                )
            answered.add(item.call_id)
    missing = [call_id for call_id in pending if call_id not in answered]
    if missing:
        raise RemoteProtocolError(
            f"No tool output found for function call {missing[0]!r}.",
            code=ErrorCode.MISSING_TOOL_OUTPUT,
            param="input",
        )


async def stored_history(
    persistence: Persistence | None, parent_id: str, *, owner: str, new_items: list[Item]
) -> list[Item]:
    """The conversation of a stored response, to continue from (the slow path).

    The chain is read back from the store; ``new_items`` must answer its last
    response's pending calls. Raises :class:`RemoteProtocolError`
    ``previous_response_not_found`` (param ``previous_response_id``), or the
    errors of :func:`check_continuation`.
    """
    conversation = None
    if persistence is not None:
        conversation = await persistence.conversation(parent_id, owner=owner)
    if conversation is None:
        raise RemoteProtocolError(
            f"Previous response with id {parent_id!r} not found.",
            code=ErrorCode.PREVIOUS_RESPONSE_NOT_FOUND,
            param="previous_response_id",
        )
    check_continuation(new_items, conversation.pending)
    return conversation.items


class ShippedShape:
    """Serves shipped-shape ``response.create`` events of one connection."""

    def __init__(
        self,
        config: ServerConfig,
        models: ModelRegistry,
        *,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
        sink: EventSink,
        emit_error: EmitError,
        send_timing: bool,
        owner: str = "",
        persistence: Callable[[], Persistence] | None = None,
        pipeline: Pipeline | None = None,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.config = config
        self.models = models
        self.cache = SegmentCache(config.connection_cache_bytes)
        self.lanes: dict[str | None, Lane] = {}
        self._spawn = spawn
        self._sink = sink
        self._emit_error = emit_error
        self.send_timing = send_timing
        self._in_flight = asyncio.Semaphore(config.max_in_flight)
        self.owner = owner
        self._persistence = persistence
        self.pipeline = pipeline or Pipeline(Switches())
        self.metrics = metrics
        self.queued = 0
        self.segments_run = 0
        self.forks = 0
        self.hydrations = 0

    # --- admission (synchronous, in the connection's read loop) -------------

    def submit(self, request: ResponseCreate, received_at: float, decode: float = 0.0) -> None:
        """Queue ``request`` on its lane. Raises :class:`RemoteProtocolError` if refused."""
        stream_id = request.stream_id if isinstance(request.stream_id, str) else None
        if stream_id is not None and not STREAM_ID_PATTERN.fullmatch(stream_id):
            raise RemoteProtocolError(
                "Invalid 'stream_id': use 1-256 characters from [A-Za-z0-9_.-].",
                code=ErrorCode.INVALID_STREAM_ID,
                param="stream_id",
            )
        lane = self.lanes.get(stream_id)
        if lane is None:
            named = sum(1 for name in self.lanes if name is not None)
            if stream_id is not None and named >= self.config.max_lanes:
                raise RemoteProtocolError(
                    f"This connection already uses {named} named streams; the limit is "
                    f"{self.config.max_lanes}.",
                    code=ErrorCode.WEBSOCKET_STREAM_LIMIT_REACHED,
                    param="stream_id",
                )
        if request.background:
            raise RemoteProtocolError(
                "background responses are not supported over WebSocket.",
                code=ErrorCode.INVALID_VALUE,
                param="background",
            )
        if self.queued >= self.config.max_queued:
            raise RemoteProtocolError(
                f"{self.queued} requests are already waiting on this connection; the limit is "
                f"{self.config.max_queued}.",
                code=ErrorCode.WEBSOCKET_QUEUE_LIMIT_REACHED,
                status=429,
            )
        if lane is None:
            lane = self.lanes[stream_id] = Lane(stream_id)
        lane.queue.append(_Queued(request, received_at, decode))
        self.queued += 1
        if lane.task is None or lane.task.done():
            lane.task = self._spawn(self._serve_lane(lane))

    # --- execution -----------------------------------------------------------

    async def _serve_lane(self, lane: Lane) -> None:
        while lane.queue:
            queued = lane.queue[0]
            async with self._in_flight:
                lane.queue.popleft()
                self.queued -= 1
                try:
                    await self._run(queued.request, lane.name, queued.received_at, queued.decode)
                except StreamClosed:
                    return
                except ProtocolError as error:
                    self._emit_error(error, lane.name)
                except Exception:  # a bug in one request must not end the connection
                    log.exception("request on lane %r failed", lane.name)
                    self._emit_error(
                        RemoteProtocolError(
                            "The server had an error while processing your request.",
                            code=ErrorCode.SERVER_ERROR,
                            status=500,
                            error_type="server_error",
                        ),
                        lane.name,
                    )

    async def _run(
        self, request: ResponseCreate, lane: str | None, received_at: float, decode: float
    ) -> None:
        check_sim_metadata(request.metadata)
        model_name = request.model if isinstance(request.model, str) else "sim"
        new_items = as_items(request.input)
        history: list[Item] = []  # what a hydrated rollout must take in first
        checked: list[Item] = []  # what the pipeline would re-check without reuse
        cached = True
        parent_id = request.previous_response_id
        found = self.cache.lookup(parent_id) if parent_id is not None else None
        parent: Rollout | None = None
        if parent_id is None or found is None:
            if parent_id is not None:
                # Not on this connection: a stored response hydrates (the
                # slow path: the whole chain is read and rendered again).
                persistence = self._persistence() if self._persistence is not None else None
                history = checked = await stored_history(
                    persistence, parent_id, owner=self.owner, new_items=new_items
                )
                cached = False
                self.hydrations += 1
            else:
                check_continuation(new_items, {})
            rollout = None
        else:
            parent, boundary = found
            try:
                check_continuation(new_items, boundary.pending)
            except ProtocolError:
                # A failed continuation evicts its parent; a failed fork from
                # another lane leaves the shared parent alone.
                if boundary.stream_id == lane:
                    self.cache.evict(parent_id)
                raise
            latest = parent.boundaries and parent.boundaries[-1] is boundary
            if latest and not parent.busy and not parent.broken:
                rollout = parent
            else:
                rollout = parent.fork(boundary)
                self.forks += 1
            checked = rollout.context
        # Model resolution: reused from the rollout unless the name changes.
        if (
            parent is not None
            and self.pipeline.switches.resolution_reuse
            and parent.model.name == model_name
        ):
            model = parent.model
        else:
            model = self.models.resolve(model_name)
        admission = self.pipeline.admit(
            new_items, history=checked, tools=request.tools, cached=cached
        )
        new_items = admission.items
        if rollout is None:
            rollout = Rollout(
                response_id=new_id("resp"),
                request=request,
                model=model,
                sink=self._sink,
                pause_timeout=self.config.pause_timeout,
                send_timing=self.send_timing,
                shipped=True,
                pipeline=self.pipeline,
                resolve=self.models.resolve,
            )
        rollout.note_admission(
            admission.verdicts,
            decode=decode,
            validate=admission.validate_seconds,
            classify=admission.classify_seconds,
        )
        if self.metrics is not None:
            metrics = self.metrics
            rollout.on_timing = lambda timing: metrics.observe_turn("ws", timing)
        segment_id = new_id("resp")
        self.segments_run += 1
        persistence = self._persistence() if self._persistence is not None else None

        async def post_inference(response: Response) -> None:
            if self.metrics is not None:
                self.metrics.response_finished("ws", response.status)
            if persistence is not None:
                await persistence.post_inference(
                    response,
                    owner=self.owner,
                    transport="ws",
                    store_input=new_items if request.store else None,
                    previous_response_id=parent_id,
                )

        finished = await rollout.run_segment(
            segment_id=segment_id,
            request=request,
            model=model,
            new_items=[*history, *new_items],
            sink=self._sink,
            stream_id=lane,
            received_at=received_at,
            on_finish=post_inference,
        )
        if finished is not None:
            self.cache.add(rollout, finished)
        else:  # failed: still billed and counted, never stored
            failed = rollout.snapshot()
            if self.metrics is not None:
                self.metrics.response_finished("ws", failed.status)
            if persistence is not None:
                await persistence.post_inference(failed, owner=self.owner, transport="ws")
        # A failed segment leaves its Rollout broken: no continuation in place,
        # but its earlier boundaries stay valid to fork from.
