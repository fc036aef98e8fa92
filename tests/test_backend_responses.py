"""The Responses backends end to end: a gateway in front of a second real longresponse.

The gateway runs in-thread (``make_server(backends=...)``); the upstream is
``longresponse serve`` in a child process (:class:`ServerProcess`), reached
over loopback by HTTP (``kind="responses"``) or its WebSocket mode
(``kind="responses-ws"``). What the upstream did is read on its side: its
``/metrics`` (the pipeline validates and classifies only the items a request
sends, so chaining shows as fewer items), its stored responses, its sockets.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from longresponse.client import connect
from longresponse.config import BackendConfig
from longresponse.server_process import ServerProcess
from protocol.events import OutputItemDone, ResponseDone
from protocol.items import FunctionCall, Message, OutputText
from tests.conftest import openai_client

KINDS = ("responses", "responses-ws")
TOOL = {
    "type": "function",
    "name": "read_file",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}
FAST = ("--store", "memory://", "--sim-tokens-per-second", "0")


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServerProcess]:
    """The engine behind the gateway: a longresponse process with a short window."""
    with ServerProcess(*FAST, "--sim-context-window", "4000") as process:
        yield process


def backend(upstream: ServerProcess, kind: str, **fields: Any) -> BackendConfig:
    config = BackendConfig(
        name="up",
        kind=kind,
        base_url=f"{upstream.http_url}/v1",
        upstream_model="sim",
        max_retries=0,
    )
    return dataclasses.replace(config, **fields)


def work(upstream: ServerProcess) -> dict[str, int]:
    """The upstream's pipeline counters (items it validated and classified)."""
    text = httpx.get(f"{upstream.http_url}/metrics").text
    found = re.findall(r'longresponse_pipeline_work_total\{kind="(\w+)"\} ([0-9.e+]+)', text)
    return {kind: int(float(value)) for kind, value in found}


def get_json(url: str) -> Any:
    return httpx.get(url).json()


def text_of(item: Any) -> str:
    assert isinstance(item, Message)
    assert isinstance(item.content, list)
    part = item.content[0]
    assert isinstance(part, OutputText)
    return part.text


async def append_rollout(url: str, calls: int, **create: Any) -> list[ResponseDone]:
    """An append-mode rollout of ``calls`` tool calls, each answered; its ``response.done``s."""
    dones: list[ResponseDone] = []
    async with connect(url) as client:
        await client.create(
            model="up",
            input="Which file holds the bug?",
            tools=[TOOL],
            metadata={"sim_tool_calls": str(calls)},
            **create,
        )
        while True:
            events = await client.until_done()
            done = events[-1]
            assert isinstance(done, ResponseDone), events
            dones.append(done)
            if done.response.status != "requires_action":
                return dones
            calls_made = [
                e.item
                for e in events
                if isinstance(e, OutputItemDone) and isinstance(e.item, FunctionCall)
            ]
            await client.append(
                [
                    {"type": "function_call_output", "call_id": c.call_id, "output": f"output {n}"}
                    for n, c in enumerate(calls_made, start=len(dones))
                ]
            )


def upstream_chain(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, int]]:
    """(upstream response id, the id it continued, items sent) of each turn, from
    the backends' debug log."""
    found = []
    for record in caplog.records:
        if record.name.startswith("longresponse.backends") and record.msg.startswith("upstream"):
            response_id, previous, sent = record.args  # type: ignore[misc]
            found.append((response_id, previous, sent))
    return found


@pytest.mark.parametrize("kind", KINDS)
async def test_append_rollout_continues_the_upstream_chain(
    make_server: Any, upstream: ServerProcess, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="longresponse.backends")
    gateway = make_server(backends=(backend(upstream, kind, upstream_store=True),))
    before = work(upstream)
    dones = await append_rollout(gateway.url, 3)
    after = work(upstream)
    assert [d.response.status for d in dones] == ["requires_action"] * 3 + ["completed"]
    assert len({d.response.id for d in dones}) == 1
    answer = text_of(dones[-1].response.output[-1])
    # The upstream model saw the whole conversation, each item once: the
    # request and every output.
    assert answer.count("Which file holds the bug?") == 1
    for n in (1, 2, 3):
        assert answer.count(f"«output {n}»") == 1
    # Each turn continued the last upstream response with its new items only.
    chain = upstream_chain(caplog)
    assert [sent for _, _, sent in chain] == [1, 1, 1, 1]
    assert [previous for _, previous, _ in chain] == [None, *(r for r, _, _ in chain[:-1])]
    stored = get_json(f"{upstream.http_url}/v1/responses/{chain[-1][0]}")
    assert stored["previous_response_id"] == chain[-2][0]
    if kind == "responses-ws":
        # Continued in place on the upstream socket: only the new items were
        # validated there (over HTTP the upstream hydrates each turn from its store).
        assert after["items_validated"] - before["items_validated"] == 4
    usage = dones[-1].response.usage
    assert usage is not None
    assert usage.input_tokens > 0


