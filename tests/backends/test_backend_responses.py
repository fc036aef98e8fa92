"""The Responses backends end to end: a gateway in front of a second real longresponse.

The gateway runs in-thread (``make_server(backends=...)``); the upstream is
``longresponse serve`` in a child process (:class:`ServerProcess`), reached
over loopback by HTTP (``kind="responses"``) or its WebSocket mode
(``kind="responses-ws"``). What the upstream did is read on its side: its
``/metrics`` (the pipeline validates and classifies only the items a request
sends, so chaining shows as fewer items), its stored responses, its sockets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from longresponse.backends.responses_http import ResponsesBackend, retry_wait
from longresponse.backends.responses_wire import (
    Reasoned,
    TurnReader,
    decode_event,
    refused,
    upstream_input,
)
from longresponse.backends.responses_ws import ResponsesWSBackend
from longresponse.client import connect
from longresponse.config import BackendConfig
from longresponse.engine.sampling import (
    ArgumentsDelta,
    ItemEnd,
    SampleRequest,
    Stop,
    TextDelta,
    ToolCallStart,
    UpstreamError,
    Usage,
)
from longresponse.server_process import ServerProcess, free_port
from protocol.events import OutputItemDone, OutputTextDelta, ResponseDone
from protocol.items import FunctionCall, Message, OutputText
from tests.support.http_clients import openai_client
from tests.support.scripted_engine import CLOSE, STALL, ScriptedEngine, sse
from tests.support.shipped_ws import sdk_turn
from tests.support.waiting import wait_for, wait_until

#: an upstream longresponse process per test, and its deadlines.
pytestmark = pytest.mark.slow

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


def backend(upstream: Any, kind: str, **fields: Any) -> BackendConfig:
    """The gateway's model ``up``: ``sim`` on ``upstream`` (a process, or in-thread)."""
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
    with openai_client(gateway).responses.connect() as conn:
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
    client = openai_client(gateway)
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


# --- failures: each one made real against the upstream --------------------------------


def failure_of(events: list[Any]) -> tuple[str, str]:
    """(code, message) of a response that failed, as the shipped shape reports it."""
    last = events[-1]
    if last.type == "error":
        return last.error.code, last.error.message
    assert last.type == "response.failed", [e.type for e in events]
    assert last.response.error is not None
    return last.response.error.code, last.response.error.message


def failed_turn(gateway: Any, **create: Any) -> tuple[str, str]:
    """One shipped-shape turn over the SDK's socket that must fail; the connection
    stays usable (a second request is answered)."""
    create.setdefault("input", "hello")
    with openai_client(gateway).responses.connect() as conn:
        conn.response.create(model="up", store=False, **create)
        found = failure_of(sdk_turn(conn))
        conn.response.create(model="sim", input="still there?", store=False)
        assert sdk_turn(conn)[-1].type == "response.completed"
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_nothing_listening_is_upstream_unavailable(make_server: Any, kind: str) -> None:
    dead = BackendConfig(
        name="up", kind=kind, base_url=f"http://127.0.0.1:{free_port()}/v1", max_retries=1,
        retry_backoff=0.01,
    )  # fmt: skip
    gateway = make_server(backends=(dead,))
    code, message = failed_turn(gateway)
    assert code == "upstream_unavailable"
    assert "could not be reached" in message


@pytest.mark.parametrize("kind", KINDS)
def test_an_upstream_without_the_model_is_upstream_unavailable(
    make_server: Any, upstream: ServerProcess, kind: str
) -> None:
    # The client asked for a model the gateway serves: the backend's upstream
    # model name is wrong, which is the server's fault (502), not a 404 to the client.
    gateway = make_server(backends=(backend(upstream, kind, upstream_model="no-such-model"),))
    code, message = failed_turn(gateway)
    assert code == "upstream_unavailable"
    assert "does not serve" in message
    assert "no-such-model" in message


