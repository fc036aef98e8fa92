"""What the inspector keeps of one rollout: its recent events and its turns.

Theory of operation
-------------------
A :class:`RolloutRecord` is fed by the hot paths through three calls:
:meth:`RolloutRecord.note` for each client event, :meth:`RolloutRecord.sent`
for each server event (through a
:class:`~longresponse.serve.inspector.watched.WatchedSink` around the turn's
sink, which reads the encoded size off the sink's queue counter), and
:meth:`RolloutRecord.turn_ended` for each finished turn. An event is kept as
a tuple of cheap fields (a number counted per rollout, a wall-clock time,
the direction, the wire type, its ``sequence_number``, its bytes, a short
summary for the few events that change the rollout's state, and a count);
the state (sampling, paused on which call ids, completed, failed, cancelled,
incomplete) follows from those summaries. Nothing is published unless a
watcher is connected (``longresponse.serve.inspector.observer``).

A server event is not digested as it leaves: :meth:`RolloutRecord.sent`
keeps the event, its size and the time in a list and asks the loop to call
:meth:`RolloutRecord.digest` :data:`DIGEST_AFTER` seconds later, once per
batch; by then the turn has usually ended and the rollout waits for its
client, so the digest costs the turn nothing. Whatever reads the record
digests first (:meth:`RolloutRecord.summary`, :meth:`RolloutRecord.detail`,
the inspector's pruning and chain-finding), so nothing read is ever behind;
a client event digests what was sent before it, so the order holds; with a
watcher connected every event is digested (and published) at once; and
past :data:`MAX_PENDING` undigested events the list is digested in place, so
it stays bounded (the events themselves are held until their digest, never
copied). Sending an event thus costs the unwatched path a clock read and a
list append besides its size.

Consecutive delta events of one item (``response.output_text.delta``,
``response.function_call_arguments.delta``, ``response.mcp_call_arguments.delta``),
numbered one after the other,
share one entry: the first one's time and ``sequence_number``, their bytes
summed, their count. The run is kept in a few counters and written into its
entry only when the next event ends it (:meth:`RolloutRecord.entries` reads
it as it stands).

A turn's row holds the :class:`~longresponse.engine.timing.TurnTiming`
phases, the tokens (new, cached, total), the bytes on the wire both ways
since the last turn, and the pause before it: from the end of the last turn
to the arrival of the client message that started this one (``resume``
counts from there), the time the rollout waited for the client's tools.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sized
from typing import Any, Final, Protocol

from protocol import wire_type
from protocol.events import (
    ClientEvent,
    ErrorEvent,
    OutputItemAdded,
    ResponseAppend,
    ResponseCreate,
    ServerEvent,
)
from protocol.items import (
    CallOutput,
    ClientCall,
    answered_call_id,
    call_name,
    is_hosted,
)
from protocol.response import RequiredAction

from ...engine.timing import TurnTiming
from ..transport import Transport

__all__ = [
    "DIGEST_AFTER",
    "FINISHED",
    "MAX_CLIENT_STRING",
    "MAX_LISTED",
    "MAX_PENDING",
    "MAX_TURNS",
    "SHAPES",
    "SPARK_TURNS",
    "ConnectionRecord",
    "Observer",
    "RolloutRecord",
]

#: Turns kept per rollout (a 200-call rollout, the bench's longest, fits).
MAX_TURNS: Final = 250
#: Turns a rollout's summary gives per-turn figures of (the page's sparklines).
SPARK_TURNS: Final = 60
#: Seconds after a server event is sent that its batch is digested (see above).
DIGEST_AFTER: Final = 0.01
#: Server events sent and not yet digested, per rollout, before one is digested
#: in place.
MAX_PENDING: Final = 256
#: Response statuses after which a rollout (not paused) is finished.
FINISHED: Final = frozenset({"completed", "failed", "cancelled", "incomplete"})
#: Client creates seen but not yet started, per connection (lanes queue them):
#: only their sizes are kept, never their bodies.
_PENDING_CREATES: Final = 64
#: Characters kept of a string the client chose (an append create's
#: ``previous_response_id``, a model name) before it is cut with :data:`_CUT`.
MAX_CLIENT_STRING: Final = 128
#: What ends a client string cut at :data:`MAX_CLIENT_STRING` (then the count cut).
_CUT: Final = "…[+{} chars]"
#: Entries kept of a list the client's message sizes (call ids, hosted tools);
#: the rest are counted in a last entry, :data:`_MORE`.
MAX_LISTED: Final = 64
_MORE: Final = "…[+{} more]"
#: The ``shape`` each transport is shown as (the shipped WebSocket shape: ``shipped``).
SHAPES: Final = {Transport.APPEND: "append", Transport.WS: "shipped", Transport.HTTP: "http"}


class Observer(Protocol):
    """What a record calls back: the inspector
    (:class:`~longresponse.serve.inspector.observer.Inspector`), which this module
    does not import."""

    @property
    def enabled(self) -> bool: ...

    @property
    def ring(self) -> int:
        """Events kept per rollout."""

    @property
    def watchers(self) -> Sized:
        """The live feeds: nothing is published while there is none."""

    @property
    def by_response(self) -> Mapping[str, RolloutRecord]: ...

    def later(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` a little later (:data:`DIGEST_AFTER`)."""

    def publish(self, kind: str, data: Any, owner: str | None) -> None:
        """Offer ``data`` to the feeds that may see ``owner``'s records."""


