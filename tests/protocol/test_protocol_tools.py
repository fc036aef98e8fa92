"""Every tool type and client call kind at the protocol core: decoded, bad
shapes refused with a precise code and param, and every client call kind
tracked alike by ``call_id`` (SPEC "Tool types")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol import Connection, RemoteProtocolError, Role
from protocol.codec import decode_client_event, decode_create_body
from protocol.events import OutputItemDone, ResponseAppend, ResponseCreate, ResponseCreated
from protocol.items import (
    CustomToolCall,
    LocalShellCall,
    LocalShellExec,
    ShellAction,
    ShellCall,
    is_hosted,
)
from protocol.response import Response


def create(**fields: Any) -> bytes:
    return json.dumps({"type": "response.create", "model": "sim", **fields}).encode()


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"tools": [{"type": "namespace", "name": "ns", "tools": []}]},
         "missing_required_parameter", "tools[0].description"),
        ({"tools": [{"type": "namespace", "name": "ns", "description": "d",
                     "tools": [{"type": "web_search"}]}]},
         "invalid_value", "tools[0].tools[0].type"),
        ({"tools": [{"type": "custom"}]}, "missing_required_parameter", "tools[0].name"),
        ({"tools": [{"type": "custom", "name": "c",
                     "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}]},
         "invalid_value", "tools[0].format.syntax"),
        ({"tools": [{"type": "computer_use_preview", "display_width": 1,
                     "display_height": 1, "environment": "dos"}]},
         "invalid_value", "tools[0].environment"),
        ({"tools": [{"type": "file_search"}]},
         "missing_required_parameter", "tools[0].vector_store_ids"),
        ({"tools": [{"type": "mcp"}]}, "missing_required_parameter", "tools[0].server_label"),
        ({"tools": [{"type": "code_interpreter"}]},
         "missing_required_parameter", "tools[0].container"),
        ({"tools": [{"type": "web_search", "search_context_size": "huge"}]},
         "invalid_value", "tools[0].search_context_size"),
        ({"tools": [{"type": "teleport"}]}, "invalid_value", "tools[0].type"),
        ({"tool_choice": {"type": "allowed_tools", "mode": "sometimes", "tools": []}},
         "invalid_value", "tool_choice.mode"),
        ({"tool_choice": {"type": "custom"}}, "missing_required_parameter", "tool_choice.name"),
        ({"tool_choice": {"type": "mcp"}},
         "missing_required_parameter", "tool_choice.server_label"),
        ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "n"}]},
         "missing_required_parameter", "input[0].input"),
        ({"input": [{"type": "local_shell_call", "call_id": "c",
                     "action": {"type": "exec", "command": "ls", "env": {}}}]},
         "invalid_type", "input[0].action.command"),
        ({"input": [{"type": "shell_call", "call_id": "c", "action": {}}]},
         "missing_required_parameter", "input[0].action.commands"),
        ({"input": [{"type": "shell_call_output", "call_id": "c",
                     "output": [{"stdout": "", "stderr": "", "outcome": {"type": "crash"}}]}]},
         "invalid_value", "input[0].output[0].outcome.type"),
        ({"input": [{"type": "apply_patch_call", "call_id": "c",
                     "operation": {"type": "update_file", "path": "a"}}]},
         "missing_required_parameter", "input[0].operation.diff"),
        ({"input": [{"type": "apply_patch_call_output", "call_id": "c", "status": "ok"}]},
         "invalid_value", "input[0].status"),
        ({"input": [{"type": "computer_call_output", "call_id": "c",
                     "output": {"type": "image"}}]},
         "invalid_value", "input[0].output.type"),
    ],
)
def test_bad_shapes_are_refused_precisely(fields: dict[str, Any], code: str, param: str) -> None:
    for decode, data in (
        (decode_client_event, create(**fields)),
        (decode_create_body, json.dumps({"model": "sim", **fields}).encode()),
    ):
        with pytest.raises(RemoteProtocolError) as refused:
            decode(data)
        assert (refused.value.code, refused.value.param) == (code, param)


def test_every_sdk_tool_type_decodes() -> None:
    tools = [
        {"type": "function", "name": "f", "defer_loading": True},
        {"type": "custom", "name": "c", "format": {"type": "text"}},
        {"type": "namespace", "name": "ns", "description": "d",
         "tools": [{"type": "function", "name": "f"}, {"type": "custom", "name": "c"}]},
        {"type": "local_shell"}, {"type": "shell", "environment": {"type": "local"}},
        {"type": "apply_patch"}, {"type": "computer"},
        {"type": "computer_use_preview", "display_width": 8, "display_height": 8,
         "environment": "linux"},
        {"type": "file_search", "vector_store_ids": []},
        {"type": "web_search", "external_web_access": False},
        {"type": "web_search_2025_08_26"}, {"type": "web_search_preview"},
        {"type": "web_search_preview_2025_03_11"},
        {"type": "mcp", "server_label": "x", "require_approval": "never"},
        {"type": "code_interpreter", "container": "cntr_1"},
        {"type": "image_generation", "size": "1024x1024"},
        {"type": "tool_search"}, {"type": "programmatic_tool_calling"},
    ]
    event = decode_client_event(create(tools=tools))
    assert isinstance(event, ResponseCreate)
    hosted = [is_hosted(tool) for tool in event.tools]
    assert hosted == [False] * 8 + [True] * 10
    for choice in (
        {"type": "allowed_tools", "mode": "required", "tools": [{"type": "shell"}]},
        {"type": "custom", "name": "c"}, {"type": "mcp", "server_label": "x"},
        {"type": "apply_patch"}, {"type": "shell"}, {"type": "file_search"},
        {"type": "computer_use"}, {"type": "programmatic_tool_calling"},
    ):
        event = decode_client_event(create(tool_choice=choice))
        assert not isinstance(event.tool_choice, str)  # type: ignore[union-attr]


def paused_with(calls: list[Any]) -> Connection:
    """A server core with one response that has written ``calls``."""
    server = Connection(Role.SERVER)
    server.receive_message(create())
    assert isinstance(server.next_event(), ResponseCreate)
    response = Response(id="resp_1", created_at=0, status="in_progress", model="sim")
    events: list[Any] = [ResponseCreated(sequence_number=0, response=response)]
    for index, call in enumerate(calls, 1):
        events.append(OutputItemDone(sequence_number=index, output_index=index - 1, item=call))
    for event in events:
        server.send(event)
    return server


def test_every_call_kind_is_pending_until_its_own_output() -> None:
    calls = [
        CustomToolCall(call_id="c1", name="diff", input="x", id="ctc_1", status="completed"),
        LocalShellCall(call_id="c2", action=LocalShellExec(command=["ls"], env={})),
        ShellCall(call_id="c3", action=ShellAction(commands=["ls"])),
    ]
    server = paused_with(calls)
    track = server.response("resp_1")
    assert track is not None
    assert dict(track.pending_calls) == {"c1": "diff", "c2": "local_shell", "c3": "shell"}
    # Each bad append is refused whole and changes nothing.
    for outputs, code, param in (
        ([{"type": "local_shell_call_output", "output": "ok"}],
         "missing_required_parameter", "input[0].call_id"),
        ([{"type": "local_shell_call_output", "call_id": "nope", "output": "ok"}],
         "unknown_call_id", "input[0].call_id"),
        ([{"type": "shell_call_output", "call_id": "c3", "output": []},
          {"type": "function_call_output", "call_id": "c3", "output": "again"}],
         "duplicate_call_id", "input[1].call_id"),
    ):
        with pytest.raises(RemoteProtocolError) as refused:
            server.receive_message(append(outputs))
        assert (refused.value.code, refused.value.param) == (code, param)
        assert set(track.pending_calls) == {"c1", "c2", "c3"}
    # A local_shell_call_output may name its call by id (the SDK's field); any
    # kind of output answers a call of any kind by call_id.
    server.receive_message(
        append(
            [
                {"type": "local_shell_call_output", "id": "c2", "output": "ok"},
                {"type": "custom_tool_call_output", "call_id": "c1", "output": "ok"},
            ]
        )
    )
    assert isinstance(server.next_event(), ResponseAppend)
    assert set(track.pending_calls) == {"c3"}
    assert {"c1", "c2"} <= set(track.answered_calls)


def append(outputs: list[dict[str, Any]]) -> bytes:
    return json.dumps({"type": "response.append", "input": outputs}).encode()
