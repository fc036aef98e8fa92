"""A client and a server protocol Connection talking in memory, for the protocol tests.

Modelled on h11's ``tests/helpers.py``: a :class:`ConnectionPair` sends every
event through one side's ``send`` and the other side's ``receive_message``, so
each rule is checked from both ends: the sender raises
:class:`LocalProtocolError` before anything leaves, the receiver raises
:class:`RemoteProtocolError` with the same wire code, and neither side changes.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import msgspec
import pytest

from protocol import (
    CLOSED,
    NEED_DATA,
    Connection,
    LocalProtocolError,
    Mode,
    RemoteProtocolError,
    ResponseState,
    Role,
    encode_event,
)
from protocol.events import (
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputItemAdded,
    OutputItemDone,
    ResponseAppend,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseInProgress,
)
from protocol.items import FunctionCall, FunctionCallOutput, Message
from protocol.response import RequiredAction, Response

RID = "resp_1"


def response(response_id: str = RID, status: str = "in_progress", **fields: Any) -> Response:
    return Response(id=response_id, created_at=1_700_000_000, status=status, model="sim", **fields)  # type: ignore[arg-type]


def function_call(call_id: str, name: str = "add") -> FunctionCall:
    return FunctionCall(call_id=call_id, name=name, arguments='{"a": 1}', id=f"fc_{call_id}")


def output(call_id: str, text: str = "2") -> FunctionCallOutput:
    return FunctionCallOutput(call_id=call_id, output=text)


def user(text: str = "and then?") -> Message:
    return Message(role="user", content=text)


def queued_events(conn: Connection) -> list[Any]:
    """The events ``conn.next_event()`` would hand out now, leaving ``conn`` as it is."""
    copy = deepcopy(conn)
    events = []
    while (event := copy.next_event()) is not NEED_DATA and event is not CLOSED:
        events.append(event)
    return events


def snapshot(conn: Connection) -> Any:
    """Everything a Connection tracks, as plain comparable values."""
    tracks = {
        rid: (t.state, t.next_sequence, dict(t.pending_calls), set(t.answered_calls), t.stream_id)
        for rid, t in conn.responses.items()
    }
    return tracks, dict(conn.lanes), queued_events(conn), conn.closed


def drain(conn: Connection) -> list[Any]:
    events = []
    while (event := conn.next_event()) is not NEED_DATA:
        assert event is not CLOSED
        events.append(event)
    return events


class ConnectionPair:
    """A client and a server :class:`Connection` talking to each other in memory.

    ``send`` carries one event across and returns what the peer received;
    ``emit`` builds a server event with the response's next
    ``sequence_number``. ``as_text`` feeds messages as ``str`` (what an ASGI
    server hands over) instead of ``bytes``.
    """

    def __init__(self, mode: Mode = Mode.APPEND, *, as_text: bool = False, **limits: int) -> None:
        self.client = Connection(Role.CLIENT, mode, **limits)
        self.server = Connection(Role.SERVER, mode, **limits)
        self.as_text = as_text
        self._ids = iter(range(1, 1_000_000))

    def ends(self, role: Role) -> tuple[Connection, Connection]:
        """(sender, receiver) for events sent by ``role``."""
        return (self.client, self.server) if role is Role.CLIENT else (self.server, self.client)

    def send(self, role: Role, event: Any) -> list[Any]:
        sender, receiver = self.ends(role)
        data = sender.send(event)
        receiver.receive_message(data.decode() if self.as_text else data)
        received = drain(receiver)
        assert received == [event]
        self.assert_agree()
        return received

    def assert_agree(self) -> None:
        """Both peers hold the same view of every response."""
        assert snapshot(self.client)[:2] == snapshot(self.server)[:2]

    # client side

    def create(self, **fields: Any) -> None:
        self.send(Role.CLIENT, ResponseCreate(model="sim", **fields))

    def append(self, *items: Any, response_id: str | None = None) -> None:
        self.send(Role.CLIENT, ResponseAppend(input=list(items), response_id=response_id))

    # server side

    def next_sequence(self, response_id: str) -> int:
        track = self.server.response(response_id)
        return 0 if track is None else track.next_sequence

    def emit(self, cls: type[msgspec.Struct], response_id: str = RID, **fields: Any) -> Any:
        """Build a server event of ``cls`` for ``response_id`` with the next sequence number."""
        fields.setdefault("sequence_number", self.next_sequence(response_id))
        if "response" in cls.__struct_fields__:
            fields.setdefault("response", response(response_id))
        else:
            fields.setdefault("response_id", response_id)
        return cls(**fields)

    def serve(self, cls: type[msgspec.Struct], response_id: str = RID, **fields: Any) -> None:
        self.send(Role.SERVER, self.emit(cls, response_id, **fields))

    def start(self, response_id: str = RID, status: str = "in_progress") -> None:
        self.serve(ResponseCreated, response_id, response=response(response_id, status))
        if status == "in_progress":
            self.serve(ResponseInProgress, response_id)

    def call(self, call_id: str, response_id: str = RID) -> None:
        """The model's tool call, streamed the shipped way."""
        index = next(self._ids)
        item = function_call(call_id)
        item_id = f"fc_{call_id}"
        self.serve(OutputItemAdded, response_id, output_index=index, item=item)
        self.serve(
            FunctionCallArgumentsDelta, response_id, item_id=item_id, output_index=index, delta="{"
        )
        self.serve(
            FunctionCallArgumentsDone,
            response_id,
            item_id=item_id,
            output_index=index,
            name="add",
            arguments='{"a": 1}',
        )
        self.serve(OutputItemDone, response_id, output_index=index, item=item)

    def pause(self, *call_ids: str, response_id: str = RID) -> None:
        action = RequiredAction(call_ids=list(call_ids))
        done = response(response_id, "requires_action", required_action=action)
        self.serve(ResponseDone, response_id, response=done)

    def resume(self, response_id: str = RID) -> None:
        self.serve(ResponseInProgress, response_id)

    def finish(self, status: str = "completed", response_id: str = RID) -> None:
        self.serve(ResponseDone, response_id, response=response(response_id, status))

    def state(self, response_id: str = RID) -> ResponseState:
        track = self.client.response(response_id)
        assert track is not None
        return track.state

    def assert_rejected(
        self, role: Role, event: Any, *, code: str, param: str | None, status: int = 400
    ) -> None:
        """``event`` is refused by ``role``'s send and by the peer's receive, alike."""
        sender, receiver = self.ends(role)
        before = snapshot(sender), snapshot(receiver)
        with pytest.raises(LocalProtocolError) as local:
            sender.send(event)
        with pytest.raises(RemoteProtocolError) as remote:
            receiver.receive_message(encode_event(event))
        for exc in (local.value, remote.value):
            assert (exc.code, exc.param, exc.status) == (code, param, status), repr(exc)
        assert remote.value.message == local.value.message
        assert (snapshot(sender), snapshot(receiver)) == before
