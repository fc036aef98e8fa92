"""A blocking WebSocket peer for the socket fuzz, and what it checks on every frame.

:class:`Peer` wraps the ``websockets`` sync client. :meth:`Peer.settle`
reads until a step is settled (every predicted error seen, every predicted
response created, nothing still running) and fails on an error nobody
predicted, a hang (``STEP_TIMEOUT``) or a close other than the one the step
was meant to cause. :meth:`Peer.check` holds every frame to the invariants of
SPEC §13: a text frame of one JSON object that decodes as a server event of
its mode, ``sequence_number`` 0, 1, 2, ... per response, a code and a status
on every error.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass, field
from typing import Any

import pydantic
from openai.types.responses.responses_server_event import ResponsesServerEvent
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from protocol import decode_server_event
from tests.conftest import RunningServer

__all__ = ["FRAME_TOO_BIG", "SYNC_FRAME", "Expected", "Peer", "Tracked", "healthy", "one"]

#: Seconds a step may take to settle before the fuzz reports the server stuck.
STEP_TIMEOUT = 10.0
#: The close codes a step may end a socket with (SPEC §7): only 1009, here.
FRAME_TOO_BIG = 1009
SDK_EVENT = pydantic.TypeAdapter(ResponsesServerEvent)
#: Each step ends with it: its ``unknown_event_type`` error says the step was read.
SYNC_FRAME = json.dumps({"type": "fuzz.sync"})
#: Lifecycle events: they carry the whole Response.
LIFECYCLE = {
    "response.created",
    "response.in_progress",
    "response.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
}
#: Everything that ends a shipped segment, or stops (pauses or ends) a rollout.
STOPS = {"response.done", "response.completed", "response.incomplete", "response.failed"}

#: One expected error: the codes it may carry (one code, unless the input was random).
Expected = frozenset[str]


def one(code: str) -> Expected:
    return frozenset({code})


def unmatched(seen: list[str], expected: list[Expected]) -> tuple[list[str], list[Expected]]:
    """Pair seen codes with expectations (exact ones first); return what is left of each."""
    left = sorted(expected, key=len)
    extra: list[str] = []
    for code in seen:
        match = next((wanted for wanted in left if code in wanted), None)
        if match is None:
            extra.append(code)
        else:
            left.remove(match)
    return extra, left


@dataclass
class Tracked:
    """One response as the frames show it."""

    lane: str | None
    status: str = "in_progress"
    stops: int = 0
    next_sequence: int = 0
    #: Append mode: the calls the latest pause asks for. Shipped: the segment's calls.
    calls: list[str] = field(default_factory=list)


class Peer:
    """A blocking WebSocket client that checks every frame the server sends."""

    def __init__(self, server: RunningServer, *, append: bool) -> None:
        self.append = append
        self.socket: ClientConnection = connect(
            server.url,
            subprotocols=["longresponse.append.v1"] if append else None,  # type: ignore[list-item]
            max_size=None,
            open_timeout=10,
        )
        self.responses: dict[str, Tracked] = {}
        self.order: list[str] = []
        self.lane_current: dict[str | None, str] = {}
        self.errors: list[str] = []
        self.close_code: int | None = None

    def close(self) -> None:
        self.socket.close()

    def send(self, frame: str | bytes) -> None:
        self.socket.send(frame)

    def settle(
        self,
        expected: list[Expected],
        created: int,
        resumed: tuple[str, ...] = (),
        *,
        closes: bool = False,
        ended: bool = False,
    ) -> list[str]:
        """Read until the step is settled; return the ids of the responses it created.

        ``ended``: the responses the step creates must reach a terminal status
        (not just a pause).
        """
        first_new = len(self.order)
        stops_before = {rid: self.responses[rid].stops for rid in resumed}
        self.errors = []
        wanted = [*expected, one("unknown_event_type")]  # the sync frame's answer

        def settled() -> bool:
            _, missing = unmatched(self.errors, wanted)
            return (
                not missing
                and len(self.order) - first_new >= created
                and all(self.responses[rid].stops > stops_before[rid] for rid in resumed)
                and all(tracked.status != "in_progress" for tracked in self.responses.values())
                and not (
                    ended
                    and any(
                        self.responses[r].status == "requires_action"
                        for r in self.order[first_new:]
                    )
                )
            )

        while not settled():
            try:
                frame = self.socket.recv(timeout=STEP_TIMEOUT)
            except TimeoutError:
                raise AssertionError(
                    f"stuck: errors {self.errors}, wanted {wanted}, "
                    f"created {len(self.order) - first_new} of {created}, "
                    f"states {[(r, t.status) for r, t in self.responses.items()]}"
                ) from None
            except ConnectionClosed as closed:
                self.close_code = closed.rcvd.code if closed.rcvd else None
                assert closes, f"the socket closed ({self.close_code}) on a step that keeps it"
                assert self.close_code == FRAME_TOO_BIG
                return []
            self.check(frame)
        assert not closes, "the step should have closed the socket"
        extra, _ = unmatched(self.errors, wanted)
        assert not extra, f"errors nobody predicted: {extra} (wanted {wanted})"
        new = self.order[first_new:]
        assert len(new) == created, f"created {len(new)} responses, expected {created}"
        return new

    def check(self, frame: str | bytes) -> None:
        """The per-frame invariants; records what the frame says about its response."""
        assert isinstance(frame, str), "the server sends text frames only"
        event = json.loads(frame)
        assert isinstance(event, dict), frame
        assert isinstance(event.get("type"), str), frame
        if self.append:
            decode_server_event(frame)
        else:
            SDK_EVENT.validate_python(event)
        kind = event["type"]
        if kind == "error":
            code = event["error"]["code"]
            assert isinstance(code, str), frame
            assert code, frame
            assert isinstance(event["status"], int), frame
            # Outside every response's stream: the named response's next
            # number, not used up, or 0 when it names none (SPEC §5 `error`).
            named = self.responses.get(event.get("response_id", ""))
            assert event["sequence_number"] == (named.next_sequence if named else 0), frame
            assert event["error"]["headers"]["x-request-id"].startswith("req_"), frame
            self.errors.append(code)
            return
        if kind == "responsesapi.websocket_timing":
            return
        tracked = self.response_of(event)
        assert event["sequence_number"] == tracked.next_sequence, (
            f"sequence {event['sequence_number']} after {tracked.next_sequence - 1}: {kind}"
        )
        tracked.next_sequence += 1
        if kind not in LIFECYCLE:
            return
        response = event["response"]
        tracked.status = response["status"]
        if kind in STOPS:
            tracked.stops += 1
            if self.append:
                action = response.get("required_action") or {}
                tracked.calls = list(action.get("call_ids", []))
            else:
                tracked.calls = [
                    item["call_id"]
                    for item in response["output"]
                    if item["type"] == "function_call"
                ]

    def response_of(self, event: dict[str, Any]) -> Tracked:
        lane = event.get("stream_id")
        if event["type"] in LIFECYCLE:
            rid = event["response"]["id"]
            if event["type"] == "response.created":
                assert rid not in self.responses, f"{rid} created twice"
                self.responses[rid] = Tracked(lane=lane)
                self.order.append(rid)
                self.lane_current[lane] = rid
        elif self.append:
            rid = event["response_id"]
        else:
            rid = self.lane_current[lane]  # lanes run one response at a time (§10.8)
        tracked = self.responses[rid]
        assert tracked.lane == lane, f"{event['type']} of {rid} on lane {lane}, not {tracked.lane}"
        return tracked


def healthy(server: RunningServer) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    finally:
        connection.close()
