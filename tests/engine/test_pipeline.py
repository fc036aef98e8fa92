"""The incremental pipeline: switches, the secrets policy, the ledger, /metrics.

Each reuse switch must change what the server computes (counted) and nothing
the client sees (the responses stay identical, ids aside).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from typing import Any

import httpx
import openai
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from longresponse.client import connect
from longresponse.config import ServerConfig, SimConfig, Switches
from longresponse.engine.admission import Pipeline
from longresponse.engine.classifier import Finding
from longresponse.storage.backends import SQLiteStore
from protocol import ResponseState
from protocol.events import ErrorEvent, OutputItemDone, OutputTextDelta, ResponseDone, TimingEvent
from protocol.items import FunctionCall, InputText, Item, Message
from tests.conftest import RunningServer, openai_client

TOOL = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
FAKE_AWS_KEY = "AKIA" + "Q7RT5XAMPLEKEYZ9"  # the format of an access key id, not a key
OFF = {
    "incremental_validation": Switches(incremental_validation=False),
    "incremental_classification": Switches(incremental_classification=False),
    "token_cache": Switches(token_cache=False),
    "resolution_reuse": Switches(resolution_reuse=False),
    "overlapped_post_inference": Switches(overlapped_post_inference=False),
}
#: Which counter each switch saves.
SAVES = {
    "incremental_validation": "items_validated",
    "incremental_classification": "items_classified",
    "token_cache": "tokens_rendered",
    "resolution_reuse": "resolutions",
}
_CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def normal(text: str) -> str:
    return _CALL_ID.sub("call_X", text)


async def append_rollout(url: str, calls: int, output: str = "x" * 400) -> list[Any]:
    async with connect(url) as client:
        await client.create(
            model="sim", input="start", tools=[TOOL], metadata={"sim_tool_calls": str(calls)}
        )
        while True:
            events = await client.until_done()
            done = events[-1]
            assert isinstance(done, ResponseDone)
            if done.response.status != "requires_action":
                return events
            for event in events:
                if isinstance(event, OutputItemDone) and isinstance(event.item, FunctionCall):
                    await client.append(
                        [
                            {
                                "type": "function_call_output",
                                "call_id": event.item.call_id,
                                "output": f"{output} {event.output_index}",
                            }
                        ]
                    )


def ws_rollout(server: Any, calls: int) -> Any:
    client = openai_client(server)
    meta = {"sim_tool_calls": str(calls)}
    with client.responses.connect() as conn:
        conn.response.create(model="sim", input="start", tools=[TOOL], store=False, metadata=meta)
        turn = 0
        while True:
            while (event := conn.recv()).type != "response.completed":
                assert event.type != "error", event
            calls_made = [i for i in event.response.output if i.type == "function_call"]
            if not calls_made:
                return event.response
            conn.response.create(
                model="sim",
                previous_response_id=event.response.id,
                input=[
                    {
                        "type": "function_call_output",
                        "call_id": calls_made[0].call_id,
                        "output": f"{'x' * 400} {turn}",
                    }
                ],
                tools=[TOOL],
                store=False,
                metadata=meta,
            )
            turn += 1


def counters(server: Any) -> dict[str, int]:
    return dataclasses.asdict(server.app.parts.pipeline.counters)


@pytest.mark.parametrize("switch", sorted(SAVES))
async def test_each_switch_changes_the_work_not_the_responses(
    make_server: Any, switch: str
) -> None:
    on = make_server()
    off = make_server(switches=OFF[switch])
    results = {}
    for name, running in (("on", on), ("off", off)):
        events = await append_rollout(running.url, calls=6)
        ws_final = await trio.to_thread.run_sync(ws_rollout, running, 6)
        done = events[-1]
        results[name] = {
            "append_text": normal(done.response.output[-1].content[0].text),
            "append_usage": done.response.usage,
            "ws_text": normal(ws_final.output_text),
            "ws_usage": ws_final.usage.model_dump(),
            "work": counters(running),
        }
    assert results["on"]["append_text"] == results["off"]["append_text"]
    assert results["on"]["append_usage"] == results["off"]["append_usage"]
    assert results["on"]["ws_text"] == results["off"]["ws_text"]
    assert results["on"]["ws_usage"] == results["off"]["ws_usage"]
    saved = SAVES[switch]
    # Seven turns of a growing history each: without reuse, several times the work.
    assert results["off"]["work"][saved] > 2 * results["on"]["work"][saved], results


async def test_post_inference_off_writes_before_the_terminal_event(make_server: Any) -> None:
    running = make_server(switches=OFF["overlapped_post_inference"])
    store = running.app.parts.persistence.store
    loop = running.app.parts.loop
    async with connect(running.url) as client:
        await client.create(model="sim", input="bill me")
        done = (await client.until_done())[-1]
        # The terminal event waited for the ledger write: the record is there now.
        records = asyncio.run_coroutine_threadsafe(store.usage(), loop).result(5)
        assert [r.response_id for r in records] == [done.response.id]


class GatedStore:
    """Wraps the server's store: ledger writes wait until the test opens the gate."""

    def __init__(self, inner: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put_usage(self, record: Any) -> None:
        await self.gate.wait()
        await self.inner.put_usage(record)


async def test_overlapped_post_inference_never_delays_the_terminal_event(
    make_server: Any,
) -> None:
    running = make_server()
    persistence = running.app.parts.persistence
    loop = running.app.parts.loop
    gated = GatedStore(persistence.store, loop)
    persistence.store = gated
    try:
        async with connect(running.url) as client:
            await client.create(model="sim", input="bill me later")
            done = (await client.until_done())[-1]  # arrives with the write still held
            assert isinstance(done, ResponseDone)
            assert done.response.status == "completed"
            held = asyncio.run_coroutine_threadsafe(gated.inner.usage(), loop).result(5)
            assert done.response.id not in [r.response_id for r in held]
    finally:
        loop.call_soon_threadsafe(gated.gate.set)
    with trio.fail_after(10):  # the write lands once the gate opens
        while True:
            records = asyncio.run_coroutine_threadsafe(gated.inner.usage(), loop).result(5)
            if done.response.id in [r.response_id for r in records]:
                break
            await trio.sleep(0.01)


async def test_ledger_has_one_record_per_response_after_clean_shutdown(tmp_path: Any) -> None:
    path = tmp_path / "ledger.db"
    running = RunningServer(ServerConfig(port=0, store=f"sqlite:///{path}")).start()
    expected: dict[str, Any] = {}
    try:
        client = openai_client(running)
        for index in range(25):  # a loaded queue at the moment of the stop
            response = await trio.to_thread.run_sync(
                lambda index=index: client.responses.create(model="sim", input=f"http {index}")
            )
            expected[response.id] = response.usage
        async with connect(running.url) as append:
            for index in range(5):
                await append.create(model="sim", input=f"append {index}")
                done = (await append.until_done())[-1]
                expected[done.response.id] = done.response.usage
        final = await trio.to_thread.run_sync(ws_rollout, running, 3)
        assert final.id
    finally:
        running.stop()
    store = SQLiteStore(str(path))
    try:
        records = await trio.to_thread.run_sync(asyncio.run, store.usage())
    finally:
        await trio.to_thread.run_sync(asyncio.run, store.aclose())
    by_id = {r.response_id: r for r in records}
    assert len(by_id) == len(records)  # one record per response
    for response_id, usage in expected.items():
        record = by_id[response_id]
        assert record.input_tokens == usage.input_tokens
        assert record.cached_tokens == usage.input_tokens_details.cached_tokens
        assert record.output_tokens == usage.output_tokens
    transports = {r.transport for r in records}
    assert transports == {"http", "append", "ws"}
    assert sum(r.transport == "ws" for r in records) == 4  # one per segment


@pytest.mark.parametrize("policy", ["flag", "redact", "refuse"])
async def test_secrets_policy_in_every_transport(make_server: Any, policy: str) -> None:
    running = make_server(secrets_policy=policy)
    secret = f"key {FAKE_AWS_KEY} in config"  # the whole key within the sim's 40-char quote
    # append mode: the tool output carries the secret
    async with connect(running.url) as client:
        await client.create(model="sim", input="read the config", tools=[TOOL])
        events = await client.until_done()
        (call,) = [
            e.item
            for e in events
            if isinstance(e, OutputItemDone) and isinstance(e.item, FunctionCall)
        ]
        await client.append(
            [{"type": "function_call_output", "call_id": call.call_id, "output": secret}]
        )
        if policy == "refuse":
            error = await client.next_event()
            assert isinstance(error, ErrorEvent)
            assert error.error.code == "secret_detected"
            assert error.error.param == "input[0]"
            rid = events[-1].response.id
            assert client.connection.response(rid).state is ResponseState.REQUIRES_ACTION
            # Nothing was taken: the same call can still be answered. (The
            # client's own bookkeeping counted the refused output as sent, so
            # the retry goes out raw.)
            clean = {"type": "function_call_output", "call_id": call.call_id, "output": "clean"}
            await client.send_raw(json.dumps({"type": "response.append", "input": [clean]}))
        done = (await client.until_done())[-1]
        text = done.response.output[-1].content[0].text
        meta = done.response.metadata
        if policy == "flag":
            assert FAKE_AWS_KEY in text  # flagged, not changed
            assert meta["secrets_flagged"] == "1"
        elif policy == "redact":
            assert FAKE_AWS_KEY not in text
            assert "[REDACTED:" in text
            assert meta["secrets_flagged"] == "1"
        else:
            assert "«clean»" in text
            assert "secrets_flagged" not in meta
    # the shipped shape over WebSocket, and HTTP: the user message carries it
    client = openai_client(running)
    with client.responses.connect() as conn:
        conn.response.create(model="sim", input=secret, store=False)
        event = conn.recv()
        if policy == "refuse":
            assert event.type == "error"
            assert event.error.code == "secret_detected"
        else:
            while event.type != "response.completed":
                event = conn.recv()
            assert event.response.metadata["secrets_flagged"] == "1"
            assert (FAKE_AWS_KEY in event.response.output_text) == (policy == "flag")
    if policy == "refuse":
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="sim", input=secret)
        assert refused.value.code == "secret_detected"
    else:
        response = client.responses.create(model="sim", input=secret)
        assert response.metadata["secrets_flagged"] == "1"
        assert (FAKE_AWS_KEY in response.output_text) == (policy == "flag")


