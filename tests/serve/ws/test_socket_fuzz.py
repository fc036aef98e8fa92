"""A stateful fuzz of both WebSocket shapes, over a real socket to a real server.

Hypothesis drives a :class:`~hypothesis.stateful.RuleBasedStateMachine` per
shape against the uvicorn server of ``make_server``, through the blocking
``websockets`` client: creates, appends with right, wrong and duplicate call
ids, cancels (append mode); creates on lanes, continuations with
``previous_response_id`` right and wrong (the shipped shape); and in both,
garbage frames, unknown types, big frames under the message limit, frames
over it (``message_too_large``) and over twice it (close 1009, then a new
connection).

Each step sends its frames, then a sync frame of an unknown type, and reads
until the step is settled: every error the model predicts has arrived, every
response it starts has been created, and no response is still running. The
model predicts the error codes exactly, so an error nobody asked for fails.

Invariants checked on every frame: a text frame of valid JSON; the project's
decoder (append mode) or the official SDK's event union (shipped shape)
accepts it; ``sequence_number`` goes 0, 1, 2, ... per response; every error
has a code and a status. After every step ``/healthz`` answers 200 and the
socket is still open, unless the step was one that must close it with a
documented code. Deterministic: ``derandomize`` and no example database.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from protocol.events import CLIENT_EVENT_TYPES
from tests.conftest import RunningServer
from tests.support.socket_peer import SYNC_FRAME, Expected, Peer, healthy, one

#: A small message limit, so big, too large and far too large frames stay cheap.
MESSAGE_LIMIT = 32 * 1024
#: The live rollouts append mode allows per connection (the server's default).
MAX_ROLLOUTS = 16

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=10,
    stateful_step_count=20,
    suppress_health_check=list(HealthCheck),
)

TOOL = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}

# --- what both shapes share ---------------------------------------------------------

#: Event types no client event has: each gets ``unknown_event_type``.
unknown_types = st.one_of(
    st.sampled_from(["response.steer", "session.update", "response.update", "", "RESPONSE.CREATE"]),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
).filter(lambda name: name not in CLIENT_EVENT_TYPES)
#: Frames that are not a JSON object: ``invalid_json`` or ``invalid_type``.
garbage = st.one_of(
    st.binary(max_size=64),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=64),
    st.sampled_from(["", "{", "[1, 2]", "null", "3", '"text"', "{" * 5000, '{"a": NaN}']),
).filter(lambda frame: not _is_json_object(frame))
NOT_AN_OBJECT = frozenset({"invalid_json", "invalid_type"})


def _is_json_object(frame: str | bytes) -> bool:
    try:
        return isinstance(json.loads(frame), dict)
    except (ValueError, RecursionError):
        return False


def create_body(*, tools: bool, calls: int, parallel: int, big: bool, **extra: Any) -> str:
    text = "fuzz " + ("padding " * 3000 if big else "")  # ~24 KB: big, under the limit
    body: dict[str, Any] = {
        "type": "response.create",
        "model": "sim",
        "input": text,
        "metadata": {"sim_tool_calls": str(calls), "sim_parallel_calls": str(parallel)},
        **extra,
    }
    if tools:
        body["tools"] = [TOOL]
    return json.dumps(body)


def _too_large(size: int) -> str:
    """A create of exactly ``size`` bytes."""
    bare = create_body(tools=False, calls=0, parallel=1, big=False, pad="")
    return create_body(tools=False, calls=0, parallel=1, big=False, pad="z" * (size - len(bare)))


def _bad_field(name: str, value: Any) -> str:
    return create_body(tools=False, calls=0, parallel=1, big=False, **{name: value})


#: A frame either shape refuses with one error (or, ``response.processed``, ignores).
bad_frames: st.SearchStrategy[tuple[str | bytes, Expected | None]] = st.one_of(
    garbage.map(lambda frame: (frame, NOT_AN_OBJECT)),
    unknown_types.map(lambda name: (json.dumps({"type": name}), one("unknown_event_type"))),
    st.just((json.dumps({"input": "x"}), one("missing_required_parameter"))),
    st.just((json.dumps({"type": "response.processed", "response_id": "resp_x"}), None)),
    # Over the limit, not over twice it: refused, the socket stays (SPEC §3).
    st.tuples(st.integers(MESSAGE_LIMIT + 1, 2 * MESSAGE_LIMIT), st.booleans()).map(
        lambda size_binary: (
            _too_large(size_binary[0]).encode() if size_binary[1] else _too_large(size_binary[0]),
            one("message_too_large"),
        )
    ),
    st.sampled_from(
        [
            (_bad_field("temperature", 9), one("invalid_value")),
            (_bad_field("max_output_tokens", 0), one("invalid_value")),
            (_bad_field("top_p", "high"), one("invalid_type")),
            (_bad_field("model", "gpt-fuzz"), one("model_not_found")),
            (_bad_field("metadata", {"sim_tool_calls": "many"}), one("invalid_value")),
            (
                _bad_field("input", [{"type": "message", "role": "robot", "content": "x"}]),
                one("invalid_value"),
            ),
        ]
    ),
)


class SocketFuzz(RuleBasedStateMachine):
    """Rules both shapes answer alike; a subclass adds its shape's own."""

    append = True

    def __init__(self, server: RunningServer) -> None:
        super().__init__()
        self.server = server
        self.peer = Peer(server, append=self.append)
        self.closed = False

    def step(
        self,
        frames: list[str | bytes],
        expected: list[Expected] = (),  # type: ignore[assignment]
        created: int = 0,
        resumed: tuple[str, ...] = (),
        *,
        ended: bool = False,
    ) -> list[str]:
        for frame in frames:
            self.peer.send(frame)
        self.peer.send(SYNC_FRAME)
        return self.peer.settle(list(expected), created, resumed, ended=ended)

    def reconnected(self) -> None:
        """The old socket is gone: forget its responses, open a new one."""
        self.peer.close()
        self.peer = Peer(self.server, append=self.append)

    def teardown(self) -> None:
        self.peer.close()

    @invariant()
    def server_stays_up(self) -> None:
        assert healthy(self.server)

    @rule(bad=bad_frames)
    def bad_frame(self, bad: tuple[str | bytes, Expected | None]) -> None:
        """Input refused as a whole (or, ``response.processed``, ignored): nothing changes."""
        frame, expected = bad
        self.step([frame], [expected] if expected else [])

    @precondition(lambda self: not self.closed)
    @rule()
    def far_too_large(self) -> None:
        """Over twice the limit: uvicorn closes with 1009 (SPEC §3); once per run."""
        self.peer.send("x" * (2 * MESSAGE_LIMIT + 1))
        self.peer.settle([], 0, closes=True)
        self.closed = True
        self.reconnected()


