"""How a gateway fails when the engine behind it does: precisely, promptly, in every shape.

The engine is a second real ``longresponse serve`` process (or a port where
nothing listens, a listener that never accepts, a process killed mid-stream:
real failures, no doubles). Append mode pauses a rollout whose engine could
not serve a turn (an ``error`` event, then ``response.done`` with
``requires_action`` and no calls) and resumes it on the next append, even an
empty one; the shipped shapes fail the response (``response.failed``, or the
HTTP status with the error envelope). Refusals keep their shipped code; a
cancel or a disconnect reaches the engine at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import trio

from longresponse.backends.chat import ChatBackend
from longresponse.client import connect
from longresponse.engine.sampling import SampleRequest, UpstreamError, Usage
from longresponse.server_process import ServerProcess, free_port
from protocol.events import (
    ErrorEvent,
    OutputItemDone,
    OutputTextDelta,
    ResponseAppend,
    ResponseDone,
    ResponseInProgress,
)
from protocol.items import Message
from tests.backends.test_backend_chat import ADD, chat_backend, gateway
from tests.conftest import openai_client
from tests.support.connection_pair import ConnectionPair, Role, user
from tests.support.shipped_ws import sdk_turn
from tests.support.waiting import wait_until

#: an upstream process per test, killed, refused and restarted.
pytestmark = pytest.mark.slow

SLOW = {"sim_output_tokens": "5000", "sim_tokens_per_second": "20"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServerProcess]:
    with ServerProcess("--store", "memory://", "--sim-tokens-per-second", "0") as process:
        yield process


def counter(engine: ServerProcess, name: str) -> float:
    """One of the engine's ``longresponse_chat_*`` counters, from its /metrics."""
    text = httpx.get(f"{engine.http_url}/metrics").text
    for line in text.splitlines():
        if line.startswith(f"longresponse_chat_{name}_total "):
            return float(line.split()[1])
    raise AssertionError(f"no counter {name} on /metrics")


def nothing_listens() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


