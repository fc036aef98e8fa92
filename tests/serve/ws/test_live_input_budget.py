"""The byte budget of input held by a live response (issue 28, item 6), against
a real server on loopback.

Input sent into a live response waits until the model takes it in: appends
and injects in the rollout's inbox, steers queued for a successor. Each
message's bytes are held in ``longresponse.serve.input_budget`` per response
(``--max-live-input-bytes``) and per API key across its connections
(``--max-live-input-bytes-per-key``); a message past either is refused
``input_budget_exceeded`` (a steer: ``response.steer.failed``
``too_many_pending_steers``), nothing accepted before is lost, the
connection stays usable, and the bytes come back as the input is read or
its connection ends. Small budgets make each case a few kilobytes.

Append mode has no receipt for an append: a ``response.cancel`` naming no
response (answered ``response_not_found``) marks that the messages before it
were read, in order, so the tests never wait on a clock.
"""

from __future__ import annotations

import json
from typing import Any, Final

import pytest
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from protocol import APPEND_SUBPROTOCOL
from tests.support.waiting import wait_for

#: Each message brings a little over this many bytes of text.
TEXT: Final = 4000
#: Room for two such messages in a response, three in a key.
PER_RESPONSE: Final = 10_000
PER_KEY: Final = 14_000
BUDGETS: Final = {"max_live_input_bytes": PER_RESPONSE, "max_live_input_bytes_per_key": PER_KEY}
#: The model waits this long before its first token: input sent meanwhile waits.
WAITING: Final = {"sim_tool_calls": "0", "sim_ttft_ms": "600"}
READ_FILE: Final = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def padded(name: str) -> str:
    """A message's text: its name, quoted by the simulated model, then padding."""
    return f"{name} " + "x" * TEXT


def user(name: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": padded(name)}],
        }
    ]


def send(socket: ClientConnection, **event: Any) -> None:
    socket.send(json.dumps(event))


def recv(socket: ClientConnection) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(socket.recv(timeout=30))
    return event


def until(socket: ClientConnection, *types: str) -> list[dict[str, Any]]:
    """Events up to and including the first of ``types``."""
    events = [recv(socket)]
    while events[-1]["type"] not in types:
        events.append(recv(socket))
    return events


def read_so_far(socket: ClientConnection) -> list[dict[str, Any]]:
    """Every event up to the answer to a cancel naming no response: the server has
    read each message sent before it."""
    send(socket, type="response.cancel", response_id="resp_none")
    events = until(socket, "error")
    while events[-1]["error"]["code"] != "response_not_found":
        events += until(socket, "error")
    return events[:-1]


def errors(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event for event in events if event["type"] == "error"]


@pytest.fixture
def keyed(make_server: Any) -> Any:
    return make_server(api_keys=("key-a", "key-b"), **BUDGETS)


def opened(server: Any, key: str | None = None, *, append: bool = True, **headers: str) -> Any:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return ws_connect(
        server.url,
        subprotocols=[APPEND_SUBPROTOCOL] if append else None,  # type: ignore[list-item]
        additional_headers=headers,
        max_size=None,
    )


def waiting_rollout(socket: ClientConnection) -> str:
    """A rollout waiting for its first token; its response id."""
    send(socket, type="response.create", model="sim", input="hello", metadata=WAITING)
    created: dict[str, Any] = until(socket, "response.created")[-1]["response"]
    return str(created["id"])


def said(response: dict[str, Any]) -> str:
    """The text of a response's messages (the simulated model quotes each user message)."""
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


def answer(events: list[dict[str, Any]]) -> str:
    """What an append-mode rollout said, once it completed."""
    done = events[-1]["response"]
    assert done["status"] == "completed", done
    return said(done)


def budget(server: Any) -> Any:
    return server.app.parts.endpoint.turns.input_budget


def all_given_back(server: Any) -> None:
    """Once the server has ended every connection, no input is held."""
    wait_for(lambda: server.live_sessions == 0, "the server to end its connections")
    assert budget(server).total == 0


# --- append mode ----------------------------------------------------------------


@pytest.mark.slow  # its rollouts wait 600 ms for their first token, so that input piles up
def test_appends_past_a_responses_budget_are_refused_and_the_rollout_goes_on(
    make_server: Any,
) -> None:
    server = make_server(**BUDGETS)
    with opened(server) as socket:
        response_id = waiting_rollout(socket)
        for name in ("first", "second", "third"):
            send(socket, type="response.append", response_id=response_id, input=user(name))
        (refused,) = errors(read_so_far(socket))
        assert refused["status"] == 429
        assert refused["error"]["code"] == "input_budget_exceeded"
        assert refused["error"]["param"] == "input"
        assert "--max-live-input-bytes" in refused["error"]["message"]
        assert budget(server).held("") > 2 * TEXT  # the two accepted, until the model reads them
        text = answer(until(socket, "response.done"))
        assert "first" in text
        assert "second" in text  # nothing accepted is lost
        assert "third" not in text
        assert budget(server).held("") == 0  # read: given back
        # The connection is usable, and the budget is the response's again.
        response_id = waiting_rollout(socket)
        send(socket, type="response.append", response_id=response_id, input=user("fourth"))
        assert errors(read_so_far(socket)) == []
        assert "fourth" in answer(until(socket, "response.done"))
    all_given_back(server)