def bounded(text: str | None) -> str | None:
    """``text`` as kept: at most :data:`MAX_CLIENT_STRING` characters and a marker."""
    if text is None or len(text) <= MAX_CLIENT_STRING:
        return text
    return text[:MAX_CLIENT_STRING] + _CUT.format(len(text) - MAX_CLIENT_STRING)


def listed(values: Iterable[str | None]) -> list[str | None]:
    """``values`` as kept: at most :data:`MAX_LISTED`, each :func:`bounded`, and
    how many more there were."""
    kept: list[str | None] = []
    more = 0
    for value in values:
        if len(kept) < MAX_LISTED:
            kept.append(bounded(value))
        else:
            more += 1
    if more:
        kept.append(_MORE.format(more))
    return kept


def _summary(event: Any) -> dict[str, Any] | None:
    """What a state-changing event says, in a few fields (None for the rest)."""
    response = getattr(event, "response", None)
    if response is not None:
        out: dict[str, Any] = {"status": response.status}
        if isinstance(response.required_action, RequiredAction):
            out["call_ids"] = listed(response.required_action.call_ids)
        return out
    if isinstance(event, OutputItemAdded) and isinstance(event.item, ClientCall):
        call: ClientCall = event.item
        return {
            "call_id": bounded(call.call_id),
            "name": bounded(call_name(call)),
            "kind": wire_type(call),
        }
    if isinstance(event, ResponseCreate) and event.tools and any(map(is_hosted, event.tools)):
        return {
            "model": bounded(event.model) if isinstance(event.model, str) else None,
            "previous_response_id": bounded(event.previous_response_id),
            "hosted_tools": listed(wire_type(tool) for tool in event.tools if is_hosted(tool)),
        }
    if isinstance(event, ErrorEvent):
        return {"code": bounded(event.error.code), "param": bounded(event.error.param)}
    if isinstance(event, ResponseCreate):
        return {
            "model": bounded(event.model) if isinstance(event.model, str) else None,
            "previous_response_id": bounded(event.previous_response_id),
        }
    if isinstance(event, ResponseAppend) and not isinstance(event.input, str):
        calls = listed(answered_call_id(i) for i in event.input if isinstance(i, CallOutput))
        return {"outputs_for": calls} if calls else None
    return None


#: Event class → (wire type, whether it is summarised, whether it is a delta):
#: filled as classes are met.
_KINDS: dict[type, tuple[str, bool, bool]] = {}
#: Events whose consecutive runs on one item share a ring entry.
_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.mcp_call_arguments.delta",
    }
)
#: Events summarised besides the lifecycle ones (those that carry a ``response``).
_SUMMARISED = frozenset(
    {"response.output_item.added", "error", "response.create", "response.append"}
)


def _kind(cls: type) -> tuple[str, bool, bool]:
    kind = _KINDS.get(cls)
    if kind is None:
        tag = wire_type(cls)
        lifecycle = "response" in getattr(cls, "__struct_fields__", ())
        kind = _KINDS[cls] = (tag, lifecycle or tag in _SUMMARISED, tag in _DELTAS)
    return kind