# --- the shipped shape at the front: the official SDK ---------------------------------


def sdk(server: Any) -> OpenAI:
    return openai_client(server)  # type: ignore[no-any-return]


def sdk_turn(conn: Any) -> list[Any]:
    """One response's events over the SDK's socket, up to its terminal event (or error)."""
    events = []
    for event in conn:
        events.append(event)
        if event.type in ("response.completed", "response.incomplete", "response.failed", "error"):
            return events
    raise AssertionError("the socket closed mid-response")


def calls_in(output: list[Any]) -> list[Any]:
    return [item for item in output if item.type == "function_call"]


def output_text(response: Any) -> str:
    return str(response.output[-1].content[0].text)


@pytest.mark.parametrize("kind", KINDS)
def test_shipped_websocket_chain_with_the_sdk(
    make_server: Any, upstream: ServerProcess, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="longresponse.backends")
    gateway = make_server(backends=(backend(upstream, kind, upstream_store=True),))
    meta = {"sim_tool_calls": "2"}
    with sdk(gateway).responses.connect() as conn:
        conn.response.create(
            model="up", input="Chain me.", tools=[TOOL], store=False, metadata=meta
        )
        for number in range(3):
            events = sdk_turn(conn)
            response = events[-1].response
            assert events[-1].type == "response.completed"
            calls = calls_in(response.output)
            if number == 2:
                assert not calls
                break
            (call,) = calls
            conn.response.create(
                model="up",
                previous_response_id=response.id,
                input=[{"type": "function_call_output", "call_id": call.call_id,
                        "output": f"sdk output {number}"}],
                tools=[TOOL],
                store=False,
                metadata=meta,
            )  # fmt: skip
    answer = output_text(response)
    assert answer.count("«sdk output 0»") == 1
    assert answer.count("«sdk output 1»") == 1
    # The gateway's rollout lived on its connection, and so did the upstream chain.
    chain = upstream_chain(caplog)
    assert [sent for _, _, sent in chain] == [1, 1, 1]
    assert [previous for _, previous, _ in chain] == [None, chain[0][0], chain[1][0]]
    assert response.usage.input_tokens > 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [False, True])
def test_http_chain_with_the_sdk(
    make_server: Any, upstream: ServerProcess, kind: str, stream: bool
) -> None:
    gateway = make_server(backends=(backend(upstream, kind, upstream_store=True),))
    client = sdk(gateway)
    meta = {"sim_tool_calls": "1"}

    def create(**fields: Any) -> Any:
        if not stream:
            return client.responses.create(model="up", tools=[TOOL], metadata=meta, **fields)
        with client.responses.stream(model="up", tools=[TOOL], metadata=meta, **fields) as events:
            types = [event.type for event in events]
            assert types[0] == "response.created"
            assert types[-1] == "response.completed"
            return events.get_final_response()

    first = create(input="Over HTTP.")
    (call,) = calls_in(first.output)
    second = create(
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "http output"}],
    )
    assert second.status == "completed"
    assert second.previous_response_id == first.id
    answer = output_text(second)
    assert answer.count("«Over HTTP.»") == 1
    assert answer.count("«http output»") == 1


async def test_store_false_sends_the_full_input_each_turn(
    make_server: Any, upstream: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="longresponse.backends")
    gateway = make_server(backends=(backend(upstream, "responses", upstream_store=False),))
    dones = await append_rollout(gateway.url, 2)
    assert dones[-1].response.status == "completed"
    answer = text_of(dones[-1].response.output[-1])
    assert answer.count("«output 1»") == 1
    assert answer.count("«output 2»") == 1
    chain = upstream_chain(caplog)
    # No previous id; the whole context each time (with the calls made so far).
    assert [(previous, sent) for _, previous, sent in chain] == [(None, 1), (None, 3), (None, 5)]
    # store: false upstream: nothing was kept there.
    missing = httpx.get(f"{upstream.http_url}/v1/responses/{chain[-1][0]}")  # noqa: ASYNC210
    assert missing.status_code == 404
