"""One request schema for every transport, walked from the installed SDK's types.

Every field of ``openai.types.responses.response_create_params.
ResponseCreateParamsBase`` (and of the WebSocket ``response.create`` event's
own type, which adds ``generate``, ``stream`` and ``stream_id``) is sent with
valid values, one request per value, on each transport:

- HTTP JSON and HTTP SSE, with the official SDK's ``client.responses.create``;
- the shipped WebSocket, with the SDK's ``client.responses.connect()``;
- append mode, with the project's trio client.

Each must be accepted (a completed Response, or a queued one for
``background``), except where the shipped API itself refuses a field on a
transport: ``background: true`` on a WebSocket, ``stream_id`` over HTTP,
each answered with exactly the shipped error. Where the published Response
echoes a field, the echo is checked too. A field the SDK adds later and this
table does not know fails the walk: it must be given a value, and served.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, Final

import msgspec
import pytest
from openai.types.responses import response_create_params, responses_client_event

from longresponse.client import connect
from protocol.events import ErrorEvent, ResponseDone
from tests.conftest import openai_client

Value = Any
Check = Callable[[dict[str, Any]], bool]

FUNCTION_TOOL = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
BREAKPOINT_INPUT = [
    {
        "role": "user",
        "content": [
            {
                "type": "input_text",
                "text": "The stable prefix.",
                "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "12h"},
            },
            {
                "type": "input_text",
                "text": "Inherits the request's ttl.",
                "prompt_cache_breakpoint": {"mode": "explicit"},
            },
        ],
    }
]


def literal_values(field: str) -> list[Value]:
    """Each value a ``Literal`` (or ``Optional[Literal]``) field of the SDK's type allows."""
    hint = typing.get_type_hints(response_create_params.ResponseCreateParamsBase)[field]
    values: list[Value] = []
    for arg in typing.get_args(hint) or (hint,):
        values.extend(typing.get_args(arg) if typing.get_origin(arg) is typing.Literal else ())
    assert values, f"{field} is not a Literal in the SDK"
    return values


def includable() -> list[str]:
    hint = typing.get_type_hints(response_create_params.ResponseCreateParamsBase)["include"]
    (listed,) = [a for a in typing.get_args(hint) if a is not type(None)]
    (literal,) = typing.get_args(listed)
    return list(typing.get_args(literal))


#: Stands for a conversation the test made just before (an unknown one is refused).
OWN_CONVERSATION: Final = "conv_made_by_the_test"

#: field -> the valid values sent (one request each). ``previous_response_id``
#: is filled in per transport with a response made just before, and
#: :data:`OWN_CONVERSATION` with a conversation made just before.
VALUES: dict[str, list[Value]] = {
    "access_programs": [{"cyber": "standard"}],
    "background": [False, True],
    "background_options": [{"completion_window": "soonest", "continuation_id": "cont_1"}],
    "context_management": [[{"type": "compaction", "compact_threshold": 1000}]],
    "conversation": [OWN_CONVERSATION, {"id": OWN_CONVERSATION}],
    "image": [{"context_compression": "auto"}],
    "include": [includable(), *([value] for value in includable())],
    "input": ["Find the bug.", BREAKPOINT_INPUT],
    "instructions": ["You are terse."],
    "max_output_tokens": [64],
    "max_tool_calls": [3],
    "metadata": [{"team": "core"}],
    "model": ["sim"],
    "moderation": [
        {"model": "omni-moderation-latest"},
        {
            "model": "omni-moderation-latest",
            "policy": {"input": {"mode": "score"}, "output": {"mode": "block"}},
        },
    ],
    "parallel_tool_calls": [False],
    "previous_response_id": ["<previous>"],
    "prompt": [{"id": "pmpt_123", "version": "2", "variables": {"city": "Paris"}}],
    "prompt_cache_key": ["codex-thread-1"],
    "prompt_cache_options": [
        {"mode": "explicit", "ttl": "12h"},
        {"mode": "implicit", "ttl": "30m", "comparison_response_id": "resp_old"},
    ],
    "prompt_cache_retention": literal_values("prompt_cache_retention"),
    "reasoning": [{"effort": "low", "summary": "auto"}],
    "safety_identifier": ["user-hash-1"],
    "service_tier": literal_values("service_tier"),
    "store": [False],
    "stream_options": [{"include_obfuscation": False}],
    "temperature": [0.5],
    "text": [{"format": {"type": "text"}, "verbosity": "low"}],
    "tool_choice": ["none"],
    "tools": [[FUNCTION_TOOL]],
    "top_logprobs": [5],
    "top_p": [0.9],
    "truncation": literal_values("truncation"),
    "user": ["user-1"],
    # The WebSocket event's own fields (responses_client_event.ResponseCreate).
    "generate": [True],
    "stream": [True],
    "stream_id": ["lane-a"],
}

