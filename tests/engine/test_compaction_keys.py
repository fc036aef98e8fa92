"""Compaction items are sealed: bad input, owners, and the key across processes.

A forged or altered ``encrypted_content`` gets ``invalid_encrypted_content``
with its ``param`` over HTTP and over raw WebSocket frames of both shapes (and
the socket stays usable); so does one made for another API key. The key is
shared by every process behind one SQLite or Redis store, survives a restart,
and can be configured with ``--compaction-key`` or the environment instead.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from longresponse.client import connect
from longresponse.config import ServerConfig
from longresponse.engine.compaction import CompactionKey, ExpiredCompaction, InvalidCompaction
from longresponse.server_process import ServerProcess
from longresponse.storage.server_keys import COMPACTION_KEY_ENV
from protocol.events import ErrorEvent, ResponseDone
from protocol.items import FunctionCallOutput, Message
from tests.conftest import RunningServer
from tests.engine.test_compaction import REQUEST, THRESHOLD, compact, tool_output
from tests.support.http_clients import OPEN_CLIENTS, openai_client, post

CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": REQUEST},
    {"type": "function_call", "call_id": "call_a", "name": "read_file", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_a", "output": tool_output(0)},
]


def window_of(server: Any, key: str = "test-key") -> list[dict[str, Any]]:
    """A compacted window of :data:`CONVERSATION`, made by ``server`` for ``key``."""
    output: list[dict[str, Any]] = compact(
        openai_client(server, key), model="sim", input=CONVERSATION
    )["output"]
    return output


def continues(client: OpenAI, window: list[dict[str, Any]]) -> None:
    """``window`` opens on ``client``'s server: the answer quotes what it holds."""
    answer = client.responses.create(model="sim", input=window).output_text
    assert f"«{REQUEST[:40]}»" in answer
    assert f"«{tool_output(0)[:40]}»" in answer


def refused(reply: httpx.Response, param: str) -> None:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "invalid_encrypted_content"
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def altered(window: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``window`` with one character of its compaction item's ciphertext changed."""
    item = dict(window[-1])
    content = item["encrypted_content"]
    middle = len(content) // 2
    item["encrypted_content"] = (
        content[:middle] + ("A" if content[middle] != "A" else "B") + content[middle + 1 :]
    )
    return [*window[:-1], item]


FORGED = {"type": "compaction", "encrypted_content": "AQ" + "x" * 60}
COMPACT = "/v1/responses/compact"


# --- bad input ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        pytest.param({"input": "x"}, 400, "missing_required_parameter", "model", id="no-model"),
        pytest.param({"model": None, "input": "x"}, 400, "missing_required_parameter", "model",
                     id="null-model"),
        pytest.param({"model": "gpt-9", "input": "x"}, 404, "model_not_found", "model",
                     id="unknown-model"),
        pytest.param({"model": "sim"}, 400, "missing_required_parameter", "input",
                     id="nothing-to-compact"),
        pytest.param({"model": "sim", "input": 5}, 400, "invalid_type", "input", id="bad-input"),
        pytest.param({"model": "sim", "input": "x", "tools": []}, 400, "unknown_parameter",
                     "tools", id="create-only-field"),
        pytest.param("{not json", 400, "invalid_json", None, id="malformed"),
        pytest.param({"model": "sim", "previous_response_id": "resp_nope"}, 400,
                     "previous_response_not_found", "previous_response_id", id="unknown-parent"),
        pytest.param({"model": "sim", "input": [FORGED]}, 400, "invalid_encrypted_content",
                     "input[0].encrypted_content", id="forged"),
    ],
)  # fmt: skip
def test_bad_compact_bodies_get_the_error_envelope(
    server: Any, body: Any, status: int, code: str, param: str | None
) -> None:
    reply = post(server, body, path=COMPACT, key="test-key")
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    # The SDK's own signature needs a model; the call reaches the server and fails the same way.
    if code == "missing_required_parameter" and param == "model":
        with pytest.raises(openai.BadRequestError) as raised:
            openai_client(server).responses.compact(model=None, input="x")
        assert raised.value.code == "missing_required_parameter"
        assert raised.value.param == "model"