async def test_metrics_page_parses_and_has_every_phase(make_server: Any) -> None:
    running = make_server()
    await append_rollout(running.url, calls=2)
    await trio.to_thread.run_sync(ws_rollout, running, 1)
    http = openai_client(running)
    await trio.to_thread.run_sync(lambda: http.responses.create(model="sim", input="x"))
    async with httpx.AsyncClient() as web:
        page = (await web.get(f"{running.http_url}/metrics", timeout=10)).text
    families = {f.name: f for f in text_string_to_metric_families(page)}
    phases = families["longresponse_phase_seconds"]
    seen = {
        (s.labels["phase"], s.labels["transport"]) for s in phases.samples if "phase" in s.labels
    }
    for transport in ("append", "ws", "http"):
        for phase in ("decode", "validate", "classify", "render", "pre_inference", "inference"):
            assert (phase, transport) in seen
    work = {s.labels["kind"]: s.value for s in families["longresponse_pipeline_work"].samples}
    assert work["tokens_rendered"] > 0
    assert work["items_validated"] > 0
    responses = families["longresponse_responses"]
    assert any(s.labels.get("transport") == "http" for s in responses.samples)


async def test_timing_events_in_the_shipped_shape_only_when_asked(server: Any) -> None:
    headers = [("x-responsesapi-include-timing-metrics", "true")]
    async with connect(server.url, subprotocols=(), headers=headers) as client:
        await client.create(model="sim", input="time me", store=False)
        done = await client.until_done()
        timing = await client.next_event()
        assert isinstance(timing, TimingEvent)
        assert timing.response_id == done[-1].response.id
        assert {"render_ms", "validate_ms", "classify_ms", "encode_ms"} <= set(
            timing.timing_metrics
        )