class ConnectionRecord:
    """One WebSocket connection (or every HTTP request, as one record)."""

    def __init__(
        self,
        inspector: Observer,
        cid: str,
        transport: Transport,
        session: Any,
        owner: str | None = "",
    ) -> None:
        self.inspector = inspector
        self.id = cid
        self.transport = transport
        self.session = session
        #: The API key's owner (``""`` with keys off); ``None`` for the shared
        #: ``http`` record, whose requests each have their own.
        self.owner = owner
        self.opened = time.time()
        self.closed: float | None = None
        self.bytes_in = self.bytes_out = 0
        self.latest: RolloutRecord | None = None
        #: The sizes of creates not yet started (a lane's queue), by the event's
        #: identity; the bodies are not kept (the server holds them while it needs).
        self.creates: dict[int, int] = {}

    def close(self) -> None:
        """The connection has closed: the session is let go, and the sizes of the
        creates it never started (rollout records may point here for a while yet)."""
        self.closed = time.time()
        self.session = None
        self.creates.clear()

    def started(self, record: RolloutRecord) -> None:
        """A turn of ``record``'s starts on this connection: the latest one."""
        self.latest = record

    def take_create(self, event: ResponseCreate) -> int:
        """The size of a create whose turn starts now (0 if not seen), forgotten here."""
        return self.creates.pop(id(event), 0)

    def count_out(self, nbytes: int) -> None:
        """Bytes sent on this connection."""
        self.bytes_out += nbytes

    def client(self, event: ClientEvent, nbytes: int) -> None:
        """A decoded client message: counted, and logged on the rollout it targets."""
        if not self.inspector.enabled:
            return
        self.bytes_in += nbytes
        if isinstance(event, ResponseCreate):
            if len(self.creates) >= _PENDING_CREATES:
                del self.creates[next(iter(self.creates))]
            self.creates[id(event)] = nbytes
            return
        rid = getattr(event, "response_id", None)
        record = self.inspector.by_response.get(rid) if rid else self.latest
        if record is not None and record.owner == self.owner:  # (never another key's)
            record.received(event, nbytes)

    def refused(self, event: ResponseCreate | None) -> None:
        """A create refused before its turn started (or before it was read): its body
        is not kept."""
        if event is not None:
            self.creates.pop(id(event), None)

    def summary(self) -> dict[str, Any]:
        session = self.session
        out: dict[str, Any] = {
            "id": self.id,
            "shape": SHAPES[self.transport],
            "opened": self.opened,
            "age_s": (self.closed or time.time()) - self.opened,
            "open": self.closed is None,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "lanes": None,
            "outbox_events": None,
            "outbox_bytes": None,
        }
        if session is not None and self.closed is None:
            shipped = getattr(session, "shipped", None)
            if shipped is not None:
                out["lanes"] = len(shipped.lanes)
            else:
                out["lanes"] = sum(1 for r in session.rollouts.values() if not r.terminal)
            out["outbox_events"] = len(session.outbox)
            out["outbox_bytes"] = session.outbox.queued_bytes
        return out