#: Sent on every transport although no SDK type declares it: Codex does, always.
CODEX_EXTRAS: dict[str, Value] = {"client_metadata": {"x-codex-installation-id": "inst-1"}}

#: What a field that is echoed must look like on the Response.
ECHO: dict[str, Callable[[Value], Check]] = {
    "conversation": lambda v: lambda r: r["conversation"]
    == {"id": v if isinstance(v, str) else v["id"]},
    "prompt": lambda v: lambda r: r["prompt"]["id"] == v["id"]
    and r["prompt"]["variables"] == v["variables"],
    "prompt_cache_key": lambda v: lambda r: r["prompt_cache_key"] == v,
    "prompt_cache_options": lambda v: lambda r: r["prompt_cache_options"]["mode"] == v["mode"]
    and r["prompt_cache_options"]["ttl"] == v["ttl"],
    "prompt_cache_retention": lambda v: lambda r: r["prompt_cache_retention"] == v,
    "safety_identifier": lambda v: lambda r: r["safety_identifier"] == v,
    "user": lambda v: lambda r: r["user"] == v,
    "metadata": lambda v: lambda r: r["metadata"] == v,
    "max_tool_calls": lambda v: lambda r: r["max_tool_calls"] == v,
    "max_output_tokens": lambda v: lambda r: r["max_output_tokens"] == v,
    "parallel_tool_calls": lambda v: lambda r: r["parallel_tool_calls"] is v,
    "top_logprobs": lambda v: lambda r: r["top_logprobs"] == v,
    "top_p": lambda v: lambda r: r["top_p"] == v,
    "temperature": lambda v: lambda r: r["temperature"] == v,
    "truncation": lambda v: lambda r: r["truncation"] == v,
    "instructions": lambda v: lambda r: r["instructions"] == v,
    "text": lambda v: lambda r: r["text"]["verbosity"] == v["verbosity"],
    "reasoning": lambda v: lambda r: r["reasoning"]["effort"] == v["effort"],
    # The tier that served the request, as shipped: every request runs at default.
    "service_tier": lambda v: lambda r: r["service_tier"] == "default",
    "store": lambda v: lambda r: r["store"] is v,
}

#: The shipped refusals: (transport, field, value) -> (status, code, param).
REFUSED: dict[tuple[str, str, Value], tuple[int, str, str]] = {
    ("ws", "background", True): (400, "invalid_value", "background"),
    ("append", "background", True): (400, "invalid_value", "background"),
    ("http", "stream_id", "lane-a"): (400, "unknown_parameter", "stream_id"),
    ("sse", "stream_id", "lane-a"): (400, "unknown_parameter", "stream_id"),
}
#: Refused whatever the value: (transport, field) -> (status, code, param).
REFUSED_FIELDS: dict[tuple[str, str], tuple[int, str, str]] = {
    # Append mode keeps its own rollouts: it takes no conversation (SHIPPED.md).
    ("append", "conversation"): (400, "invalid_value", "conversation"),
}

BASE = {"model": "sim", "input": "Say hi."}


def refusal(transport: str, field: str, value: Value) -> tuple[int, str, str] | None:
    if (transport, field) in REFUSED_FIELDS:
        return REFUSED_FIELDS[transport, field]
    for (where, name, refused), expected in REFUSED.items():
        if (where, name) == (transport, field) and refused == value:
            return expected
    return None


def cases() -> list[tuple[str, Value]]:
    return [(field, value) for field, values in VALUES.items() for value in values]