async def test_context_window_exceeded_and_truncation(make_server: Any) -> None:
    small = make_server(sim=SimConfig(context_window=400))
    client = openai_client(small)
    long_input = [{"role": "user", "content": f"paragraph {i} " + "word " * 60} for i in range(8)]
    with pytest.raises(openai.BadRequestError) as exceeded:
        client.responses.create(model="sim", input=long_input)
    assert exceeded.value.code == "context_length_exceeded"
    with client.responses.connect() as conn:
        conn.send({"type": "response.create", "model": "sim", "input": long_input, "store": False})
        while (event := conn.recv()).type not in ("response.failed", "response.completed"):
            pass
        assert event.type == "response.failed"
        assert event.response.error.code == "context_length_exceeded"
    truncated = client.responses.create(model="sim", input=long_input, truncation="auto")
    assert truncated.status == "completed"
    assert truncated.usage.input_tokens <= 400
    assert "paragraph 7" in truncated.output_text  # the newest survive
    assert "paragraph 0" not in truncated.output_text


def test_json_body_unchanged_with_bad_tool_schema(server: Any) -> None:
    reply = httpx.post(
        f"{server.http_url}/v1/responses",
        json={
            "model": "sim",
            "input": "x",
            "tools": [{"type": "function", "name": "bad", "parameters": {"type": "wat"}}],
        },
        timeout=10,
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "tools[0].parameters"
    assert json.dumps(error)


def http_chain(server: Any, turns: int) -> Any:
    client = openai_client(server)
    meta = {"sim_tool_calls": str(turns)}
    response = client.responses.create(model="sim", input="go", tools=[TOOL], metadata=meta)
    for turn in range(turns):
        (call,) = [i for i in response.output if i.type == "function_call"]
        response = client.responses.create(
            model="sim",
            previous_response_id=response.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": f"o{turn}"}],
            tools=[TOOL],
            metadata=meta,
        )
    return response


async def test_prefix_reuse_renders_less_and_answers_the_same(make_server: Any) -> None:
    plain = make_server(prefix_reuse=False)
    cached = make_server()  # on by default
    answers, usage = {}, {}
    for name, running in (("plain", plain), ("cached", cached)):
        final = await trio.to_thread.run_sync(http_chain, running, 8)
        answers[name] = normal(final.output_text)
        usage[name] = final.usage.model_dump()
    assert answers["plain"] == answers["cached"]
    # The same tokens read and written; with the cache the parent's context is
    # reported cached (the model processed it), without it every token is written.
    for field in ("input_tokens", "output_tokens", "total_tokens"):
        assert usage["plain"][field] == usage["cached"][field], field
    plain_in, cached_in = (usage[n]["input_tokens_details"] for n in ("plain", "cached"))
    assert plain_in["cached_tokens"] == 0
    assert plain_in["cache_write_tokens"] == usage["plain"]["input_tokens"]
    assert 0 < cached_in["cached_tokens"] < usage["cached"]["input_tokens"]
    assert (
        cached_in["cached_tokens"] + cached_in["cache_write_tokens"]
        == usage["cached"]["input_tokens"]
    )
    rendered = {
        name: counters(s)["tokens_rendered"] for name, s in (("plain", plain), ("cached", cached))
    }
    assert rendered["plain"] > 2 * rendered["cached"]
    assert cached.app.parts.turns.prefixes.hits == 8


async def test_a_rollout_cut_off_by_a_disconnect_is_still_billed(make_server: Any) -> None:
    running = make_server()
    store = running.app.parts.persistence.store
    loop = running.app.parts.loop
    async with connect(running.url) as client:
        await client.create(
            model="sim",
            input="long answer",
            metadata={"sim_output_tokens": "100000", "sim_tokens_per_second": "500"},
            # (store: true keeps a checkpoint instead, and bills what it holds:
            # the turn cut off runs again where the response is taken up)
            store=False,
        )
        created = await client.next_event()
        rid = created.response.id  # type: ignore[union-attr]
        while not isinstance(await client.next_event(), OutputTextDelta):
            pass
    # The socket is gone mid-stream; the usage record still lands.
    with trio.fail_after(10):
        while True:
            records = asyncio.run_coroutine_threadsafe(store.usage(), loop).result(5)
            if rid in [r.response_id for r in records]:
                break
            await trio.sleep(0.01)
    (record,) = [r for r in records if r.response_id == rid]
    assert record.transport == "append"
    assert record.input_tokens > 0


def test_a_text_read_ahead_is_found_again_when_it_is_joined_from_parts() -> None:
    """``settle`` keeps its findings for the text of a message of several parts
    (joined anew at every call); admission finds them, and ``forget`` drops them."""
    pipeline = Pipeline(Switches())
    parts = [InputText(text="a" * 40_000), InputText(text="b" * 40_000)]
    items: list[Item] = [Message(role="user", content=parts)]
    marked = Finding("marked", 0, 1)  # what only the read ahead can have found
    reads: list[int] = []

    def read(text: str) -> list[Finding]:
        reads.append(len(text))
        return [marked]

    assert not pipeline.settled([], None, items)
    pipeline.settle([], None, items, read)
    assert reads == [80_000]
    assert pipeline.settled([], None, items)
    assert pipeline.classify(items) == [(marked,)]
    pipeline.forget(items)
    assert not pipeline.settled([], None, items)
    assert pipeline.classify(items) == [()]  # read in place now: nothing there