def test_compact_accepts_and_ignores_the_shipped_extras(server: Any) -> None:
    reply = post(
        server,
        {
            "model": "sim",
            "input": CONVERSATION,
            "prompt_cache_key": "k",
            "service_tier": "default",
            "prompt_cache_retention": "24h",
            "prompt_cache_options": {"mode": "explicit"},
            "image": {"context_compression": "enabled"},
        },
        path=COMPACT,
        key="test-key",
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["output"][-1]["type"] == "compaction"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        pytest.param({"context_management": [{"type": "compaction", "compact_threshold": 999}]},
                     "context_management[0].compact_threshold", "invalid_value", id="threshold"),
        pytest.param({"context_management": [{"type": "truncate"}]},
                     "context_management[0].type", "invalid_value", id="type"),
        pytest.param({"context_management": [{"type": "compaction", "compact_threshold": "x"}]},
                     "context_management[0].compact_threshold", "invalid_type", id="not-a-number"),
        pytest.param({"input": [{"type": "compaction_trigger"}, {"role": "user", "content": "x"}]},
                     "input[0].type", "invalid_value", id="trigger-not-last"),
        pytest.param({"input": [{"role": "user", "content": "x"}, FORGED]},
                     "input[1].encrypted_content", "invalid_encrypted_content", id="forged"),
        pytest.param({"input": [{"type": "compaction"}]},
                     "input[0].encrypted_content", "missing_required_parameter", id="no-content"),
    ],
)  # fmt: skip
def test_bad_compaction_input_over_http(
    server: Any, body: dict[str, Any], param: str, code: str
) -> None:
    reply = post(server, {"model": "sim", "input": "hi", **body}, key="test-key")
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == (code, param)


def test_an_altered_item_is_refused_everywhere(server: Any) -> None:
    window = window_of(server)
    bad = altered(window)
    refused(
        post(server, {"model": "sim", "input": bad}, key="test-key"),
        "input[1].encrypted_content",
    )
    refused(
        post(server, {"model": "sim", "input": bad}, path=COMPACT, key="test-key"),
        "input[1].encrypted_content",
    )
    # The shipped WebSocket: one error event; the socket stays usable.
    with openai_client(server).responses.connect() as conn:
        for frame in (
            {"type": "response.create", "model": "sim", "input": bad, "store": False},
            {
                "type": "response.create",
                "model": "sim",
                "input": "hi",
                "context_management": [{"type": "compaction", "compact_threshold": 10}],
            },
        ):
            conn.send_raw(json.dumps(frame))
            event = conn.recv()
            assert event.type == "error"
            assert event.error.code in ("invalid_encrypted_content", "invalid_value")
            assert event.error.param in (
                "input[1].encrypted_content",
                "context_management[0].compact_threshold",
            )
        conn.response.create(model="sim", input=window, store=False)
        while (event := conn.recv()).type != "response.completed":
            assert event.type != "error", event
        assert f"«{tool_output(0)[:40]}»" in event.response.output_text


