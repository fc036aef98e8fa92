"""Every tool type of the official SDKs' ``Tool`` union, on every transport
(SPEC "Tool types"): client-executed kinds are called in their own item
shapes and answered by their own outputs; hosted kinds are echoed, never
called, or refused under ``--hosted-tools refuse``."""

from __future__ import annotations

import json
import logging
from typing import Any

import msgspec
import openai
import pytest

from longresponse.client import connect
from protocol import wire_type
from protocol.events import OutputItemDone, ResponseDone
from tests.conftest import openai_client

NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "parameters": {
                "type": "object",
                "properties": {
                    "message": {"type": "string"},
                    "max_output_tokens": {"type": "number", "minimum": 1},
                    "yield_time_ms": {"type": "integer", "maximum": 30000},
                },
                "required": ["message"],
            },
        }
    ],
}
CUSTOM = {"type": "custom", "name": "apply_diff", "description": "Free text."}
#: One of each client-executed kind, each with the item shape it is called in.
CLIENT_KINDS: list[tuple[dict[str, Any], str]] = [
    ({"type": "function", "name": "run", "parameters": {"type": "object"}}, "function_call"),
    (CUSTOM, "custom_tool_call"),
    (NAMESPACE, "function_call"),
    ({"type": "local_shell"}, "local_shell_call"),
    ({"type": "shell"}, "shell_call"),
    ({"type": "apply_patch"}, "apply_patch_call"),
    ({"type": "computer"}, "computer_call"),
    (
        {
            "type": "computer_use_preview",
            "display_width": 1024,
            "display_height": 768,
            "environment": "browser",
        },
        "computer_call",
    ),
]
#: The hosted kinds echoed and never run (``mcp`` is run: tests/hosted).
HOSTED: list[dict[str, Any]] = [
    {"type": "web_search", "external_web_access": False},
    {"type": "web_search_2025_08_26"},
    {"type": "web_search_preview"},
    {"type": "web_search_preview_2025_03_11"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "image_generation"},
    {"type": "tool_search"},
    {"type": "programmatic_tool_calling"},
]