def test_the_table_covers_every_field_the_sdk_declares() -> None:
    http_fields = set(typing.get_type_hints(response_create_params.ResponseCreateParamsBase))
    ws_fields = set(responses_client_event.ResponseCreate.model_fields) - {"type"}
    missing = (http_fields | ws_fields) - set(VALUES)
    assert not missing, f"fields of the installed SDK with no value here: {sorted(missing)}"
    # The Literal fields are walked value by value.
    assert {"ultrafast", "flex", "auto", "priority"} <= set(VALUES["service_tier"])
    assert len(VALUES["include"]) == 1 + 8


def sent_value(field: str, value: Value, previous: str, conversation: str) -> Value:
    """``value`` as sent: the ids made just before in place of their stand-ins."""
    if field == "previous_response_id":
        return previous
    if field == "conversation":
        return conversation if isinstance(value, str) else {"id": conversation}
    return value


def body_for(field: str, value: Value, previous: str, conversation: str) -> dict[str, Any]:
    return {**BASE, field: sent_value(field, value, previous, conversation)}


def check_echo(field: str, value: Value, response: dict[str, Any]) -> str | None:
    echo = ECHO.get(field)
    try:
        if echo is None or echo(value)(response):
            return None
    except (KeyError, TypeError):
        pass  # absent, or null where an object was expected
    return f"{field}={value!r} not echoed: {response.get(field)!r}"


def sdk_error(exc: Any) -> tuple[int, str, str]:
    error = exc.body if isinstance(exc.body, dict) else {}
    error = error.get("error", error)
    return exc.status_code, error.get("code"), error.get("param")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_every_field_over_http(server: Any, stream: bool) -> None:
    import openai

    client = openai_client(server)
    transport = "sse" if stream else "http"
    previous = client.responses.create(**BASE).id
    conversation = client.conversations.create().id
    failures: list[str] = []
    for field, value in [*cases(), *CODEX_EXTRAS.items()]:
        body = body_for(field, value, previous, conversation)
        sent = sent_value(field, value, previous, conversation)
        extra = {}
        if field in ("generate", "stream_id", *CODEX_EXTRAS):
            extra = {field: body.pop(field)}  # not among the SDK's create params
        body["stream"] = stream  # the transport decides ``stream``
        refused = refusal(transport, field, value)
        try:
            response = _http_create(client, body, extra)
        except openai.APIStatusError as exc:
            if refused is None or sdk_error(exc) != refused:
                failures.append(f"{field}={value!r}: {sdk_error(exc)} {exc.message}")
            continue
        if refused is not None:
            failures.append(f"{field}={value!r}: accepted, expected {refused}")
            continue
        running = ("queued", "in_progress") if field == "background" else ()
        if response["status"] not in ("completed", *running):
            failures.append(f"{field}={value!r}: status {response['status']}")
        if (failure := check_echo(field, sent, response)) is not None:
            failures.append(failure)
    assert not failures, "\n".join(failures)