@contextlib.contextmanager
def never_accepts() -> Iterator[str]:
    """A listener whose backlog is full: a connection attempt hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(address)
        fillers.append(filler)
    try:
        yield f"http://127.0.0.1:{address[1]}/v1"
    finally:
        for sock in (*fillers, listener):
            sock.close()


def http_error(front: Any, **create: Any) -> openai.APIStatusError:
    create.setdefault("input", "hi")
    with pytest.raises(openai.APIStatusError) as caught:
        openai_client(front).responses.create(model="engine", **create)
    return caught.value


def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    return error


# --- the protocol allows a pause with nothing pending, and an empty append -------


def test_the_core_pauses_with_no_calls_and_takes_an_empty_append() -> None:
    pair = ConnectionPair()
    pair.create(input=[user()])
    pair.start()
    pair.pause()  # requires_action with call_ids []
    assert pair.state() == "requires_action"
    pair.send(Role.CLIENT, ResponseAppend(input=[]))
    pair.resume()
    pair.finish()
    assert pair.state() == "completed"


def test_the_core_refuses_an_empty_append_anywhere_else() -> None:
    pair = ConnectionPair()
    pair.create(input=[user()])
    pair.start()
    empty = ResponseAppend(input=[])
    pair.assert_rejected(Role.CLIENT, empty, code="empty_array", param="input")  # sampling
    pair.call("c1")
    pair.pause("c1")
    pair.assert_rejected(Role.CLIENT, empty, code="empty_array", param="input")  # calls wait


# --- unreachable, reset -----------------------------------------------------------


def test_an_unreachable_engine_is_502_upstream_unavailable_over_http(make_server: Any) -> None:
    front = gateway(make_server, nothing_listens(), max_retries=1, retry_backoff=0.01)
    exc = http_error(front)
    assert exc.status_code == 502
    error = error_of(exc)
    assert (error["code"], error["type"]) == ("upstream_unavailable", "server_error")
    assert "could not be reached" in error["message"]
    stream = openai_client(front).responses.create(model="engine", input="hi", stream=True)
    events = list(stream)
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.code == "upstream_unavailable"


def test_an_unreachable_engine_fails_the_shipped_websocket_response(make_server: Any) -> None:
    front = gateway(make_server, nothing_listens(), max_retries=0)
    with openai_client(front).responses.connect() as conn:
        conn.response.create(model="engine", input="hi", store=False)
        for event in conn:
            if event.type == "response.failed":
                assert event.response.error.code == "upstream_unavailable"
                break
            assert event.type in ("response.created", "response.in_progress")
        # The connection stays usable: the simulated model still answers.
        conn.response.create(model="sim", input="still here", store=False)
        assert sdk_turn(conn)[-1].type == "response.completed"


async def test_append_mode_pauses_on_an_unreachable_engine_and_resumes(make_server: Any) -> None:
    port = free_port()
    front = gateway(make_server, f"http://127.0.0.1:{port}/v1", max_retries=0)
    async with connect(front.url) as client:
        await client.create(model="engine", input="Hello, engine.", tools=[ADD])
        events = await client.until_done()
        error = events[-1]
        assert isinstance(error, ErrorEvent)
        assert (error.error.code, error.status) == ("upstream_unavailable", 502)
        response_id = events[0].response.id  # type: ignore[union-attr]
        assert error.response_id == response_id
        pause = (await client.until_done())[-1]
        assert isinstance(pause, ResponseDone)
        assert pause.response.status == "requires_action"
        assert pause.response.required_action.call_ids == []  # type: ignore[union-attr]
        with ServerProcess("--store", "memory://", "--sim-tokens-per-second", "0", port=port):
            await client.append([])  # nothing to add: try again
            resumed = await client.until_done()
    assert isinstance(resumed[0], ResponseInProgress)
    done = resumed[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.id == response_id
    # The engine is told the tools are there; the sim calls one, as it does.
    assert done.response.status == "requires_action"
    assert len(done.response.required_action.call_ids) == 1  # type: ignore[union-attr]


async def test_an_engine_killed_mid_stream_cuts_the_item_and_pauses(make_server: Any) -> None:
    with ServerProcess("--store", "memory://") as engine:
        front = gateway(make_server, engine, max_retries=3)
        async with connect(front.url) as client:
            await client.create(model="engine", input="Talk.", metadata=SLOW)
            while not isinstance(await client.next_event(), OutputTextDelta):
                pass
            assert engine.process is not None
            engine.process.kill()
            events = await client.until_done()
            error = events[-1]
            assert isinstance(error, ErrorEvent)
            assert error.error.code == "upstream_unavailable"
            assert "broke off" in error.error.message or "ended the stream" in error.error.message
            cut = [e.item for e in events if isinstance(e, OutputItemDone)]
            assert len(cut) == 1
            assert isinstance(cut[0], Message)
            assert cut[0].status == "incomplete"
            pause = (await client.until_done())[-1]
            assert isinstance(pause, ResponseDone)
            assert pause.response.status == "requires_action"
            # What the model wrote stays in the response.
            assert pause.response.output == cut
            await client.cancel()
            end = (await client.until_done())[-1]
            assert end.response.status == "cancelled"  # type: ignore[union-attr]


def test_an_engine_killed_mid_stream_fails_an_sse_response(make_server: Any) -> None:
    with ServerProcess("--store", "memory://") as engine:
        front = gateway(make_server, engine)
        stream = openai_client(front).responses.create(
            model="engine", input="Talk.", metadata=SLOW, stream=True
        )
        seen = []
        for event in stream:
            seen.append(event)
            if event.type == "response.output_text.delta" and engine.process is not None:
                engine.process.kill()
                engine.process.wait()
        assert seen[-1].type == "response.failed"
        assert seen[-1].response.error.code == "upstream_unavailable"


# --- refusals ---------------------------------------------------------------------


def test_a_context_too_long_for_the_engine_is_context_length_exceeded(make_server: Any) -> None:
    with ServerProcess("--store", "memory://", "--sim-context-window", "40") as engine:
        front = gateway(make_server, engine)
        exc = http_error(front, input="word " * 100)
        assert exc.status_code == 400
        error = error_of(exc)
        assert (error["code"], error["param"]) == ("context_length_exceeded", "input")


async def test_a_refusal_ends_an_append_mode_rollout_failed(make_server: Any) -> None:
    with ServerProcess("--store", "memory://", "--sim-context-window", "40") as engine:
        front = gateway(make_server, engine)
        async with connect(front.url) as client:
            await client.create(model="engine", input="word " * 100)
            done = (await client.until_done())[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "failed"
    assert done.response.error is not None
    assert done.response.error.code == "context_length_exceeded"


def test_the_window_is_checked_by_the_engines_count(upstream: ServerProcess) -> None:
    """With ``tokenize`` the engine's /tokenize counts; after a turn, the
    ``prompt_tokens`` it reported plus the estimate of what is new."""

    async def turn(sampler: Any, request: SampleRequest, estimated: int) -> list[Any]:
        """A turn of ``request`` whose context we estimate at ``estimated`` tokens."""
        request = dataclasses.replace(request, cached_tokens=0, uncached_tokens=estimated)
        async with contextlib.aclosing(sampler.sample(request)) as chunks:
            return [c async for c in chunks]

    async def check() -> None:
        config = chat_backend(upstream, tokenize=True, context_window=5)
        backend = ChatBackend(config)
        try:
            sampler = backend.make_sampler()
            request = sample_request("count these words for me")
            with pytest.raises(UpstreamError) as refused:
                await turn(sampler, request, 0)  # our own estimate says nothing
            assert refused.value.code == "context_length_exceeded"
            assert "about 1" in refused.value.message  # the engine counted 1x tokens
            backend.config = config = dataclasses.replace(
                config, tokenize=False, context_window=10**6
            )
            async with contextlib.aclosing(sampler.sample(request)) as chunks:
                usage = [c async for c in chunks if isinstance(c, Usage)]
            prompt = usage[0].input_tokens
            backend.config = dataclasses.replace(config, context_window=prompt + 2)
            assert await turn(sampler, request, 10)  # as counted then: fits
            with pytest.raises(UpstreamError) as refused:
                await turn(sampler, request, 13)  # three tokens more: too long
            assert refused.value.code == "context_length_exceeded"
        finally:
            await backend.aclose()

    asyncio.run(check())


def sample_request(text: str) -> SampleRequest:
    return SampleRequest(
        context=[Message(role="user", content=text)],
        tools=[],
        tool_choice="auto",
        parallel_tool_calls=True,
        metadata={},
        cached_tokens=0,
        uncached_tokens=10,
    )


def test_a_bad_request_keeps_its_code_and_param(make_server: Any, upstream: ServerProcess) -> None:
    # An engine that does not know the budget's field name refuses it.
    front = gateway(make_server, upstream, max_tokens_field="max_new_tokens")
    exc = http_error(front, max_output_tokens=50)
    assert exc.status_code == 400
    error = error_of(exc)
    assert (error["code"], error["param"]) == ("unknown_parameter", "max_output_tokens")


def test_an_upstream_without_the_model_is_upstream_unavailable(
    make_server: Any, upstream: ServerProcess
) -> None:
    # The client's model exists here: the backend is misconfigured (the
    # server's fault), as the Responses backends say too.
    front = gateway(make_server, upstream, upstream_model="no-such-model")
    exc = http_error(front)
    assert exc.status_code == 502
    error = error_of(exc)
    assert error["code"] == "upstream_unavailable"
    assert "does not serve the model" in error["message"]


def test_refused_credentials_never_show_the_key(
    make_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ServerProcess("--store", "memory://", "--api-key", "the-right-key") as engine:
        monkeypatch.setenv("ENGINE_KEY", "sk-wrong-0123456789")
        wrong = gateway(make_server, engine, api_key_env="ENGINE_KEY")
        exc = http_error(wrong)
        assert exc.status_code == 502
        error = error_of(exc)
        assert error["code"] == "upstream_unavailable"
        assert "refused the server's credentials" in error["message"]
        assert "sk-wrong-0123456789" not in exc.response.text
        monkeypatch.setenv("ENGINE_KEY", "the-right-key")
        right = gateway(make_server, engine, api_key_env="ENGINE_KEY")
        answer = openai_client(right).responses.create(model="engine", input="hi")
        assert answer.status == "completed"


# --- rate limits ------------------------------------------------------------------


@contextlib.contextmanager
def engine_busy(engine: ServerProcess) -> Iterator[None]:
    """One slow completion holding the engine's only slot."""
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": "go"}],
        "stream": True,
        "metadata": SLOW,
    }
    with httpx.stream("POST", f"{engine.http_url}/v1/chat/completions", json=body) as held:
        lines = held.iter_lines()  # kept: a dropped iterator closes the stream
        next(lines)
        yield