def output_for(call: dict[str, Any]) -> dict[str, Any]:
    """The client's answer to a call, in the output shape of its kind."""
    kind, call_id = call["type"], call["call_id"]
    if kind == "function_call":
        return {"type": "function_call_output", "call_id": call_id, "output": "fn-ok"}
    if kind == "custom_tool_call":
        return {"type": "custom_tool_call_output", "call_id": call_id, "output": "custom-ok"}
    if kind == "local_shell_call":
        return {"type": "local_shell_call_output", "call_id": call_id, "output": "hello"}
    if kind == "shell_call":
        return {
            "type": "shell_call_output",
            "call_id": call_id,
            "output": [
                {"stdout": "hello\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
            ],
        }
    if kind == "apply_patch_call":
        return {
            "type": "apply_patch_call_output",
            "call_id": call_id,
            "status": "completed",
            "output": "patched",
        }
    return {
        "type": "computer_call_output",
        "call_id": call_id,
        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="},
    }


def check_call(call: dict[str, Any], kind: str) -> None:
    """The call is its kind's shape, with arguments a real client can run."""
    assert call["type"] == kind, call
    if kind == "function_call" and call.get("namespace") == "multi_agent_v1":
        args = json.loads(call["arguments"])
        assert call["name"] == "spawn_agent"
        assert isinstance(args["max_output_tokens"], int)
        assert args["max_output_tokens"] >= 1
        assert isinstance(args["yield_time_ms"], int)
        assert args["yield_time_ms"] <= 30000
    elif kind == "custom_tool_call":
        assert call["name"] == "apply_diff"
        assert call["input"]
    elif kind == "local_shell_call":
        assert call["action"] == {"type": "exec", "command": ["echo", "hello"], "env": {}}
    elif kind == "shell_call":
        assert call["action"]["commands"] == ["echo hello"]
    elif kind == "apply_patch_call":
        assert call["operation"]["type"] == "create_file"
        assert call["operation"]["path"]
    elif kind == "computer_call":
        assert call["action"] == {"type": "screenshot"}


@pytest.mark.parametrize(("tool", "kind"), CLIENT_KINDS, ids=lambda v: str(v)[:30])
def test_each_client_kind_over_http_is_called_and_answered(
    server: Any, tool: dict[str, Any], kind: str
) -> None:
    client = openai_client(server)
    first = client.responses.create(model="sim", input="go", tools=[tool, HOSTED[0]])
    assert [t.type for t in first.tools] == [tool["type"], "web_search"]
    (call,) = [item.model_dump(exclude_none=True) for item in first.output]
    check_call(call, kind)
    assert first.status == "completed"
    answer = output_for(call)
    done = client.responses.create(
        model="sim", previous_response_id=first.id, input=[answer], tools=[tool]
    )
    text = done.output_text
    assert f"[{call['call_id']}]" in text, text


@pytest.mark.parametrize(("tool", "kind"), CLIENT_KINDS, ids=lambda v: str(v)[:30])
def test_each_client_kind_over_the_shipped_websocket(
    server: Any, tool: dict[str, Any], kind: str
) -> None:
    client = openai_client(server)
    with client.responses.connect() as conn:
        conn.response.create(model="sim", input="go", tools=[tool])
        while (event := conn.recv()).type != "response.completed":
            assert event.type != "error", event
        (call,) = [item.model_dump(exclude_none=True) for item in event.response.output]
        check_call(call, kind)
        conn.response.create(
            model="sim",
            previous_response_id=event.response.id,
            input=[output_for(call)],
            tools=[tool],
        )
        while (event := conn.recv()).type != "response.completed":
            assert event.type != "error", event
        assert f"[{call['call_id']}]" in event.response.output_text


async def test_append_mode_pauses_for_every_kind_at_once(server: Any) -> None:
    """One turn calls every client kind in parallel; the pause waits for all of
    them, whatever their kind, and each is answered by its own output."""
    tools = [tool for tool, _ in CLIENT_KINDS if tool["type"] != "computer_use_preview"]
    async with connect(server.url) as client:
        await client.create(
            model="sim",
            input="go",
            tools=[*tools, *HOSTED],
            metadata={"sim_tool_calls": str(len(tools)), "sim_parallel_calls": str(len(tools))},
        )
        events = await client.until_done()
        paused = events[-1]
        assert isinstance(paused, ResponseDone)
        assert paused.response.status == "requires_action"
        calls = [msgspec.to_builtins(e.item) for e in events if isinstance(e, OutputItemDone)]
        kinds = sorted(kind for tool, kind in CLIENT_KINDS if tool in tools)
        assert sorted(c["type"] for c in calls) == kinds
        assert len(paused.response.required_action.call_ids) == len(tools)  # type: ignore[union-attr]
        # Answer all but one: still paused on that one.
        await client.append([output_for(call) for call in calls[:-1]])
        await client.append([output_for(calls[-1])])
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"
        text = done.response.output[-1].content[0].text  # type: ignore[union-attr]
        for call in calls:
            assert f"[{call['call_id']}]" in text
        echoed = [wire_type(t) for t in done.response.tools]  # type: ignore[union-attr]
        assert echoed[-len(HOSTED) :] == [t["type"] for t in HOSTED]


def test_namespace_and_custom_loop_with_the_sdk(server: Any) -> None:
    """Codex's shape: a namespace of functions, a custom tool and web_search;
    two calls, answered by a function_call_output and a custom_tool_call_output."""
    client = openai_client(server)
    tools = [NAMESPACE, CUSTOM, {"type": "web_search", "external_web_access": False}]
    meta = {"sim_tool_calls": "2", "sim_parallel_calls": "2"}
    first = client.responses.create(model="sim", input="go", tools=tools, metadata=meta)
    calls = [item.model_dump(exclude_none=True) for item in first.output]
    assert [c["type"] for c in calls] == ["function_call", "custom_tool_call"]
    assert calls[0]["namespace"] == "multi_agent_v1"
    done = client.responses.create(
        model="sim",
        previous_response_id=first.id,
        input=[output_for(c) for c in calls],
        tools=tools,
        metadata=meta,
    )
    assert "«fn-ok»" in done.output_text
    assert "«custom-ok»" in done.output_text
    assert [t.type for t in done.tools] == ["namespace", "custom", "web_search"]


def test_hosted_tools_are_echoed_never_called(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = openai_client(server)
    with caplog.at_level(logging.INFO, logger="longresponse.engine.admission"):
        response = client.responses.create(model="sim", input="search", tools=HOSTED)
    assert [t.type for t in response.tools] == [t["type"] for t in HOSTED]
    assert response.tools[0].external_web_access is False  # type: ignore[union-attr]
    assert [item.type for item in response.output] == ["message"]
    assert any("hosted tools accepted" in r.getMessage() for r in caplog.records)
    with client.responses.connect() as conn:
        conn.response.create(model="sim", input="search", tools=HOSTED)
        while (event := conn.recv()).type != "response.completed":
            assert event.type != "error", event
        assert [item.type for item in event.response.output] == ["message"]


async def test_hosted_tools_refused_under_the_policy(make_server: Any) -> None:
    running = make_server(hosted_tools="refuse")
    client = openai_client(running)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="sim", input="go", tools=[NAMESPACE, HOSTED[0]])
    assert refused.value.code == "invalid_value"
    assert refused.value.param == "tools[1].type"
    # Client-executed kinds still pass, on the same server.
    ok = client.responses.create(model="sim", input="go", tools=[NAMESPACE, CUSTOM])
    assert ok.status == "completed"
    async with connect(running.url) as ws:
        await ws.create(model="sim", input="go", tools=[HOSTED[4]])
        error = await ws.next_event()
        assert error.error.code == "invalid_value"  # type: ignore[union-attr]
        assert error.error.param == "tools[0].type"  # type: ignore[union-attr]
        await ws.create(model="sim", input="go")  # the connection stays usable
        assert (await ws.until_done())[-1].response.status == "completed"  # type: ignore[union-attr]