def _http_create(client: Any, body: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    if not body.get("stream"):
        response = client.responses.create(**body, extra_body=extra or None)
        result: dict[str, Any] = response.to_dict()
        return result
    last: dict[str, Any] | None = None
    with client.responses.create(**body, extra_body=extra or None) as events:
        for event in events:
            if event.type in ("response.completed", "response.queued", "response.failed"):
                last = event.response.to_dict()
            elif event.type == "response.created" and last is None:
                last = event.response.to_dict()
            if event.type == "response.queued":
                break
    assert last is not None
    return last


def test_every_field_over_the_shipped_websocket(server: Any) -> None:
    client = openai_client(server)
    failures: list[str] = []
    with client.responses.connect() as conn:
        conn.response.create(**BASE)
        previous = _ws_terminal(conn)["response"]["id"]
        conversation = client.conversations.create().id
        for field, value in [*cases(), *CODEX_EXTRAS.items()]:
            body = body_for(field, value, previous, conversation)
            sent = sent_value(field, value, previous, conversation)
            conn.send({"type": "response.create", **body})
            event = _ws_terminal(conn)
            refused = refusal("ws", field, value)
            if event["type"] == "error":
                error = event["error"]
                got = (event.get("status"), error.get("code"), error.get("param"))
                if refused is None or got != refused:
                    failures.append(f"{field}={value!r}: {got} {error.get('message')}")
                continue
            if refused is not None:
                failures.append(f"{field}={value!r}: accepted, expected {refused}")
                continue
            if event["type"] != "response.completed":
                failures.append(f"{field}={value!r}: {event['type']}")
                continue
            if (failure := check_echo(field, sent, event["response"])) is not None:
                failures.append(failure)
    assert not failures, "\n".join(failures)


def _ws_terminal(conn: Any) -> dict[str, Any]:
    """Events up to the response's terminal one or an ``error``; that event, as a dict."""
    while True:
        event = conn.recv()
        if event.type in ("response.completed", "response.failed", "response.incomplete", "error"):
            result: dict[str, Any] = event.to_dict()
            return result


async def test_every_field_in_append_mode(server: Any) -> None:
    failures: list[str] = []
    async with connect(server.url) as client:
        await client.create(**BASE)
        first = (await client.until_done())[-1]
        assert isinstance(first, ResponseDone)
        previous = first.response.id
        conversation = openai_client(server).conversations.create().id
        for field, value in [*cases(), *CODEX_EXTRAS.items()]:
            await client.create(**body_for(field, value, previous, conversation))
            last = (await client.until_done())[-1]
            refused = refusal("append", field, value)
            if isinstance(last, ErrorEvent):
                got = (last.status, last.error.code, last.error.param)
                if refused is None or got != refused:
                    failures.append(f"{field}={value!r}: {got} {last.error.message}")
                continue
            assert isinstance(last, ResponseDone), last
            if refused is not None:
                failures.append(f"{field}={value!r}: accepted, expected {refused}")
                continue
            response = msgspec.to_builtins(last.response)
            # A tool offered is called: append mode pauses for its output.
            paused = field == "tools" and response["status"] == "requires_action"
            if response["status"] != "completed" and not paused:
                failures.append(f"{field}={value!r}: status {response['status']}")
            if (failure := check_echo(field, value, response)) is not None:
                failures.append(failure)
    assert not failures, "\n".join(failures)


#: Bad values of the fields this schema added: the same code and param everywhere.
BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"service_tier": "turbo"}, "invalid_value", "service_tier"),
    ({"include": ["reasoning.encrypted_content", "nope"]}, "invalid_value", "include[1]"),
    ({"prompt_cache_retention": "1w"}, "invalid_value", "prompt_cache_retention"),
    ({"prompt_cache_options": {"ttl": "1h"}}, "invalid_value", "prompt_cache_options.ttl"),
    ({"client_metadata": {"turn": 1}}, "invalid_type", "client_metadata"),
    ({"prompt": {"version": "1"}}, "missing_required_parameter", "prompt.id"),
    ({"moderation": {"policy": None}}, "missing_required_parameter", "moderation.model"),
    (
        {"stream_options": {"include_obfuscation": "yes"}},
        "invalid_type",
        "stream_options.include_obfuscation",
    ),
    (
        {"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "x", "prompt_cache_breakpoint": {"mode": "implicit"}}
        ]}]},
        "invalid_value",
        "input[0].content[0].prompt_cache_breakpoint.mode",
    ),
]  # fmt: skip


def test_bad_values_get_the_same_error_on_every_transport(server: Any) -> None:
    import json

    import httpx

    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        for fields, code, param in BAD:
            answer = http.post("/v1/responses", json={**BASE, **fields})
            assert answer.status_code == 400, (fields, answer.text)
            error = answer.json()["error"]
            assert (error["code"], error["param"]) == (code, param), (fields, error)
    client = openai_client(server)
    with client.responses.connect() as conn:
        for fields, code, param in BAD:
            conn.send_raw(json.dumps({"type": "response.create", **BASE, **fields}))
            event = _ws_terminal(conn)
            assert event["type"] == "error", (fields, event)
            got = (event["status"], event["error"]["code"], event["error"]["param"])
            assert got == (400, code, param), (fields, event)


async def test_bad_values_in_append_mode(server: Any) -> None:
    import json

    async with connect(server.url) as client:
        for fields, code, param in BAD:
            await client.send_raw(json.dumps({"type": "response.create", **BASE, **fields}))
            event = await client.next_event()
            assert isinstance(event, ErrorEvent), (fields, event)
            assert (event.status, event.error.code, event.error.param) == (400, code, param)