# --- append mode ------------------------------------------------------------------


class AppendFuzz(SocketFuzz):
    """Append mode: rollouts that pause for tool outputs and resume."""

    append = True

    def __init__(self, server: RunningServer) -> None:
        super().__init__(server)
        #: Per response, the calls answered since its latest pause (in order: ids are random,
        #: positions are what hypothesis replays).
        self.answered: dict[str, list[str]] = {}

    def reconnected(self) -> None:
        super().reconnected()
        self.answered = {}

    def live(self) -> int:
        return sum(t.status == "requires_action" for t in self.peer.responses.values())

    def paused(self) -> list[str]:
        return [r for r, t in self.peer.responses.items() if t.status == "requires_action"]

    def finished(self) -> list[str]:
        return [r for r, t in self.peer.responses.items() if t.status != "requires_action"]

    def outstanding(self, rid: str) -> list[str]:
        return [c for c in self.peer.responses[rid].calls if c not in self.answered[rid]]

    def output(self, call_id: str) -> dict[str, str]:
        return {"type": "function_call_output", "call_id": call_id, "output": f"out {call_id}"}

    def append_frame(self, rid: str | None, items: list[dict[str, Any]]) -> str:
        body: dict[str, Any] = {"type": "response.append", "input": items}
        if rid is not None:
            body["response_id"] = rid
        return json.dumps(body)

    @initialize()
    def paused_rollout(self) -> None:
        """Start each run with a rollout paused on two parallel calls."""
        (rid,) = self.step([create_body(tools=True, calls=2, parallel=2, big=False)], created=1)
        self.answered[rid] = []
        assert len(self.peer.responses[rid].calls) == 2

    @rule(
        tools=st.booleans(),
        calls=st.integers(0, 2),
        parallel=st.integers(1, 2),
        big=st.booleans(),
        binary=st.booleans(),
    )
    def create(self, tools: bool, calls: int, parallel: int, big: bool, binary: bool) -> None:
        text = create_body(tools=tools, calls=calls, parallel=parallel, big=big)
        frame = text.encode() if binary else text  # JSON in a binary frame decodes too (§3)
        if self.live() >= MAX_ROLLOUTS:
            self.step([frame], [one("too_many_rollouts")])
            return
        (rid,) = self.step([frame], created=1)
        self.answered[rid] = []
        status = self.peer.responses[rid].status
        assert status == ("requires_action" if tools and calls else "completed"), status

    @precondition(lambda self: self.live() < MAX_ROLLOUTS)
    @rule()
    def create_then_cancel(self) -> None:
        """The cancel (no response_id) targets the create just sent, sampling or paused."""
        frame = create_body(tools=True, calls=2, parallel=1, big=False)
        (rid,) = self.step([frame, json.dumps({"type": "response.cancel"})], created=1, ended=True)
        self.answered[rid] = []
        assert self.peer.responses[rid].status == "cancelled"

    @precondition(lambda self: self.live() < MAX_ROLLOUTS)
    @rule()
    def create_then_steer(self) -> None:
        """A user message right behind the create: steering while it samples, or
        queued once it pauses (§4); either way no error, and it pauses. Then
        it is cancelled."""
        frame = create_body(tools=True, calls=1, parallel=1, big=False)
        steer = self.append_frame(None, [{"type": "message", "role": "user", "content": "hurry"}])
        (rid,) = self.step([frame, steer], created=1)
        self.answered[rid] = []
        assert self.peer.responses[rid].status == "requires_action"
        # Where the message landed decides what the rollout does next (more
        # calls or an answer); end it, so the runs hypothesis replays agree.
        self.step([json.dumps({"type": "response.cancel", "response_id": rid})], resumed=(rid,))
        assert self.peer.responses[rid].status == "cancelled"

    @precondition(lambda self: self.paused())
    @rule(data=st.data(), message=st.booleans(), name_it=st.booleans())
    def answer(self, data: st.DataObject, message: bool, name_it: bool) -> None:
        """Outputs for some or all of a pause's calls; without ``response_id``
        when the target is the latest response announced (§4)."""
        rid = data.draw(st.sampled_from(self.paused()))
        pending = self.outstanding(rid)
        chosen = data.draw(st.lists(st.sampled_from(pending), min_size=1, unique=True))
        items = [self.output(call_id) for call_id in chosen]
        if message:
            items.append({"type": "message", "role": "user", "content": "and also"})
        self.answered[rid].extend(chosen)
        resumes = set(chosen) == set(pending)
        target = rid if name_it or rid != self.peer.order[-1] else None
        self.step([self.append_frame(target, items)], resumed=(rid,) if resumes else ())
        if resumes:
            assert self.peer.responses[rid].status in ("requires_action", "completed")
            self.answered[rid] = []  # a new pause asks for new calls

    @precondition(lambda self: self.paused())
    @rule(data=st.data())
    def wrong_call_id(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self.paused()))
        frame = self.append_frame(rid, [self.output("call_fuzz_nobody")])
        self.step([frame], [one("unknown_call_id")])

    @precondition(lambda self: self.paused())
    @rule(data=st.data())
    def duplicate_call_id(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self.paused()))
        pending = self.outstanding(rid)
        if self.answered[rid] and data.draw(st.booleans()):
            call_id = data.draw(st.sampled_from(self.answered[rid]))
            items = [self.output(call_id)]
        else:
            items = [self.output(pending[0]), self.output(pending[0])]
        self.step([self.append_frame(rid, items)], [one("duplicate_call_id")])

    @precondition(lambda self: self.finished())
    @rule(data=st.data(), cancel=st.booleans())
    def after_the_end(self, data: st.DataObject, cancel: bool) -> None:
        rid = data.draw(st.sampled_from(self.finished()))
        if cancel:
            frame = json.dumps({"type": "response.cancel", "response_id": rid})
        else:
            frame = self.append_frame(rid, [{"type": "message", "role": "user", "content": "x"}])
        self.step([frame], [one("response_already_completed")])

    @rule(cancel=st.booleans())
    def unknown_response(self, cancel: bool) -> None:
        if cancel:
            frame = json.dumps({"type": "response.cancel", "response_id": "resp_fuzz_nobody"})
        else:
            frame = self.append_frame(
                "resp_fuzz_nobody", [{"type": "message", "role": "user", "content": "x"}]
            )
        self.step([frame], [one("response_not_found")])

    @precondition(lambda self: self.paused())
    @rule(data=st.data())
    def cancel_paused(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self.paused()))
        frame = json.dumps({"type": "response.cancel", "response_id": rid})
        self.step([frame], resumed=(rid,))
        assert self.peer.responses[rid].status == "cancelled"