@pytest.mark.parametrize("kind", KINDS)
def test_context_too_long_upstream(make_server: Any, upstream: ServerProcess, kind: str) -> None:
    gateway = make_server(backends=(backend(upstream, kind),))  # its own window is 128k
    code, message = failed_turn(gateway, input="word " * 5000)  # the upstream's is 4000
    assert code == "context_length_exceeded"
    assert "4000" in message


KEY_ENV = "LONGRESPONSE_TEST_UPSTREAM_KEY"
UPSTREAM_KEY = "sk-upstream-test-key-0123456789"


@pytest.fixture(scope="module")
def strict_upstream() -> Iterator[ServerProcess]:
    """An upstream that wants an API key and refuses secrets in input."""
    with ServerProcess(*FAST, "--api-key", UPSTREAM_KEY, "--secrets-policy", "refuse") as up:
        yield up


@pytest.mark.parametrize("kind", KINDS)
def test_an_upstream_refusal_keeps_its_code(
    make_server: Any, strict_upstream: ServerProcess, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, UPSTREAM_KEY)
    gateway = make_server(backends=(backend(strict_upstream, kind, api_key_env=KEY_ENV),))
    # The key is accepted: a plain turn works.
    with openai_client(gateway).responses.connect() as conn:
        conn.response.create(model="up", input="hello", store=False)
        assert sdk_turn(conn)[-1].type == "response.completed"
    # The gateway flags secrets (its default); the upstream refuses them (400,
    # secret_detected, param input[0]): the client gets the upstream's code.
    token = "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dF3hJ5"
    code, message = failed_turn(gateway, input=f"my token is {token}")
    assert code == "secret_detected"
    assert "looks like a secret" in message