@pytest.mark.slow  # its rollouts wait 600 ms for their first token, so that input piles up
def test_a_keys_budget_is_shared_by_its_connections_and_not_by_another_key(
    keyed: Any,
) -> None:
    with (
        opened(keyed, "key-a") as one,
        opened(keyed, "key-a") as two,
        opened(keyed, "key-b") as other,
    ):
        first, second = waiting_rollout(one), waiting_rollout(two)
        for name in ("one-a", "one-b"):
            send(one, type="response.append", response_id=first, input=user(name))
        assert errors(read_so_far(one)) == []
        for name in ("two-a", "two-b"):  # the response has room for both; the key does not
            send(two, type="response.append", response_id=second, input=user(name))
        (refused,) = errors(read_so_far(two))
        assert refused["error"]["code"] == "input_budget_exceeded"
        assert refused["error"]["param"] == "input"
        assert "--max-live-input-bytes-per-key" in refused["error"]["message"]
        assert budget(keyed).total <= PER_KEY
        # Another key is served meanwhile, within its own budget.
        third = waiting_rollout(other)
        for name in ("b-a", "b-b"):
            send(other, type="response.append", response_id=third, input=user(name))
        assert errors(read_so_far(other)) == []
        assert "b-b" in answer(until(other, "response.done"))
        assert "one-b" in answer(until(one, "response.done"))
        text = answer(until(two, "response.done"))
        assert "two-a" in text
        assert "two-b" not in text
    all_given_back(keyed)


@pytest.mark.slow  # its rollouts wait 600 ms for their first token, so that input piles up
def test_input_held_by_a_paused_rollout_is_given_back_when_its_connection_closes(
    keyed: Any,
) -> None:
    with opened(keyed, "key-a") as socket:
        send(
            socket,
            type="response.create",
            model="sim",
            input="read it",
            tools=[READ_FILE],
            tool_choice="required",
        )
        paused = until(socket, "response.done")[-1]["response"]
        assert paused["status"] == "requires_action"
        # Input beside the call's output waits in the inbox while the call is pending.
        send(socket, type="response.append", response_id=paused["id"], input=user("held"))
        assert errors(read_so_far(socket)) == []
        assert budget(keyed).total > TEXT
    all_given_back(keyed)  # the connection's end gave it back
    with opened(keyed, "key-a") as socket:
        response_id = waiting_rollout(socket)
        for name in ("again-a", "again-b"):
            send(socket, type="response.append", response_id=response_id, input=user(name))
        assert errors(read_so_far(socket)) == []
        assert "again-b" in answer(until(socket, "response.done"))
    all_given_back(keyed)


# --- the shipped shape: steers and multi-agent injects ------------------------


@pytest.mark.slow  # its rollouts wait 600 ms for their first token, so that input piles up
def test_steers_past_a_responses_budget_fail_and_the_accepted_ones_are_committed(
    make_server: Any,
) -> None:
    server = make_server(**BUDGETS)
    with opened(server, append=False) as socket:
        send(socket, type="response.create", model="sim", input="a poem", metadata=WAITING)
        response_id = until(socket, "response.created")[-1]["response"]["id"]
        for name in ("sea", "sky", "sand"):
            send(
                socket, type="response.steer", previous_response_id=response_id, input=padded(name)
            )
        events = until(socket, "response.steer.failed")
        accepted = [e for e in events if e["type"] == "response.steer.accepted"]
        assert len(accepted) == 2
        failed = events[-1]
        assert failed["error"]["code"] == "too_many_pending_steers"
        assert "--max-live-input-bytes" in failed["error"]["message"]
        assert failed["steer"]["input"].startswith("sand ")  # handed back
        assert budget(server).held("") > 2 * TEXT
        until(socket, "response.incomplete")  # steered
        successor = until(socket, "response.created")[-1]["response"]
        assert successor["previous_response_id"] == response_id
        done = until(socket, "response.completed")[-1]["response"]
        text = said(done)
        assert "sea" in text
        assert "sky" in text
        assert "sand" not in text
    all_given_back(server)


def test_injects_past_a_responses_budget_are_refused_and_the_response_goes_on(
    make_server: Any,
) -> None:
    server = make_server(**BUDGETS)
    beta = {"OpenAI-Beta": "responses_multi_agent=v1"}
    with opened(server, append=False, **beta) as socket:
        send(
            socket,
            type="response.create",
            model="sim",
            input="read it",
            tools=[READ_FILE],
            metadata={"sim_tool_calls": "1"},
            multi_agent={"enabled": True},
        )
        events = until(socket, "response.output_item.done")
        response_id = events[0]["response"]["id"]
        call = events[-1]["item"]
        assert call["type"] == "function_call"
        # Injected beside the pending call, the messages wait for its output.
        for name in ("left", "right", "over"):
            send(socket, type="response.inject", response_id=response_id, input=user(name))
        events = until(socket, "error")
        assert [e["type"] for e in events].count("response.inject.created") == 2
        refused = events[-1]
        assert refused["status"] == 429
        assert refused["error"]["code"] == "input_budget_exceeded"
        assert refused["error"]["param"] == "input"
        assert budget(server).held("") > 2 * TEXT
        while True:  # the model calls again after new user input: answer until it is done
            output = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
            send(socket, type="response.inject", response_id=response_id, input=[output])
            last = until(socket, "response.completed", "response.output_item.done")[-1]
            while last["type"] != "response.completed" and last["item"]["type"] != "function_call":
                last = until(socket, "response.completed", "response.output_item.done")[-1]
            if last["type"] == "response.completed":
                break
            call = last["item"]
        done = last["response"]
        text = said(done)
        assert "left" in text
        assert "right" in text
        assert "over" not in text
        assert budget(server).held("") == 0
    all_given_back(server)