class RolloutRecord:
    """What the inspector knows of one rollout (see the module docstring)."""

    def __init__(
        self,
        inspector: Observer,
        rid: str,
        transport: Transport,
        connection: ConnectionRecord,
        owner: str = "",
        *,
        parent: str | None = None,
    ) -> None:
        """``parent``: the record this rollout forked from."""
        self.inspector = inspector
        self.id = rid
        #: The API key's owner (``""`` with keys off): only it (and the operator)
        #: is shown this record.
        self.owner = owner
        self.transport = transport
        self.connection = connection
        self.parent = parent
        self.model: str | None = None
        self.created = time.time()
        self.active = time.monotonic()
        self.responses: list[str] = []
        self.status = "sampling"
        self.pending: list[str] = []
        self.events: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=inspector.ring)
        self.turns: collections.deque[_Turn] = collections.deque(maxlen=MAX_TURNS)
        self.turn_count = 0
        self.seq = 0
        self.bytes_in = self.bytes_out = 0
        self._counted_in = self._counted_out = 0
        self._turn_end: float | None = None
        self.running = False
        #: The run of deltas the last entry opened: their class, item, count, bytes,
        #: and the sequence_number the next one must have to join it.
        self._run: type | None = None
        self._run_item = ""
        self._run_count = self._run_bytes = self._run_next = 0
        #: Server events sent and not yet digested: (event, bytes, wall-clock time).
        self._sent: list[tuple[Any, int, float]] = []

    # --- recording (hot) --------------------------------------------------------

    def turn_started(
        self,
        connection: ConnectionRecord,
        model: str,
        response_id: str,
        request: ResponseCreate,
        nbytes: int,
    ) -> str | None:
        """A turn starts on ``connection`` for response ``response_id``, its create
        ``nbytes`` long: sampling. The oldest response id forgotten past
        :data:`MAX_TURNS`, if one was."""
        self.connection = connection
        self.model = model
        self.running = True
        self.responses.append(response_id)
        forgotten = self.responses.pop(0) if len(self.responses) > MAX_TURNS else None
        self.received(request, nbytes)
        self.status, self.pending = "sampling", []
        return forgotten

    def received(self, event: ClientEvent, nbytes: int) -> None:
        """A client event for this rollout: counted and kept."""
        self.bytes_in += nbytes
        self.note("client", event, nbytes)

    def cut_off(self) -> None:
        """Its connection closed: what ran on it is cut off, as the server ends it
        (cancelled); a shipped chain paused between responses may go on elsewhere,
        from the store."""
        self.digest()
        if self.status == "sampling" or (
            self.status == "paused" and self.transport is Transport.APPEND
        ):
            self.status, self.pending, self.running = "cancelled", [], False

    def sent(self, event: ServerEvent, nbytes: int) -> None:
        """A server event has left, ``nbytes`` as encoded: kept to be digested later."""
        self.bytes_out += nbytes
        self.connection.count_out(nbytes)
        sent = self._sent
        sent.append((event, nbytes, time.time()))
        if self.inspector.watchers or len(sent) >= MAX_PENDING:
            self.digest()
        elif len(sent) == 1:
            self.inspector.later(self.digest)

    def digest(self) -> None:
        """Note the server events sent since the last digest, in order."""
        sent = self._sent
        if sent:
            self._sent = []
            for event, nbytes, at in sent:
                self._keep("server", event, nbytes, at)

    def note(self, direction: str, event: Any, nbytes: int) -> None:
        """Keep one (client) event: a few fields, no payload."""
        if self._sent:
            self.digest()
        self._keep(direction, event, nbytes, time.time())

    def _keep(self, direction: str, event: Any, nbytes: int, at: float) -> None:
        cls = type(event)
        if self._run is not None:
            if (
                cls is self._run
                and event.sequence_number == self._run_next
                and event.item_id == self._run_item
            ):
                self._run_next += 1
                self._run_count += 1
                self._run_bytes += nbytes
                if self.inspector.watchers:
                    last = _entry_json(self._run_entry())
                    self.inspector.publish(
                        "event", {"rollout": self.id, "event": last}, self.owner
                    )
                return
            self._end_run()
        tag, summarised, delta = _KINDS.get(cls) or _kind(cls)
        detail = _summary(event) if summarised else None
        self.seq += 1
        number = getattr(event, "sequence_number", None)
        entry = (
            self.seq,
            at,
            direction,
            tag,
            number if type(number) is int else None,
            nbytes,
            detail,
            1,
        )
        self.events.append(entry)
        if delta:  # a run of deltas starts: the next ones of its item join it
            self._run, self._run_item = cls, event.item_id
            self._run_count, self._run_bytes = 1, nbytes
            self._run_next = event.sequence_number + 1
        if detail is not None and "status" in detail:
            self._status(detail)
        inspector = self.inspector
        if inspector.watchers:
            inspector.publish(
                "event", {"rollout": self.id, "event": _entry_json(entry)}, self.owner
            )

    def _run_entry(self) -> tuple[Any, ...]:
        """The last entry with the run of deltas it opened so far."""
        e = self.events[-1]
        return (e[0], e[1], e[2], e[3], e[4], self._run_bytes, None, self._run_count)

    def _end_run(self) -> None:
        if self._run_count > 1:
            self.events[-1] = self._run_entry()
        self._run = None

    def entries(self) -> list[tuple[Any, ...]]:
        """The ring's entries, oldest first, a run of deltas still open included."""
        self.digest()
        entries = list(self.events)
        if self._run is not None and self._run_count > 1:
            entries[-1] = self._run_entry()
        return entries

    def _status(self, detail: dict[str, Any]) -> None:
        status = detail["status"]
        self.active = time.monotonic()
        if status == "requires_action":
            self.status, self.pending = "paused", detail.get("call_ids", [])
        elif (
            status == "completed"
            and self.transport is not Transport.APPEND
            and self._open_calls()
        ):
            self.status = "paused"  # a shipped-shape response that ends in client calls
        elif status in ("in_progress", "queued", "created"):
            self.status, self.pending = "sampling", []
        else:
            self.status, self.pending = status, []
        if status in FINISHED or status == "requires_action":
            self.running = False
        if self.inspector.watchers:
            self.inspector.publish("rollout", self.summary(), self.owner)

    def _open_calls(self) -> bool:
        """This response's client calls, read back from its last events."""
        calls = []
        for entry in reversed(self.events):
            detail = entry[6]
            if entry[3] == "response.created":
                break
            if detail is not None and "call_id" in detail:
                calls.append(detail["call_id"])
        self.pending = calls[::-1]
        return bool(calls)

    def turn_ended(self, timing: TurnTiming, response_id: str) -> None:
        """A turn is over: its phases, tokens and bytes become a timeline row."""
        now = time.perf_counter()
        # The turn began when its client message arrived (``resume`` runs from
        # there to the sampler; hosted tools run within the turn); before that,
        # since the last turn ended, the rollout waited for the client: its
        # tools, its network.
        began = now - timing.resume - timing.inference - timing.hosted - timing.post_inference
        pause = 0.0 if self._turn_end is None else max(0.0, began - self._turn_end)
        self._turn_end = now
        self.turn_count += 1
        row = _Turn(
            self.turn_count,
            response_id,
            time.time(),
            pause,
            self.bytes_in - self._counted_in,
            self.bytes_out - self._counted_out,
            timing,  # the rollout's own record of the turn, not a copy
        )
        self._counted_in, self._counted_out = self.bytes_in, self.bytes_out
        self.turns.append(row)
        self.active = time.monotonic()
        if self.inspector.watchers:
            self.inspector.publish(
                "turn", {"rollout": self.id, "turn": row.as_json()}, self.owner
            )

    def sent_late(self, nbytes: int) -> None:
        """Bytes of the last turn sent after it was recorded (an HTTP JSON body)."""
        self.bytes_out += nbytes
        self.connection.count_out(nbytes)
        if self.turns:
            self.turns[-1].sent_late(nbytes)
        self._counted_out = self.bytes_out

    # --- reading -------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        self.digest()
        recent = list(itertools.islice(reversed(self.turns), SPARK_TURNS))[::-1]
        return {
            "id": self.id,
            "shape": SHAPES[self.transport],
            "connection": self.connection.id,
            "parent": self.parent,
            "model": self.model,
            "created": self.created,
            "status": self.status,
            "pending_call_ids": list(self.pending),
            "responses": len(self.responses),
            "last_response_id": self.responses[-1] if self.responses else None,
            "turns": self.turn_count,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            # The last turns' server time before the model, and bytes on the wire:
            # the page's sparklines (HTTP's growth next to append's flat line).
            "per_turn": {
                "pre_inference_ms": [t.timing.pre_inference * 1000 for t in recent],
                "bytes": [t.bytes_in + t.bytes_out for t in recent],
            },
        }

    def detail(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "response_ids": list(self.responses),
            "timeline": [t.as_json() for t in self.turns],
            "events": [_entry_json(e) for e in self.entries()],
            "events_kept": self.inspector.ring,
        }


@dataclasses.dataclass(slots=True)
class _Turn:
    """One row of a rollout's timeline (see :meth:`RolloutRecord.turn_ended`)."""

    turn: int
    response_id: str
    at: float
    pause: float
    bytes_in: int
    bytes_out: int
    timing: TurnTiming

    def sent_late(self, nbytes: int) -> None:
        """Bytes of this turn sent after it was recorded."""
        self.bytes_out += nbytes

    def as_json(self) -> dict[str, Any]:
        timing = self.timing
        return {
            "turn": self.turn,
            "response_id": self.response_id,
            "at": self.at,
            "pause_ms": self.pause * 1000,
            "new_tokens": timing.new_tokens,
            "cached_tokens": timing.cached_tokens,
            "input_tokens": timing.input_tokens,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "server": timing.as_metrics(),
        }


def _entry_json(entry: tuple[Any, ...]) -> dict[str, Any]:
    seq, at, direction, tag, sequence_number, nbytes, detail, count = entry
    return {
        "seq": seq,
        "at": at,
        "direction": direction,
        "type": tag,
        "sequence_number": sequence_number,
        "bytes": nbytes,
        "detail": detail,
        "count": count,
    }