async def test_an_altered_item_is_refused_in_append_mode(server: Any) -> None:
    window = window_of(server)
    async with connect(server.url) as client:
        await client.send_raw(
            json.dumps({"type": "response.create", "model": "sim", "input": altered(window)})
        )
        error = await client.next_event()
        assert isinstance(error, ErrorEvent)
        assert (error.error.code, error.error.param) == (
            "invalid_encrypted_content",
            "input[1].encrypted_content",
        )
        await client.send_raw(
            json.dumps(
                {
                    "type": "response.create",
                    "model": "sim",
                    "input": "x",
                    "context_management": [{"type": "compaction", "compact_threshold": 999}],
                }
            )
        )
        error = await client.next_event()
        assert isinstance(error, ErrorEvent)
        assert error.error.param == "context_management[0].compact_threshold"
        # An append carries messages and tool outputs only.
        await client.create(model="sim", input="go", tools=[READ_TOOL])
        paused = (await client.until_done())[-1]
        assert isinstance(paused, ResponseDone)
        assert paused.response.status == "requires_action"
        await client.send_raw(json.dumps({"type": "response.append", "input": [window[-1]]}))
        error = await client.next_event()
        assert isinstance(error, ErrorEvent)
        assert (error.error.code, error.error.param) == ("invalid_value", "input[0].type")
        await client.cancel()
        assert (await client.until_done())[-1].response.status == "cancelled"  # type: ignore[union-attr]
        # The socket is still usable: the genuine window continues the conversation.
        await client.create(model="sim", input=window)
        done = (await client.until_done())[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.status == "completed"
    message = done.response.output[-1]
    assert isinstance(message, Message)
    assert f"«{tool_output(0)[:40]}»" in str(message.content)


READ_TOOL = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def test_an_item_opens_only_for_the_api_key_that_made_it(make_server: Any) -> None:
    running = make_server(api_keys=("key-one", "key-two"))
    window = window_of(running, "key-one")
    continues(openai_client(running, "key-one"), window)
    refused(
        post(running, {"model": "sim", "input": window}, key="key-two"),
        "input[1].encrypted_content",
    )


# --- the key ----------------------------------------------------------------------


def test_sealing_is_authenticated_and_bound_to_the_owner() -> None:
    key = CompactionKey.derive("operator secret")
    items = [FunctionCallOutput(call_id="call_a", output="head")]
    token = key.seal(items, "owner-a")
    assert key.open(token, "owner-a") == items
    assert CompactionKey.derive("operator secret").open(token, "owner-a") == items
    assert token != key.seal(items, "owner-a")  # a fresh nonce every time
    for bad_open in (
        lambda: key.open(token, "owner-b"),
        lambda: CompactionKey.derive("another secret").open(token, "owner-a"),
        lambda: key.open(token[:-2] + ("AA" if token[-2:] != "AA" else "BB"), "owner-a"),
        lambda: key.open("not base64!", "owner-a"),
        lambda: key.open("", "owner-a"),
    ):
        with pytest.raises(InvalidCompaction):
            bad_open()
    with pytest.raises(ValueError, match="empty"):
        CompactionKey.derive("")


@pytest.mark.slow  # two server processes, one after the other
def test_two_processes_on_one_sqlite_store_share_the_key_across_restarts(tmp_path: Any) -> None:
    store = f"sqlite:///{tmp_path}/shared.db"
    with ServerProcess("--store", store) as first, ServerProcess("--store", store) as second:
        one, two = (
            OpenAI(base_url=f"{server.http_url}/v1", api_key="k", max_retries=0)
            for server in (first, second)
        )
        OPEN_CLIENTS.extend((one, two))
        made_on_one = compact(one, model="sim", input=CONVERSATION)["output"]
        made_on_two = compact(two, model="sim", input=CONVERSATION)["output"]
        continues(two, made_on_one)
        continues(one, made_on_two)
    # Every process is gone; the key is in the store, so a new one opens the old items.
    with ServerProcess("--store", store) as third:
        client = OpenAI(base_url=f"{third.http_url}/v1", api_key="k", max_retries=0)
        OPEN_CLIENTS.append(client)
        continues(client, made_on_one)
        continues(client, made_on_two)


def test_two_processes_on_one_redis_share_the_key(redis_url: str, make_server: Any) -> None:
    first, second = make_server(store=redis_url), make_server(store=redis_url)
    continues(openai_client(second), window_of(first))
    continues(openai_client(first), window_of(second))


def test_a_configured_key_works_without_a_shared_store(
    monkeypatch: pytest.MonkeyPatch, make_server: Any
) -> None:
    from_flag = make_server(store="memory://", compaction_key="deployment secret")
    monkeypatch.setenv(COMPACTION_KEY_ENV, "deployment secret")
    from_env = make_server(store="memory://")
    monkeypatch.delenv(COMPACTION_KEY_ENV)
    own_key = make_server(store="memory://")  # a memory store: a key of its own
    window = window_of(from_flag)
    continues(openai_client(from_env), window)
    continues(openai_client(from_flag), window_of(from_env))
    refused(
        post(own_key, {"model": "sim", "input": window}, key="test-key"),
        "input[1].encrypted_content",
    )


def test_a_restart_keeps_a_configured_key(tmp_path: Any) -> None:
    config = ServerConfig(port=0, store="memory://", compaction_key="kept")
    first = RunningServer(config).start()
    try:
        window = window_of(first)
    finally:
        first.stop()
    second = RunningServer(config).start()
    try:
        continues(openai_client(second), window)
    finally:
        second.stop()


# --- segments continued after their rollout compacted -------------------------------


def test_a_segment_from_before_a_compaction_continues_from_the_store(server: Any) -> None:
    client = openai_client(server)
    context_management: Any = [{"type": "compaction", "compact_threshold": THRESHOLD}]
    with client.responses.connect() as conn:
        responses = []
        previous = None
        for number in range(7):
            conn.response.create(
                model="sim",
                input=(
                    REQUEST
                    if previous is None
                    else [
                        {
                            "type": "function_call_output",
                            "call_id": previous.output[-1].call_id,
                            "output": tool_output(number - 1),
                        }
                    ]
                ),
                previous_response_id=previous.id if previous is not None else None,
                tools=[READ_TOOL],
                metadata={"sim_tool_calls": "20"},
                context_management=context_management,
            )
            while (event := conn.recv()).type != "response.completed":
                assert event.type != "error", event
            previous = event.response
            responses.append(previous)
        compacted = [r for r in responses if r.output[0].type == "compaction"]
        assert compacted, "the conversation crossed the threshold"
        # The first segment ended in a context the rollout has since replaced.
        first = responses[0]
        session = server.last_session.shipped
        hydrated_before = session.hydrations
        conn.response.create(
            model="sim",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": first.output[-1].call_id,
                    "output": "a different result"}],
            tools=[READ_TOOL],
            metadata={"sim_tool_calls": "1"},
        )  # fmt: skip
        while (event := conn.recv()).type != "response.completed":
            assert event.type != "error", event
        assert session.hydrations == hydrated_before + 1
        answer = event.response.output_text
        assert "«a different result»" in answer
        assert "I read 1 tool outputs" in answer