# --- the shipped shape ----------------------------------------------------------------

LANES = st.sampled_from([None, "a", "b.2"])


@dataclass
class Segment:
    """A finished segment a continuation may name."""

    calls: list[str]
    lane: str | None
    #: It and every segment before it in its chain were stored: it hydrates (§10.12).
    stored: bool
    tools: bool


class ShippedFuzz(SocketFuzz):
    """The shipped shape: segments chained with previous_response_id, lanes, the store."""

    append = False

    def __init__(self, server: RunningServer) -> None:
        super().__init__(server)
        self.segments: dict[str, Segment] = {}

    def reconnected(self) -> None:
        super().reconnected()
        # The connection cache is gone; stored segments hydrate on the new socket.
        self.segments = {rid: s for rid, s in self.segments.items() if s.stored}

    def remember(self, rid: str, *, lane: str | None, stored: bool, tools: bool) -> None:
        tracked = self.peer.responses[rid]
        assert tracked.status == "completed", tracked.status
        self.segments[rid] = Segment(tracked.calls, lane, stored, tools)

    def create_frame(
        self,
        lane: str | None,
        *,
        tools: bool,
        calls: int,
        store: bool,
        big: bool = False,
        **extra: Any,
    ) -> str:
        if lane is not None:
            extra["stream_id"] = lane
        return create_body(tools=tools, calls=calls, parallel=1, big=big, store=store, **extra)

    @initialize()
    def first_segment(self) -> None:
        """Start each run with a stored segment that ends in a call."""
        (rid,) = self.step([self.create_frame(None, tools=True, calls=1, store=True)], created=1)
        self.remember(rid, lane=None, stored=True, tools=True)
        assert len(self.segments[rid].calls) == 1

    @rule(
        lane=LANES,
        tools=st.booleans(),
        calls=st.integers(0, 2),
        store=st.booleans(),
        big=st.booleans(),
    )
    def create(self, lane: str | None, tools: bool, calls: int, store: bool, big: bool) -> None:
        frame = self.create_frame(lane, tools=tools, calls=calls, store=store, big=big)
        (rid,) = self.step([frame], created=1)
        self.remember(rid, lane=lane, stored=store, tools=tools)

    @rule()
    def two_lanes(self) -> None:
        """Two creates on two lanes at once: their events interleave."""
        frames: list[str | bytes] = [
            self.create_frame(lane, tools=True, calls=1, store=True) for lane in ("a", "b.2")
        ]
        for rid in self.step(frames, created=2):
            self.remember(rid, lane=self.peer.responses[rid].lane, stored=True, tools=True)

    def continuation(
        self, rid: str, lane: str | None, items: list[dict[str, Any]], store: bool = True
    ) -> str:
        parent = self.segments[rid]
        return self.create_frame(
            lane, tools=parent.tools, calls=1, store=store, previous_response_id=rid, input=items
        )

    def outputs(self, rid: str) -> list[dict[str, Any]]:
        return [
            {"type": "function_call_output", "call_id": call_id, "output": f"out {call_id}"}
            for call_id in self.segments[rid].calls
        ]

    @precondition(lambda self: self.segments)
    @rule(data=st.data(), lane=LANES, store=st.booleans())
    def continue_(self, data: st.DataObject, lane: str | None, store: bool) -> None:
        rid = data.draw(st.sampled_from(list(self.segments)))
        items = [*self.outputs(rid), {"type": "message", "role": "user", "content": "go on"}]
        (new,) = self.step([self.continuation(rid, lane, items, store)], created=1)
        parent = self.segments[rid]
        self.remember(new, lane=lane, stored=store and parent.stored, tools=parent.tools)

    def refused_continuation(self, rid: str, lane: str | None, code: str, items: list[Any]) -> None:
        self.step([self.continuation(rid, lane, items)], [one(code)])
        parent = self.segments[rid]
        if parent.lane == lane and not parent.stored:
            del self.segments[rid]  # evicted from the connection cache (§10.6)

    @precondition(lambda self: any(s.calls for s in self.segments.values()))
    @rule(data=st.data(), lane=LANES)
    def missing_output(self, data: st.DataObject, lane: str | None) -> None:
        rid = data.draw(st.sampled_from([r for r, s in self.segments.items() if s.calls]))
        items = [{"type": "message", "role": "user", "content": "no outputs"}]
        self.refused_continuation(rid, lane, "missing_tool_output", items)

    @precondition(lambda self: self.segments)
    @rule(data=st.data(), lane=LANES)
    def wrong_call_id(self, data: st.DataObject, lane: str | None) -> None:
        rid = data.draw(st.sampled_from(list(self.segments)))
        wrong = {"type": "function_call_output", "call_id": "call_fuzz_nobody", "output": "?"}
        self.refused_continuation(rid, lane, "unknown_call_id", [*self.outputs(rid), wrong])

    @rule(lane=LANES)
    def unknown_previous(self, lane: str | None) -> None:
        frame = self.create_frame(
            lane, tools=False, calls=0, store=True, previous_response_id="resp_fuzz_nobody"
        )
        self.step([frame], [one("previous_response_not_found")])

    @rule(
        bad=st.one_of(
            st.sampled_from(["", "bad lane", "x" * 257, "é"]).map(
                lambda lane: (_bad_field("stream_id", lane), "invalid_stream_id")
            ),
            st.sampled_from(["response.append", "response.cancel", "response.inject"]).map(
                lambda kind: (
                    json.dumps({"type": kind, "response_id": "resp_x", "input": []}),
                    "unknown_event_type",
                )
            ),
        )
    )
    def shipped_bad_frame(self, bad: tuple[str, str]) -> None:
        """A bad lane name; an append-mode event (no beta header: inject too)."""
        frame, code = bad
        self.step([frame], [one(code)])


# --- the tests ------------------------------------------------------------------------


def fuzz(machine: Callable[[RunningServer], SocketFuzz], make_server: Any) -> None:
    server = make_server(max_message_bytes=MESSAGE_LIMIT)
    run_state_machine_as_test(lambda: machine(server), settings=FUZZ)
    assert healthy(server)


@pytest.mark.slow  # hypothesis's examples, each over a real socket
def test_append_mode_over_a_real_socket(make_server: Any) -> None:
    fuzz(AppendFuzz, make_server)


@pytest.mark.slow  # hypothesis's examples, each over a real socket
def test_shipped_shape_over_a_real_socket(make_server: Any) -> None:
    fuzz(ShippedFuzz, make_server)