@pytest.mark.parametrize("kind", KINDS)
def test_refused_credentials_never_show_the_key(
    make_server: Any,
    strict_upstream: ServerProcess,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, the HTTP and WebSocket libraries too
    wrong = "sk-wrong-key-that-must-not-leak-42"
    monkeypatch.setenv(KEY_ENV, wrong)
    gateway = make_server(backends=(backend(strict_upstream, kind, api_key_env=KEY_ENV),))
    code, message = failed_turn(gateway)
    assert code == "upstream_unavailable"
    assert "refused this server's credentials (HTTP 401)" in message
    assert wrong not in message
    assert wrong not in caplog.text
    assert caplog.records  # the libraries did log at DEBUG: the check above read them


@pytest.mark.parametrize("kind", KINDS)
def test_killing_the_upstream_mid_stream_is_upstream_unavailable(
    make_server: Any, kind: str
) -> None:
    with ServerProcess(*FAST) as doomed:
        gateway = make_server(backends=(backend(doomed, kind),))
        meta = {"sim_tool_calls": "0", "sim_output_tokens": "20000", "sim_tokens_per_second": "200"}
        with openai_client(gateway).responses.connect() as conn:
            conn.response.create(model="up", input="Talk a lot.", store=False, metadata=meta)
            for event in conn:  # up to the first output the client sees
                if event.type == "response.output_text.delta":
                    break
            assert doomed.process is not None
            doomed.process.kill()
            doomed.process.wait()
            code, _ = failure_of(sdk_turn(conn))
            assert code == "upstream_unavailable"
            conn.response.create(model="sim", input="still there?", store=False)
            assert sdk_turn(conn)[-1].type == "response.completed"


# --- the upstream socket's life (kind responses-ws; the upstream in-thread, to count
# --- its live sessions) ---------------------------------------------------------------


async def test_one_upstream_socket_per_rollout_closed_when_it_ends(make_server: Any) -> None:
    upstream = make_server()
    gateway = make_server(backends=(backend(upstream, "responses-ws"),))
    async with connect(gateway.url) as client:
        await client.create(model="up", input="go", tools=[TOOL], metadata={"sim_tool_calls": "2"})
        for turn in range(2):
            events = await client.until_done()
            done = events[-1]
            assert isinstance(done, ResponseDone)
            assert done.response.status == "requires_action"
            # Paused while the client runs its tool: the socket stays open, one only.
            assert upstream.live_sessions == 1
            (call,) = [
                e.item for e in events
                if isinstance(e, OutputItemDone) and isinstance(e.item, FunctionCall)
            ]  # fmt: skip
            await client.append(
                [{"type": "function_call_output", "call_id": call.call_id, "output": f"o{turn}"}]
            )
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"
        # The rollout ended: its upstream socket is closed, the connection still open.
        await wait_until(lambda: upstream.live_sessions == 0, "the upstream's session to end")
        assert gateway.live_sessions == 1


def test_shipped_connection_holds_the_socket_until_it_closes(make_server: Any) -> None:
    upstream = make_server()
    gateway = make_server(backends=(backend(upstream, "responses-ws"),))
    with openai_client(gateway).responses.connect() as conn:
        conn.response.create(model="up", input="first", store=False)
        first = sdk_turn(conn)[-1].response
        assert upstream.live_sessions == 1  # kept for the next segment of the rollout
        conn.response.create(model="up", input="second", previous_response_id=first.id, store=False)
        second = sdk_turn(conn)[-1].response
        assert second.status == "completed"
        assert upstream.live_sessions == 1
    wait_for(lambda: upstream.live_sessions == 0, "the upstream's session to end", 5)


async def test_cancel_closes_the_upstream_socket_at_once(make_server: Any) -> None:
    upstream = make_server()
    gateway = make_server(backends=(backend(upstream, "responses-ws"),))
    meta = {"sim_tool_calls": "0", "sim_output_tokens": "100000", "sim_tokens_per_second": "100"}
    async with connect(gateway.url) as client:
        await client.create(model="up", input="Talk for a long time.", metadata=meta)
        while not isinstance(await client.next_event(), OutputTextDelta):
            pass
        assert upstream.live_sessions == 1
        await client.cancel()
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "cancelled"
        # The upstream saw its client go (its turn would have run for minutes).
        await wait_until(
            lambda: upstream.live_sessions == 0, "the upstream's session to end", seconds=2.0
        )


async def test_a_socket_the_upstream_closed_is_reopened_with_full_input(
    make_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="longresponse.backends")
    upstream = make_server(connection_lifetime=1.0)  # its "60-minute" limit, shortened
    gateway = make_server(backends=(backend(upstream, "responses-ws"),))
    async with connect(gateway.url) as client:
        await client.create(model="up", input="go", tools=[TOOL], metadata={"sim_tool_calls": "1"})
        events = await client.until_done()
        (call,) = [
            e.item
            for e in events
            if isinstance(e, OutputItemDone) and isinstance(e.item, FunctionCall)
        ]
        # The tool takes longer than the upstream lets a socket live.
        await wait_until(lambda: upstream.live_sessions == 0, "the upstream's session to end")
        await client.append(
            [{"type": "function_call_output", "call_id": call.call_id, "output": "late"}]
        )
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"
        assert "«late»" in text_of(done.response.output[-1])
    chain = upstream_chain(caplog)
    # The second turn went on a new socket, with the whole context and no previous id.
    assert [(previous, sent) for _, previous, sent in chain] == [(None, 1), (None, 3)]


# --- when the chain cannot go on ------------------------------------------------------


async def test_an_upstream_that_forgot_the_chain_gets_the_full_input(
    make_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="longresponse.backends")
    first = ServerProcess(*FAST).start()  # its store is memory: a restart forgets it
    try:
        gateway = make_server(backends=(backend(first, "responses", upstream_store=True),))
        async with connect(gateway.url) as client:
            await client.create(
                model="up", input="go", tools=[TOOL], metadata={"sim_tool_calls": "1"}
            )
            events = await client.until_done()
            (call,) = [
                e.item
                for e in events
                if isinstance(e, OutputItemDone) and isinstance(e.item, FunctionCall)
            ]
            first.stop()
            with ServerProcess(*FAST, port=first.port):
                output = {"type": "function_call_output", "call_id": call.call_id, "output": "o"}
                await client.append([output])
                done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"
        assert "«go»" in text_of(done.response.output[-1])
    finally:
        first.stop()
    chain = upstream_chain(caplog)
    # previous_response_not_found from the new process: the turn was sent again, whole.
    assert [(previous, sent) for _, previous, sent in chain] == [(None, 1), (None, 3)]


async def test_a_truncated_context_is_sent_whole(
    make_server: Any, upstream: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="longresponse.backends")
    # The gateway's own window is small: truncation=auto drops the oldest items.
    # It holds the four calls and their outputs but not the long task before
    # them too, so the fifth turn drops the task; the sim still sees its four
    # calls and answers (a window too small for them would call forever).
    config = backend(upstream, "responses", upstream_store=True, context_window=800)
    gateway = make_server(backends=(config,))
    dones: list[ResponseDone] = []
    async with connect(gateway.url) as client:
        await client.create(
            model="up",
            input="go " + "please " * 150,
            tools=[TOOL],
            truncation="auto",
            metadata={"sim_tool_calls": "4"},
        )
        while True:
            events = await client.until_done()
            done = events[-1]
            assert isinstance(done, ResponseDone)
            dones.append(done)
            if done.response.status != "requires_action":
                break
            (call,) = [
                e.item
                for e in events
                if isinstance(e, OutputItemDone) and isinstance(e.item, FunctionCall)
            ]
            long_output = f"output {len(dones)} " + "lorem ipsum " * 60
            await client.append(
                [{"type": "function_call_output", "call_id": call.call_id, "output": long_output}]
            )
    assert dones[-1].response.status == "completed"
    chain = upstream_chain(caplog)
    assert len(chain) == len(dones)
    # Turn 2 continued the chain; once items were dropped, the prefix was not the
    # one sent, so those turns went without a previous id and with every item kept.
    assert chain[1][1] == chain[0][0]
    assert chain[1][2] == 1
    cut = [(previous, sent) for _, previous, sent in chain[2:] if previous is None]
    assert cut
    assert all(sent > 1 for _, sent in cut)


# --- the mapping of refusals that the upstream longresponse never makes (pure) ---------


@pytest.mark.parametrize(
    ("status", "error", "retry_after", "expected"),
    [
        (429, {"code": "rate_limit_exceeded", "message": "slow down"}, "7",
         ("rate_limit_exceeded", 429, None, 7.0, "slow down")),
        (429, None, None, ("rate_limit_exceeded", 429, None, None, "rate limiting")),
        (403, {"code": "forbidden", "message": "key sk-abc is revoked"}, None,
         ("upstream_unavailable", 502, None, None, "refused this server's credentials")),
        (503, {"message": "overloaded"}, None,
         ("upstream_unavailable", 502, None, None, "overloaded")),
        (400, {"code": "invalid_value", "message": "bad", "param": "tools[0].parameters"}, None,
         ("invalid_value", 400, "tools[0].parameters", None, "bad")),
        (400, {"message": "no code"}, None,
         ("invalid_request_error", 400, None, None, "no code")),
        (404, {"code": "previous_response_not_found", "message": "gone",
               "param": "previous_response_id"}, None,
         ("previous_response_not_found", 400, "previous_response_id", None, "gone")),
    ],
)  # fmt: skip
def test_refusals_map_to_shipped_codes(
    status: int, error: dict[str, str] | None, retry_after: str | None, expected: tuple[Any, ...]
) -> None:
    exc = refused(status, {"error": error} if error else None, retry_after)
    code, http_status, param, hint, words = expected
    assert (exc.code, exc.status, exc.param, exc.retry_after) == (code, http_status, param, hint)
    assert words in exc.message
    assert "sk-abc" not in exc.message  # a refusal of credentials is worded here


def test_retries_wait_with_backoff_and_honour_retry_after() -> None:
    config = BackendConfig(name="m", kind="responses", base_url="http://h/v1", max_retries=2)
    down = UpstreamError("down")
    assert [retry_wait(config, down, attempt) for attempt in range(3)] == [0.25, 0.5, None]
    assert retry_wait(config, refused(429, None, "3"), 0) == 3.0
    assert retry_wait(config, refused(429, None, "3600"), 0) is None  # too long: report it
    assert retry_wait(config, UpstreamError("cut", output_started=True), 0) is None
    assert retry_wait(config, refused(400, None), 0) is None


def test_switching_models_releases_the_old_socket(make_server: Any) -> None:
    upstream = make_server()
    gateway = make_server(backends=(backend(upstream, "responses-ws"),))
    with openai_client(gateway).responses.connect() as conn:
        conn.response.create(model="up", input="first", store=False)
        first = sdk_turn(conn)[-1].response
        assert upstream.live_sessions == 1
        # The rollout goes on with the simulated model: the upstream socket is let go.
        conn.response.create(
            model="sim", input="second", previous_response_id=first.id, store=False
        )
        assert sdk_turn(conn)[-1].type == "response.completed"
        deadline = time.monotonic() + 5
        while upstream.live_sessions and time.monotonic() < deadline:
            time.sleep(0.01)
        assert upstream.live_sessions == 0
        assert gateway.live_sessions == 1


def test_items_sent_whole_without_deltas_are_passed_on() -> None:
    # Some Responses servers send an item only when it is done: it still arrives.
    reader = TurnReader()
    call = {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": ""}
    events = [
        {"type": "response.created", "response": {"id": "resp_1"}},
        {"type": "response.output_item.added", "item": call},
        {"type": "response.output_item.done", "item": {**call, "arguments": '{"path":"a"}'}},
        {"type": "response.output_item.added", "item": {"type": "message", "content": []}},
        {
            "type": "response.output_item.done",
            "item": {
                "type": "message",
                "status": "incomplete",
                "content": [{"type": "output_text", "text": "cut"}],
            },
        },
        {
            "type": "response.incomplete",
            "response": {
                "id": "resp_1",
                "incomplete_details": {"reason": "max_output_tokens"},
                "usage": {
                    "input_tokens": 10,
                    "input_tokens_details": {"cached_tokens": 4},
                    "output_tokens": 5,
                    "output_tokens_details": {"reasoning_tokens": 2},
                },
            },
        },
    ]
    chunks = [c for e in events for c in reader.read(decode_event(json.dumps(e)))]
    assert chunks == [
        ToolCallStart("c1", "read_file"),
        ArgumentsDelta('{"path":"a"}'),
        ItemEnd(),
        TextDelta("cut"),
        ItemEnd(incomplete=True),
        Usage(input_tokens=10, cached_tokens=4, output_tokens=5, reasoning_tokens=2),
        Stop("max_output_tokens"),
    ]
    assert (reader.response_id, reader.produced, reader.ended) == ("resp_1", 2, True)


async def test_cancel_closes_the_upstream_http_stream_at_once(make_server: Any) -> None:
    upstream = make_server()
    gateway = make_server(backends=(backend(upstream, "responses"),))

    def upstream_connections() -> int:  # uvicorn's open connections on the upstream
        return len(upstream.server.server_state.connections)

    meta = {"sim_tool_calls": "0", "sim_output_tokens": "100000", "sim_tokens_per_second": "100"}
    async with connect(gateway.url) as client:
        await client.create(model="up", input="Talk for a long time.", metadata=meta)
        while not isinstance(await client.next_event(), OutputTextDelta):
            pass
        assert upstream_connections() == 1  # the gateway's streaming POST
        await client.cancel()
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "cancelled"
        # The stream's connection was closed, not left to finish its minutes of text.
        await wait_until(
            lambda: upstream_connections() == 0, "the upstream connection to close", seconds=2.0
        )


# --- when a failed turn may be sent again, and the deadlines that end one -------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_first_event_starts_the_idle_deadline(
    make_server: Any, upstream: ServerProcess, kind: str
) -> None:
    # The upstream's response.created comes at once; its first text 4.5 s later
    # (a long reasoning phase shows no output either). first_token_timeout bounds
    # the wait for the first event only: from there the idle deadline applies.
    config = backend(upstream, kind, first_token_timeout=2.0, idle_timeout=30.0)
    gateway = make_server(backends=(config,))
    meta = {"sim_tool_calls": "0", "sim_ttft_ms": "4500"}
    with openai_client(gateway).responses.connect() as conn:
        conn.response.create(model="up", input="Think first.", store=False, metadata=meta)
        events = sdk_turn(conn)
    assert events[-1].type == "response.completed", failure_of(events)
    assert output_text(events[-1].response)


@pytest.mark.parametrize("kind", KINDS)
def test_a_timeout_after_the_response_began_is_not_sent_again(
    make_server: Any, upstream: ServerProcess, kind: str
) -> None:
    config = backend(
        upstream, kind, idle_timeout=0.3, max_retries=2, retry_backoff=0.01,
    )  # fmt: skip
    gateway = make_server(backends=(config,))
    before = work(upstream)["items_validated"]
    code, message = failed_turn(
        gateway, input="Think long.", metadata={"sim_tool_calls": "0", "sim_ttft_ms": "3000"}
    )
    assert code == "upstream_unavailable"
    assert "sent nothing for 0.3 s" in message
    # The upstream began it (its response.created came): one request, never a second.
    assert work(upstream)["items_validated"] - before == 1


def scripted_backend(engine: ScriptedEngine, **fields: Any) -> BackendConfig:
    """The gateway's model ``up`` on a scripted peer, retrying quickly."""
    config = BackendConfig(
        name="up", kind="responses", base_url=engine.base_url, max_retries=2, retry_backoff=0.01
    )
    return dataclasses.replace(config, **fields)


def test_an_event_that_is_not_json_after_output_is_not_sent_again(make_server: Any) -> None:
    """The peer stands in for a third-party Responses server that breaks an event
    mid-stream (no longresponse writes an event that is not JSON)."""
    stream = sse(
        {"type": "response.created", "response": {"id": "resp_peer"}},
        {"type": "response.output_item.added", "item": {"type": "message"}},
        {"type": "response.output_text.delta", "delta": "Hello "},
        b'{"type": "response.output_text.delta", "delta": ',
    )
    with ScriptedEngine([stream, CLOSE]).running() as engine:
        gateway = make_server(backends=(scripted_backend(engine),))
        code, message = failed_turn(gateway)
        assert code == "upstream_unavailable"
        assert "not valid JSON" in message
        assert engine.requests == 1  # "Hello " was passed on: never written twice


def test_a_request_dropped_after_it_was_read_is_not_sent_again(make_server: Any) -> None:
    """The peer stands in for an engine (or a proxy before it) that reads a request
    and then drops the connection: the request may be running; sending it again
    could run it twice."""
    with ScriptedEngine([CLOSE]).running() as engine:
        gateway = make_server(backends=(scripted_backend(engine),))
        code, message = failed_turn(gateway)
        assert code == "upstream_unavailable"
        assert "broke off the request" in message
        assert engine.requests == 1


def test_an_error_answer_whose_body_stalls_ends_the_turn(make_server: Any) -> None:
    """The peer stands in for an engine that answers 500 and then stalls in its body
    (no longresponse does): the body is read within the first deadline, then the
    turn fails with what came."""
    head = (
        b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
        b"content-length: 1000\r\n\r\n"
    )
    with ScriptedEngine([head + b'{"error":', STALL]).running() as engine:
        config = scripted_backend(engine, max_retries=0, first_token_timeout=2.0)
        gateway = make_server(backends=(config,))
        started = time.monotonic()
        code, message = failed_turn(gateway)
        assert code == "upstream_unavailable"
        assert "failed (HTTP 500)" in message
        assert time.monotonic() - started < 20  # not the test's own timeout
        assert engine.requests == 1


# --- the samplers' resources ------------------------------------------------------


def test_a_background_response_releases_its_upstream_socket(make_server: Any) -> None:
    upstream = make_server()
    gateway = make_server(backends=(backend(upstream, "responses-ws"),))
    client = openai_client(gateway)
    made = client.responses.create(model="up", input="in the background", background=True)
    deadline = time.monotonic() + 10
    while client.responses.retrieve(made.id).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert client.responses.retrieve(made.id).status == "completed"
    # The rollout is over: its upstream socket is closed, not left open.
    while upstream.live_sessions and time.monotonic() < deadline:
        time.sleep(0.01)
    assert upstream.live_sessions == 0


def test_an_ended_turn_leaves_its_connection_for_the_next(make_server: Any) -> None:
    upstream = make_server()
    gateway = make_server(backends=(backend(upstream, "responses"),))

    def upstream_connections() -> set[Any]:  # uvicorn's open connections on the upstream
        return set(upstream.server.server_state.connections)

    client = openai_client(gateway)
    assert client.responses.create(model="up", input="one", store=False).status == "completed"
    time.sleep(0.3)  # a connection the gateway closed would be gone by now
    first = upstream_connections()
    assert len(first) == 1  # the gateway's pool kept it
    assert client.responses.create(model="up", input="two", store=False).status == "completed"
    assert upstream_connections() == first  # and the next turn used it


def sample_request(metadata: dict[str, str]) -> SampleRequest:
    return SampleRequest(
        context=[Message(role="user", content="Talk for a long time.")],
        tools=[],
        tool_choice="auto",
        parallel_tool_calls=True,
        metadata=metadata,
        cached_tokens=0,
        uncached_tokens=6,
    )


def test_closing_a_turn_drops_its_upstream_socket_at_once(make_server: Any) -> None:
    upstream = make_server()
    sampler = ResponsesWSBackend(backend(upstream, "responses-ws")).make_sampler()
    meta = {"sim_tool_calls": "0", "sim_output_tokens": "100000", "sim_tokens_per_second": "100"}

    async def abandon_a_turn() -> None:
        turn = sampler.sample(sample_request(meta))
        while not isinstance(await anext(turn), TextDelta):
            pass
        assert sampler.socket is not None
        await turn.aclose()
        # Closed with the turn, not later by the garbage collector's finalizer.
        assert sampler.socket is None

    asyncio.run(abandon_a_turn())


# --- what the upstream says, as it reaches the client -----------------------------


def test_the_api_key_is_cut_out_of_what_the_upstream_says() -> None:
    key = "sk-upstream-key-that-must-not-leak-7"
    said = f"Incorrect API key provided: {key}. Check it."
    refusal = refused(400, {"error": {"message": said, "code": "invalid_api_key"}}, secret=key)
    assert key not in refusal.message
    assert "Incorrect API key provided" in refusal.message
    failed_response = {"error": {"code": "server_error", "message": said}}
    events = [
        {"type": "error", "error": {"code": "invalid_request_error", "message": said}},
        {"type": "response.failed", "response": failed_response},
    ]
    for event in events:
        with pytest.raises(UpstreamError) as failed:
            list(TurnReader(secret=key).read(decode_event(json.dumps(event))))
        assert key not in failed.value.message
        assert "Incorrect API key provided" in failed.value.message


def test_a_refusal_arrives_as_the_answer_text() -> None:
    # Streamed as refusal deltas, or sent whole in the item that is done.
    streamed = [
        {"type": "response.output_item.added", "item": {"type": "message", "content": []}},
        {"type": "response.refusal.delta", "delta": "I can't help with that."},
        {"type": "response.output_item.done", "item": {"type": "message", "content": [
            {"type": "refusal", "refusal": "I can't help with that."}]}},
    ]  # fmt: skip
    whole = [streamed[0], streamed[2]]
    for events in (streamed, whole):
        reader = TurnReader()
        chunks = [c for e in events for c in reader.read(decode_event(json.dumps(e)))]
        assert chunks == [TextDelta("I can't help with that."), ItemEnd()]
        assert reader.produced == 1


def test_an_upstream_reasoning_model_gets_its_reasoning_back(make_server: Any) -> None:
    """The peer stands in for a reasoning model upstream with ``store: false``, which
    sends its reasoning encrypted (a longresponse upstream has no reasoning of its own)."""
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA-x"}
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file",
            "arguments": '{"path":"a"}', "status": "completed"}  # fmt: skip
    usage = {"input_tokens": 20, "output_tokens": 9}
    stream = sse(
        {"type": "response.created", "response": {"id": "resp_peer"}},
        {"type": "response.output_item.added", "item": reasoning},
        {"type": "response.output_item.done", "item": reasoning},
        {"type": "response.output_item.added", "item": {**call, "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "delta": call["arguments"]},
        {"type": "response.output_item.done", "item": call},
        {"type": "response.completed", "response": {"id": "resp_peer", "usage": usage}},
    )
    with ScriptedEngine([stream, CLOSE]).running() as engine:
        gateway = make_server(backends=(scripted_backend(engine),))
        with openai_client(gateway).responses.connect() as conn:
            conn.response.create(model="up", input="Which file?", tools=[TOOL], store=False)
            first = sdk_turn(conn)[-1].response
            assert [item.type for item in first.output] == ["function_call"]
            answer = {"type": "function_call_output", "call_id": "call_1", "output": "bug"}
            conn.response.create(
                model="up", input=[answer], previous_response_id=first.id, tools=[TOOL],
                store=False,
            )  # fmt: skip
            assert sdk_turn(conn)[-1].type == "response.completed"
    sent = [json.loads(body) for body in engine.bodies]
    assert len(sent) == 2
    assert sent[0]["include"] == ["reasoning.encrypted_content"]
    # The full input again (nothing is stored upstream), the reasoning before its call.
    assert [item["type"] for item in sent[1]["input"]] == [
        "message", "reasoning", "function_call", "function_call_output",
    ]  # fmt: skip
    assert sent[1]["input"][1] == reasoning
    assert "previous_response_id" not in sent[1]


def test_reasoning_whose_output_left_the_context_is_not_sent() -> None:
    reader = TurnReader()
    reasoning = {"type": "reasoning", "id": "rs_1", "encrypted_content": "gAAA-x"}
    events = [
        {"type": "response.output_item.done", "item": reasoning},
        {"type": "response.output_item.added", "item": {"type": "message", "content": []}},
        {"type": "response.output_text.delta", "delta": "It is in a."},
        {"type": "response.output_item.done", "item": {"type": "message"}},
    ]
    for event in events:
        list(reader.read(decode_event(json.dumps(event))))
    assert reader.reasoning == [(0, reasoning)]
    question = Message(role="user", content="Which file?")
    answer = Message(role="assistant", content=[OutputText(text="It is in a.")])
    reasoned = Reasoned()
    reasoned.ended([question], reader.reasoning)
    reasoned.attach([question, answer])
    assert upstream_input([question, answer], reasoned)[1] == reasoning
    # A truncation dropped the answer: its reasoning goes with it.
    reasoned.attach([question])
    assert reasoned.before(answer) == []


def test_a_call_cut_short_never_goes_upstream_again() -> None:
    question = Message(role="user", content="Read a.")
    cut = FunctionCall(call_id="c1", name="read", arguments='{"pa', status="incomplete")
    done = FunctionCall(call_id="c2", name="read", arguments='{"path": "a"}', status="completed")
    sent = upstream_input([question, cut, done])
    assert [item.call_id for item in sent if isinstance(item, FunctionCall)] == ["c2"]


@pytest.mark.parametrize("backend_class", [ResponsesBackend, ResponsesWSBackend])
async def test_a_spent_budget_asks_the_upstream_for_nothing(backend_class: Any) -> None:
    # Nothing listens at this address: a request would fail, not stop.
    config = BackendConfig(
        name="m", kind="responses", base_url=f"http://127.0.0.1:{free_port()}/v1"
    )
    backend = backend_class(config)
    try:
        request = SampleRequest(
            context=[Message(role="user", content="more")],
            tools=[],
            tool_choice="auto",
            parallel_tool_calls=True,
            metadata={},
            cached_tokens=0,
            uncached_tokens=3,
            max_output_tokens=0,
        )
        chunks = [chunk async for chunk in backend.make_sampler().sample(request)]
        assert chunks == [Stop("max_output_tokens")]
    finally:
        await backend.aclose()
