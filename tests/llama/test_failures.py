"""The real engine failing, and clients leaving: what the engine sees and what
the client and the operator are told.

A cancel or a client gone (append ``response.cancel``, a closed shipped
WebSocket, an HTTP JSON or SSE client that hangs up) closes the engine's
stream: llama-server logs ``cancel task`` and stops processing at once,
long before the turn's budget. The engine killed mid-stream: append mode
pauses, resumable, and resumes once the engine is back. A stale kept
connection is sent again on a new one; a misconfigured upstream is a server
error, logged for the operator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from longresponse.backends.chat import ChatBackend
from longresponse.client import connect
from longresponse.engine.sampling import SampleRequest
from longresponse.llama_server import LlamaEngine, LlamaServer
from protocol.events import ErrorEvent, OutputItemDone, OutputTextDelta, ResponseDone
from protocol.items import Message
from tests.conftest import openai_client
from tests.llama.conftest import LOOP_TIMEOUT, MODEL, WEATHER, Counted, gateway_backends
from tests.llama.test_shapes import responses_kind
from tests.support.late_close_relay import LateCloseRelay
from tests.support.waiting import wait_for

#: Real turns on two cores shared with other work: seconds on a quiet machine,
#: minutes on a loaded one (the engine measured 13-28 times slower).
pytestmark = pytest.mark.timeout(LOOP_TIMEOUT)

#: A prompt the model answers at length: the turn would run to its budget.
STORY = "Tell me a long story about a dragon who lives in a castle by the sea."
#: A long answer's request: the tools are offered but not to be called, so the
#: prompt begins as every loop's does and the engine finds that prefix cached.
ANSWER: dict[str, Any] = {
    "model": MODEL,
    "input": STORY,
    "tools": [WEATHER],
    "tool_choice": "none",
    "temperature": 0,
}
#: The gateway's ``text_grammar`` for those answers: the docs' grammar, but the
#: answer may not end before 2,000 characters (llama.cpp's largest count; about
#: 500 tokens, seconds of the engine's time even at full speed). The
#: model may otherwise end it after a few tokens (about one sampled answer in
#: eight, and at times even at temperature 0), before the stop being tested
#: reached the engine, which then has nothing to cancel.
UNENDING = 'root ::= "all\\n" [^\\x00]{2000,}'
#: The budget of a turn that is meant to be stopped first (far longer than the
#: seconds a stop may take, even at the 55-80 tokens/s this model decodes).
LONG = 1000
#: Seconds the engine may take to stop once its stream is closed (about 20 ms
#: on a quiet machine; two cores shared with other work can slow the engine
#: twentyfold, and it sees the close only when it writes): still below the
#: 12-18 s the ``LONG`` budget takes it at full speed.
STOP_DEADLINE = 10.0
#: Seconds a turn may take on two busy cores.
TURN = 180.0
#: Tokens the engine may generate after the last record the gateway read of a
#: stream it closed, before the engine sees the close: it writes each token
#: as it comes and cancels when a write finds the reader gone (0 or 1 in
#: runs on a quiet machine). Nobody saw them, and nobody is billed them.
CUT_SLACK = 8


def cancels(engine: LlamaServer) -> int:
    """How many tasks the engine has cancelled (its log says each)."""
    return engine.log().count("cancel task")


def processing(engine: LlamaServer) -> int:
    return int(engine.metrics()["requests_processing"])


def until_decoding(engine: LlamaServer, tokens: int = 3) -> None:
    """Wait until the engine has generated ``tokens`` of a request (its prefill is
    over: it writes to the connection now, where it sees a close)."""
    wait_for(
        lambda: any(
            slot["is_processing"] and slot["next_token"][0]["n_decoded"] >= tokens  # type: ignore[index]
            for slot in engine.slots()
        ),
        "the engine to start the request",
        TURN,
        interval=0.02,
    )


def assert_stops(engine: LlamaServer, cancelled_before: int) -> None:
    """The engine cancelled the request and is idle again, within the deadline."""
    deadline = time.monotonic() + STOP_DEADLINE
    while processing(engine) or cancels(engine) == cancelled_before:
        assert time.monotonic() < deadline, (
            "the engine is still generating"
            if processing(engine)
            else "the engine ended the request without a cancel"
        )
        time.sleep(0.02)


# --- a cancel, and clients gone ----------------------------------------------------


async def test_an_append_cancel_closes_the_engines_stream_and_bills_what_streamed(
    front: Any, llama: LlamaServer
) -> None:
    gateway = front(text_grammar=UNENDING)
    before = cancels(llama)
    counted = Counted(llama)
    async with connect(gateway.url) as client:
        await client.create(**ANSWER, max_output_tokens=LONG)
        deltas: list[str] = []
        while len(deltas) < 3:
            event = await client.next_event(timeout=TURN)
            if isinstance(event, OutputTextDelta):
                deltas.append(event.delta)
        await client.cancel()
        events = await client.until_done(timeout=TURN)
        assert_stops(llama, before)
    deltas += [e.delta for e in events if isinstance(e, OutputTextDelta)]
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "cancelled"
    # What streamed stays in the Response, its message cut short, and is billed.
    (message,) = done.response.output
    assert isinstance(message, Message)
    assert message.status == "incomplete"
    assert message.content[0].text == "".join(deltas)  # type: ignore[union-attr]
    ended = [e for e in events if isinstance(e, OutputItemDone)]
    assert [e.item for e in ended] == [message]
    # Billed by the engine's own counts as they streamed (running_counts), not
    # by the gateway's o200k estimate (issue 30: 25 input tokens billed for a
    # prompt of 173, 14 output tokens for 39): the prompt exactly, the output
    # as of the last record the gateway read.
    usage = done.response.usage
    assert usage is not None
    evaluated, cached, generated = counted.delta()
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens) == (
        evaluated + cached,
        cached,
    )
    assert 0 < usage.output_tokens <= generated <= usage.output_tokens + CUT_SLACK
    assert usage.output_tokens >= len(deltas)  # each delta at least one token of the engine's


def test_a_closed_shipped_websocket_closes_the_engines_stream(
    front: Any, llama: LlamaServer
) -> None:
    gateway = front(text_grammar=UNENDING)
    before = cancels(llama)
    with openai_client(gateway).responses.connect() as conn:
        conn.response.create(**ANSWER, max_output_tokens=LONG, store=False)
        seen = 0
        for event in conn:
            seen += event.type == "response.output_text.delta"
            if seen == 3:
                break
    assert_stops(llama, before)


def test_an_sse_client_that_hangs_up_closes_the_engines_stream(
    front: Any, llama: LlamaServer
) -> None:
    gateway = front(text_grammar=UNENDING)
    before = cancels(llama)
    stream = openai_client(gateway).responses.create(**ANSWER, max_output_tokens=LONG, stream=True)
    seen = 0
    for event in stream:
        seen += event.type == "response.output_text.delta"
        if seen == 3:
            break
    stream.close()
    assert_stops(llama, before)


def test_a_chat_completions_stream_reader_that_hangs_up_closes_the_engines_stream(
    front: Any, llama: LlamaServer
) -> None:
    gateway = front(text_grammar=UNENDING)
    before = cancels(llama)
    tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    stream = openai_client(gateway).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": STORY}],
        tools=[tool],  # type: ignore[list-item]
        tool_choice="none",
        max_tokens=LONG,
        stream=True,
    )
    seen = 0
    for chunk in stream:
        seen += bool(chunk.choices and chunk.choices[0].delta.content)
        if seen == 3:
            break
    stream.close()
    assert_stops(llama, before)


def test_a_json_client_that_hangs_up_closes_the_engines_stream(
    front: Any, llama: LlamaServer
) -> None:
    """A raw socket sends the request, waits until the engine writes the answer, and closes."""
    gateway = front(text_grammar=UNENDING)
    before = cancels(llama)
    body = json.dumps({**ANSWER, "max_output_tokens": LONG}).encode()
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(
            b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        until_decoding(llama)
    assert_stops(llama, before)


# --- the engine killed, and back ------------------------------------------------------


async def test_the_engine_killed_mid_stream_pauses_append_mode_until_it_is_back(
    make_server: Any, llama_engine: LlamaEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with LlamaServer(llama_engine) as engine:
        backends = gateway_backends(engine, tmp_path, text_grammar=UNENDING)
        gateway = make_server(store="memory://", backends=backends)
        async with connect(gateway.url) as client:
            # Killed after 3 of 60 tokens: the engine cannot have ended first.
            await client.create(**ANSWER, max_output_tokens=60)
            seen = 0
            while seen < 3:
                seen += isinstance(await client.next_event(timeout=TURN), OutputTextDelta)
            engine.kill()
            killed = time.monotonic()
            events = await client.until_done(timeout=TURN)  # up to the error
            error = events[-1]
            assert isinstance(error, ErrorEvent)
            assert time.monotonic() - killed < STOP_DEADLINE
            events = await client.until_done(timeout=TURN)  # then the pause
            assert (error.error.code, error.status) == ("upstream_unavailable", 502)
            pause = events[-1]
            assert isinstance(pause, ResponseDone)
            assert pause.response.status == "requires_action"  # resumable
            assert pause.response.required_action.call_ids == []  # type: ignore[union-attr]
            cut = pause.response.output[-1]
            assert isinstance(cut, Message)
            assert cut.status == "incomplete"
            # The operator's log says what failed and what lay under it.
            (line,) = [r for r in caplog.records if "upstream failed" in r.getMessage()]
            assert line.levelno == logging.WARNING
            assert "upstream_unavailable" in line.getMessage()
            assert "cause: " in line.getMessage()
            # Down: an HTTP request fails at once, precisely.
            with pytest.raises(openai.APIStatusError) as caught:
                openai_client(gateway).responses.create(model=MODEL, input="hi")
            assert caught.value.status_code == 502
            assert caught.value.body["code"] == "upstream_unavailable"  # type: ignore[index]
            engine.start()  # back, on the same port
            await client.append([])
            events = await client.until_done(timeout=TURN)
        done = events[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status in ("completed", "incomplete")
        assert done.response.id == pause.response.id
        answer = done.response.output[-1]
        assert isinstance(answer, Message)
        assert answer.content[0].text  # type: ignore[union-attr]


# --- the defects of issue 22 -------------------------------------------------------


def test_a_kept_connection_the_engine_closed_is_sent_again_on_a_new_one(
    llama: LlamaServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """llama-server closes the connection after each streamed answer while its
    headers say keep-alive; a turn that starts before that close arrives goes
    out on the dead connection. On loopback the close nearly always arrives
    first, so a relay holds it back until the next turn is sent (the race lost
    every time): the second turn is cut on the kept connection, sent again on a
    new one, and answered (a failure would raise UpstreamError)."""
    caplog.set_level(logging.INFO, logger="longresponse.backends.chat")
    (config,) = gateway_backends(llama, tmp_path)
    request = SampleRequest(
        context=[Message(role="user", content="hi")],
        tools=[],
        tool_choice="auto",
        parallel_tool_calls=True,
        metadata={},
        cached_tokens=0,
        uncached_tokens=10,
        max_output_tokens=1,
    )

    async def two_turns() -> tuple[LateCloseRelay, list[int]]:
        async with LateCloseRelay("127.0.0.1", llama.port) as relay:
            relayed = dataclasses.replace(config, base_url=f"http://127.0.0.1:{relay.port}/v1")
            backend = ChatBackend(relayed)
            sampler = backend.make_sampler()
            answered = []
            try:
                for _ in range(2):
                    answered.append(sum([1 async for _ in sampler.sample(request)]))
            finally:
                await backend.aclose()
            return relay, answered

    relay, answered = asyncio.run(two_turns())
    assert relay.held >= 1, "the engine kept the connection open: nothing to retry"
    assert relay.cut == 1  # the second turn went out on the closed connection...
    assert relay.accepted == 2  # ...and once more on a new one
    assert all(answered), answered
    retries = [r for r in caplog.records if "had closed a kept connection" in r.getMessage()]
    assert len(retries) == 1


async def test_a_misconfigured_upstream_is_a_server_error_logged_for_the_operator(
    make_server: Any, llama: LlamaServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``upstream_store = true`` in front of llama-server, which refuses
    ``previous_response_id``: the rollout's second turn (the first that
    chains) fails as a server error, not the client's ``invalid_request_error``."""
    gateway = responses_kind(make_server, llama, tmp_path, store=True)
    async with connect(gateway.url) as client:
        await client.create(
            model=MODEL,
            input="Weather in Paris?",
            tools=[WEATHER],
            tool_choice="required",
            temperature=0,  # sampled, a call may run past the budget
            max_output_tokens=60,
        )
        first = await client.until_done(timeout=TURN)
        pause = first[-1]
        assert isinstance(pause, ResponseDone)
        assert pause.response.status == "requires_action", pause.response
        (call_id,) = pause.response.required_action.call_ids  # type: ignore[union-attr]
        await client.append([{"type": "function_call_output", "call_id": call_id, "output": "sun"}])
        events = await client.until_done(timeout=TURN)
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "failed"
    error = done.response.error
    assert error is not None
    assert error.code == "server_error"
    assert "misconfigured" in error.message
    assert "previous_response_id" not in error.message  # the operator's business
    (line,) = [r for r in caplog.records if "upstream failed" in r.getMessage()]
    assert line.levelno == logging.ERROR
    assert "set upstream_store = false" in line.getMessage()


def test_a_call_cut_by_the_budget_is_incomplete_and_no_pending_call(front: Any) -> None:
    """The engine stops at the budget (``finish_reason: "length"``) mid-call: the
    call is ``incomplete``, nobody owes it an output, the Response ends
    ``incomplete``. (This model makes one call per turn; the calls a turn
    finished before the cut stay whole: tests/backends/test_backend_chat.py.)"""
    response = openai_client(front()).responses.create(
        model=MODEL, input="Weather in Oslo?", tools=[WEATHER], max_output_tokens=5
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    (call,) = response.output
    assert call.type == "function_call"
    assert call.status == "incomplete"
    assert response.usage is not None
    assert response.usage.output_tokens == 5  # the engine's count