# --- the expiry -------------------------------------------------------------------


def test_an_item_expires_after_its_lifetime() -> None:
    """The expiry is sealed inside: an item opens until ``lifetime`` seconds after
    it was sealed, then is refused like an altered one (``ExpiredCompaction`` is
    an ``InvalidCompaction``); the lifetime of the server that opens it does not
    extend it."""
    items = [FunctionCallOutput(call_id="call_a", output="head")]
    key = CompactionKey.derive("operator secret", lifetime=60)
    token = key.seal(items, "owner-a", now=1_000_000)
    assert key.open(token, "owner-a", now=1_000_059) == items
    with pytest.raises(ExpiredCompaction):
        key.open(token, "owner-a", now=1_000_060)
    longer = CompactionKey.derive("operator secret", lifetime=10_000)
    with pytest.raises(ExpiredCompaction):
        longer.open(token, "owner-a", now=1_000_060)


def test_an_item_sealed_before_expiries_expires_from_its_sealing_time() -> None:
    """Items sealed before the expiry field carry only their sealing time: they
    open until the opening server's lifetime has passed since then."""
    import msgspec
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    secret = bytes(range(32))
    items = [FunctionCallOutput(call_id="call_a", output="head")]
    nonce = bytes(12)
    plain = msgspec.msgpack.encode([1_000_000, items])  # the old layout: no expires_at
    sealed = AESGCM(secret).encrypt(nonce, plain, b"longresponse.compaction.v1\x00owner-a")
    token = base64.urlsafe_b64encode(b"\x01" + nonce + sealed).decode()
    key = CompactionKey(secret, lifetime=60)
    assert key.open(token, "owner-a", now=1_000_059) == items
    with pytest.raises(ExpiredCompaction):
        key.open(token, "owner-a", now=1_000_060)


def test_an_expired_item_is_refused_precisely(make_server: Any) -> None:
    running = make_server(compaction_key="expiry secret")
    key = CompactionKey.derive("expiry secret")
    items = [Message(role="user", content="remember the expiry")]
    fresh = {"type": "compaction", "encrypted_content": key.seal(items, "")}
    old = {
        "type": "compaction",
        "encrypted_content": key.seal(items, "", now=time.time() - 31 * 86_400),
    }
    assert post(running, {"model": "sim", "input": [fresh]}, key="test-key").status_code == 200
    for path in ("/v1/responses", COMPACT, "/v1/responses/input_tokens"):
        reply = post(running, {"model": "sim", "input": [old]}, path=path, key="test-key")
        refused(reply, "input[0].encrypted_content")
        assert "expired" in reply.json()["error"]["message"]