def test_a_rate_limited_engine_is_429_with_its_retry_hint_after_bounded_retries(
    make_server: Any,
) -> None:
    with ServerProcess("--store", "memory://", "--chat-max-in-flight", "1") as engine:
        front = gateway(make_server, engine, max_retries=2, retry_backoff=0.01)
        with engine_busy(engine):
            before = counter(engine, "refused_busy")
            exc = http_error(front)
            assert exc.status_code == 429
            assert error_of(exc)["code"] == "rate_limit_exceeded"
            assert exc.response.headers["retry-after"] == "1"
            # Tried once and retried twice (waiting the engine's Retry-After), no more.
            assert counter(engine, "refused_busy") - before == 3


async def test_a_rate_limited_append_mode_turn_pauses_with_the_hint(make_server: Any) -> None:
    with ServerProcess("--store", "memory://", "--chat-max-in-flight", "1") as engine:
        front = gateway(make_server, engine, max_retries=0)
        with engine_busy(engine):
            async with connect(front.url) as client:
                await client.create(model="engine", input="hi")
                error = (await client.until_done())[-1]
                assert isinstance(error, ErrorEvent)
                assert (error.error.code, error.status, error.retry_after) == (
                    "rate_limit_exceeded",
                    429,
                    1.0,
                )
                pause = (await client.until_done())[-1]
                assert pause.response.status == "requires_action"  # type: ignore[union-attr]


# --- cancel, disconnect, slow engines ------------------------------------------------


async def test_a_cancel_closes_the_engines_stream_at_once(
    make_server: Any, upstream: ServerProcess
) -> None:
    front = gateway(make_server, upstream)
    async with connect(front.url) as client:
        await client.create(model="engine", input="Talk at length.", metadata=SLOW)
        while not isinstance(await client.next_event(), OutputTextDelta):
            pass
        before = counter(upstream, "stopped")
        await client.cancel()
        seen = await wait_until(
            lambda: counter(upstream, "stopped") > before,
            "the engine to stop its stream",
            in_thread=True,
            interval=0.005,
        )
        done = (await client.until_done())[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "cancelled"
    assert seen < 2.0  # the stream had minutes to run
    # Billed once: the input of the one turn, as the server counts it.
    answer = await trio.to_thread.run_sync(
        lambda: httpx.post(
            f"{front.http_url}/v1/responses/input_tokens",
            json={"model": "engine", "input": "Talk at length."},
        )
    )
    counted = answer.json()["input_tokens"]
    assert done.response.usage is not None
    assert done.response.usage.input_tokens == counted


async def test_a_disconnect_closes_the_engines_stream(
    make_server: Any, upstream: ServerProcess
) -> None:
    front = gateway(make_server, upstream)
    before = counter(upstream, "stopped")
    async with connect(front.url) as client:
        await client.create(model="engine", input="Talk at length.", metadata=SLOW)
        while not isinstance(await client.next_event(), OutputTextDelta):
            pass
    await wait_until(
        lambda: counter(upstream, "stopped") > before,
        "the engine to stop its stream",
        in_thread=True,
        interval=0.005,
    )


async def test_a_slow_engine_never_blocks_other_rollouts(
    make_server: Any, upstream: ServerProcess
) -> None:
    front = gateway(make_server, upstream)
    async with connect(front.url) as slow, connect(front.url) as quick:
        await slow.create(model="engine", input="wait", metadata={"sim_ttft_ms": "60000"})
        await quick.create(model="engine", input="quick")
        done = (await quick.until_done(timeout=10))[-1]
        assert done.response.status == "completed"  # type: ignore[union-attr]
        waiting = []
        with trio.move_on_after(0.05):
            while True:
                waiting.append(await slow.next_event())
        # The slow rollout is still waiting for its first token.
        assert not any(isinstance(e, ResponseDone | OutputTextDelta) for e in waiting)
        await slow.cancel()
        assert (await slow.until_done())[-1].response.status == "cancelled"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("timeout", "metadata"),
    [
        ("first_token_timeout", {"sim_ttft_ms": "20000"}),
        ("idle_timeout", {"sim_output_tokens": "50", "sim_tokens_per_second": "1"}),
    ],
)
def test_a_timeout_is_upstream_unavailable_naming_it(
    make_server: Any, upstream: ServerProcess, timeout: str, metadata: dict[str, str]
) -> None:
    front = gateway(make_server, upstream, **{timeout: 0.3})
    events = list(
        openai_client(front).responses.create(
            model="engine", input="hi", metadata=metadata, stream=True
        )
    )
    assert events[-1].type == "response.failed"
    error = events[-1].response.error
    assert error.code == "upstream_unavailable"
    assert f"{timeout} (0.3 s)" in error.message


def test_a_connect_timeout_is_upstream_unavailable_naming_it(make_server: Any) -> None:
    with never_accepts() as url:
        front = gateway(make_server, url, connect_timeout=0.2, max_retries=0)
        exc = http_error(front)
    assert exc.status_code == 502
    error = error_of(exc)
    assert error["code"] == "upstream_unavailable"
    assert "connect_timeout (0.2 s)" in error["message"]
