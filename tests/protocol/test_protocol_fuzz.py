"""Hypothesis invariants of the protocol core.

- encode/decode round-trips every client and server event type;
- garbage in (bytes, text, JSON values, mutated events) raises only
  :class:`RemoteProtocolError`, and a rejected message changes nothing;
- the per-response state machine follows :data:`TRANSITIONS` exactly;
- random legal conversations keep client and server in agreement, and the
  illegal moves they try are refused alike by both ends.

Every test runs with a fixed seed (``derandomize``) and no example database,
so the suite is deterministic.
"""

from __future__ import annotations

import typing
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from msgspec import UNSET

import protocol as p
from protocol import (
    TERMINAL_STATES,
    TRANSITIONS,
    Connection,
    ErrorCode,
    LocalProtocolError,
    RemoteProtocolError,
    ResponseState,
    ResponseStateMachine,
    Role,
    Transition,
    decode_client_event,
    decode_server_event,
    encode_event,
    wire_type,
)
from protocol.events import CLIENT_EVENT_TYPES, SERVER_EVENT_TYPES
from tests.support.connection_pair import queued_events

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow],
)

# --- strategies --------------------------------------------------------------

texts = st.text(max_size=12)
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=10)
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | finite_floats
    | texts
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
json_objects = st.dictionaries(texts, json_values, max_size=3)


def unset_or(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.just(UNSET) | strategy


def none_or(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


item_status = st.sampled_from(["in_progress", "completed", "incomplete"])
content_parts = st.one_of(
    st.builds(p.items.InputText, text=texts),
    st.builds(
        p.items.OutputText,
        text=texts,
        annotations=st.lists(json_values, max_size=2),
        logprobs=unset_or(st.lists(json_values, max_size=2)),
    ),
    st.builds(p.items.Refusal, refusal=texts),
    st.builds(
        p.items.InputImage,
        detail=st.sampled_from(["auto", "low", "high"]),
        image_url=unset_or(none_or(texts)),
        file_id=unset_or(none_or(ids)),
    ),
    st.builds(
        p.items.InputFile,
        file_id=unset_or(none_or(ids)),
        file_data=unset_or(texts),
        file_url=unset_or(texts),
        filename=unset_or(texts),
    ),
    st.builds(p.items.ReasoningText, text=texts),
)
contents = texts | st.lists(content_parts, max_size=3)
messages = st.builds(
    p.items.Message,
    role=st.sampled_from(["user", "assistant", "system", "developer"]),
    content=contents,
    id=unset_or(ids),
    status=unset_or(item_status),
    phase=unset_or(none_or(st.sampled_from(["commentary", "final_answer"]))),
)
function_calls = st.builds(
    p.items.FunctionCall,
    call_id=ids,
    name=ids,
    arguments=texts,
    id=unset_or(ids),
    status=unset_or(item_status),
    namespace=unset_or(none_or(ids)),
)
function_call_outputs = st.builds(
    p.items.FunctionCallOutput,
    call_id=ids,
    output=contents,
    id=unset_or(ids),
    status=unset_or(item_status),
)
reasonings = st.builds(
    p.items.Reasoning,
    id=unset_or(ids),
    summary=st.lists(st.builds(p.items.SummaryText, text=texts), max_size=2),
    content=unset_or(st.lists(st.builds(p.items.ReasoningText, text=texts), max_size=2)),
    encrypted_content=unset_or(none_or(texts)),
    status=unset_or(item_status),
)
compactions = st.builds(
    p.items.Compaction, encrypted_content=texts, id=unset_or(ids), created_by=unset_or(ids)
)
compaction_triggers = st.builds(p.items.CompactionTrigger, id=unset_or(ids))
# The other client-executed calls and their outputs (SPEC "Tool types").
other_calls = st.one_of(
    st.builds(
        p.items.CustomToolCall,
        call_id=ids,
        name=ids,
        input=texts,
        id=unset_or(ids),
        status=unset_or(item_status),
        namespace=unset_or(none_or(ids)),
    ),
    st.builds(p.items.CustomToolCallOutput, call_id=ids, output=contents, id=unset_or(ids)),
    st.builds(
        p.items.LocalShellCall,
        call_id=ids,
        action=st.builds(
            p.items.LocalShellExec,
            command=st.lists(texts, max_size=3),
            env=st.dictionaries(ids, texts, max_size=2),
            timeout_ms=unset_or(none_or(st.integers(0, 10**6))),
        ),
        id=unset_or(ids),
        status=unset_or(item_status),
    ),
    st.builds(p.items.LocalShellCallOutput, output=texts, id=unset_or(ids), call_id=unset_or(ids)),
    st.builds(
        p.items.ShellCall,
        call_id=ids,
        action=st.builds(p.items.ShellAction, commands=st.lists(texts, max_size=3)),
        id=unset_or(ids),
    ),
    st.builds(
        p.items.ShellCallOutput,
        call_id=ids,
        output=st.lists(
            st.builds(
                p.items.ShellOutput,
                stdout=texts,
                stderr=texts,
                outcome=st.builds(p.items.ShellTimeout)
                | st.builds(p.items.ShellExit, exit_code=st.integers(0, 255)),
            ),
            max_size=2,
        ),
    ),
    st.builds(
        p.items.ApplyPatchCall,
        call_id=ids,
        operation=st.one_of(
            st.builds(p.items.CreateFile, path=texts, diff=texts),
            st.builds(p.items.UpdateFile, path=texts, diff=texts),
            st.builds(p.items.DeleteFile, path=texts),
        ),
        status=unset_or(st.sampled_from(["in_progress", "completed"])),
    ),
    st.builds(
        p.items.ApplyPatchCallOutput,
        call_id=ids,
        status=st.sampled_from(["completed", "failed"]),
        output=unset_or(none_or(texts)),
    ),
    st.builds(p.items.ComputerCall, call_id=ids, action=unset_or(json_objects)),
    st.builds(
        p.items.ComputerCallOutput,
        call_id=ids,
        output=st.builds(p.items.ComputerScreenshot, image_url=unset_or(texts)),
    ),
)
mcp_items = st.one_of(
    st.builds(
        p.items.McpListTools,
        server_label=ids,
        tools=st.lists(
            st.builds(
                p.items.McpListedTool,
                name=ids,
                input_schema=json_objects,
                description=unset_or(none_or(texts)),
            ),
            max_size=2,
        ),
        id=unset_or(ids),
        error=unset_or(none_or(texts)),
    ),
    st.builds(
        p.items.McpCall,
        server_label=ids,
        name=ids,
        arguments=texts,
        id=unset_or(ids),
        output=unset_or(none_or(texts)),
        error=unset_or(none_or(json_objects)),
        status=unset_or(st.sampled_from(["in_progress", "completed", "calling", "failed"])),
    ),
    st.builds(p.items.McpApprovalRequest, id=ids, server_label=ids, name=ids, arguments=texts),
    st.builds(
        p.items.McpApprovalResponse,
        approval_request_id=ids,
        approve=st.booleans(),
        id=unset_or(none_or(ids)),
        reason=unset_or(none_or(texts)),
    ),
)
items = st.one_of(
    messages,
    function_calls,
    function_call_outputs,
    other_calls,
    reasonings,
    mcp_items,
    compactions,
    compaction_triggers,
)
function_tools = st.builds(
    p.items.FunctionTool,
    name=ids,
    parameters=none_or(json_objects),
    strict=none_or(st.booleans()),
    description=none_or(texts),
)
custom_tools = st.builds(
    p.items.CustomTool,
    name=ids,
    description=unset_or(none_or(texts)),
    format=unset_or(
        st.builds(p.items.CustomTextFormat)
        | st.builds(
            p.items.CustomGrammarFormat,
            definition=texts,
            syntax=st.sampled_from(["lark", "regex"]),
        )
    ),
)
tools = st.one_of(
    function_tools,
    custom_tools,
    st.builds(
        p.items.NamespaceTool,
        name=ids,
        description=texts,
        tools=st.lists(function_tools | custom_tools, max_size=2),
    ),
    st.builds(p.items.LocalShellTool),
    st.builds(p.items.ShellTool),
    st.builds(p.items.ApplyPatchTool),
    st.builds(p.items.ComputerTool),
    st.builds(
        p.items.ComputerUsePreviewTool,
        display_height=st.integers(1, 4096),
        display_width=st.integers(1, 4096),
        environment=st.sampled_from(["windows", "mac", "linux", "ubuntu", "browser"]),
    ),
    st.builds(p.items.WebSearchTool, external_web_access=unset_or(none_or(st.booleans()))),
    st.builds(p.items.WebSearchPreviewTool20250311),
    st.builds(p.items.FileSearchTool, vector_store_ids=st.lists(ids, max_size=2)),
    st.builds(p.items.McpTool, server_label=ids, server_url=unset_or(texts)),
    st.builds(p.items.CodeInterpreterTool, container=ids),
    st.builds(p.items.ImageGenerationTool),
    st.builds(p.items.ToolSearchTool),
    st.builds(p.items.ProgrammaticToolCallingTool),
)
tool_choices = st.one_of(
    st.sampled_from(["auto", "none", "required"]),
    st.builds(p.items.ToolChoiceFunction, name=ids),
    st.builds(p.items.ToolChoiceCustom, name=ids),
    st.builds(
        p.items.ToolChoiceAllowed,
        mode=st.sampled_from(["auto", "required"]),
        tools=st.lists(st.builds(dict, type=st.just("function"), name=ids), max_size=2),
    ),
    st.builds(p.items.ToolChoiceMcp, server_label=ids, name=unset_or(none_or(ids))),
    st.builds(p.items.ToolChoiceShell),
    st.builds(p.items.ToolChoiceApplyPatch),
    st.builds(p.items.ToolChoiceWebSearchPreview),
)
statuses = st.sampled_from(typing.get_args(p.response.ResponseStatus))
reasoning_configs = st.builds(
    p.response.ReasoningConfig,
    effort=none_or(st.sampled_from(typing.get_args(p.response.ReasoningEffort))),
    summary=none_or(st.sampled_from(typing.get_args(p.response.ReasoningSummary))),
)
text_formats = st.one_of(
    st.builds(p.response.FormatText),
    st.builds(p.response.FormatJSONObject),
    st.builds(
        p.response.FormatJSONSchema,
        name=ids,
        schema=json_objects,
        description=none_or(texts),
        strict=none_or(st.booleans()),
    ),
)
text_configs = st.builds(
    p.response.TextConfig,
    format=text_formats,
    verbosity=unset_or(st.sampled_from(["low", "medium", "high"])),
)
usages = st.builds(
    p.response.Usage,
    input_tokens=st.integers(0, 10**9),
    input_tokens_details=st.builds(
        p.response.InputTokensDetails,
        cached_tokens=st.integers(0, 10**9),
        cache_write_tokens=st.integers(0, 10**9),
    ),
    output_tokens=st.integers(0, 10**9),
    output_tokens_details=st.builds(
        p.response.OutputTokensDetails, reasoning_tokens=st.integers(0, 10**9)
    ),
    total_tokens=st.integers(0, 10**9),
)
responses = st.builds(
    p.response.Response,
    id=ids,
    created_at=st.integers(0, 2**40),
    status=statuses,
    background=st.booleans(),
    completed_at=none_or(st.integers(0, 2**40)),
    error=none_or(st.builds(p.response.ResponseError, code=ids, message=texts)),
    incomplete_details=none_or(st.builds(p.response.IncompleteDetails, reason=ids)),
    instructions=none_or(texts),
    max_output_tokens=none_or(st.integers(1, 10**6)),
    model=ids,
    output=st.lists(items, max_size=2),
    previous_response_id=none_or(ids),
    reasoning=none_or(reasoning_configs),
    temperature=finite_floats,
    presence_penalty=finite_floats,
    frequency_penalty=finite_floats,
    text=text_configs,
    tool_choice=tool_choices,
    tools=st.lists(tools, max_size=2),
    truncation=st.sampled_from(["auto", "disabled"]),
    usage=none_or(usages),
    metadata=st.dictionaries(texts, texts, max_size=2),
    required_action=unset_or(
        st.builds(p.response.RequiredAction, call_ids=st.lists(ids, max_size=3))
    ),
)
sequence_numbers = st.integers(0, 2**53)
stream_ids = unset_or(ids)

CLIENT_EVENTS: dict[type[msgspec.Struct], st.SearchStrategy[Any]] = {
    p.events.ResponseCreate: st.builds(
        p.events.ResponseCreate,
        model=unset_or(ids),
        input=texts | st.lists(items, max_size=3),
        instructions=none_or(texts),
        tools=st.lists(tools, max_size=2),
        tool_choice=tool_choices,
        parallel_tool_calls=st.booleans(),
        metadata=st.dictionaries(texts, texts, max_size=2),
        store=st.booleans(),
        previous_response_id=none_or(ids),
        temperature=none_or(st.floats(0, 2)),
        top_p=none_or(st.floats(0, 1)),
        presence_penalty=none_or(st.floats(-2, 2)),
        frequency_penalty=none_or(st.floats(-2, 2)),
        top_logprobs=none_or(st.integers(0, 20)),
        max_output_tokens=none_or(st.integers(1, 10**6)),
        reasoning=none_or(reasoning_configs),
        text=none_or(text_configs),
        truncation=none_or(st.sampled_from(["auto", "disabled"])),
        include=none_or(st.lists(st.sampled_from(sorted(p.events.INCLUDABLE)), max_size=2)),
        service_tier=none_or(st.sampled_from(sorted(p.events.SERVICE_TIERS))),
        prompt_cache_retention=none_or(st.sampled_from(["in_memory", "24h"])),
        conversation=none_or(ids | st.builds(p.response.ConversationRef, id=ids)),
        prompt=none_or(
            st.builds(
                p.response.PromptRef,
                id=ids,
                version=none_or(ids),
                variables=none_or(st.dictionaries(ids, texts, max_size=2)),
            )
        ),
        client_metadata=none_or(st.dictionaries(texts, texts, max_size=2)),
        stream=none_or(st.booleans()),
        stream_options=none_or(
            st.builds(p.events.StreamOptions, include_obfuscation=none_or(st.booleans()))
        ),
        stream_id=stream_ids,
        generate=none_or(st.booleans()),
        context_management=none_or(
            st.lists(
                st.builds(
                    p.events.ContextManagement,
                    type=ids,
                    compact_threshold=none_or(st.integers(0, 10**9)),
                ),
                max_size=2,
            )
        ),
        prompt_cache_options=none_or(
            st.builds(p.events.PromptCacheOptions, prewarm=none_or(st.booleans()))
        ),
        multi_agent=none_or(
            st.builds(
                p.events.MultiAgent,
                enabled=st.booleans(),
                max_concurrent_subagents=unset_or(st.integers(1, 99)),
            )
        ),
    ),
    p.events.ResponseAppend: st.builds(
        p.events.ResponseAppend, input=texts | st.lists(items, max_size=3), response_id=none_or(ids)
    ),
    p.events.ResponseCancel: st.builds(p.events.ResponseCancel, response_id=none_or(ids)),
    p.events.ResponseResume: st.builds(p.events.ResponseResume, response_id=ids),
    p.events.ResponseProcessed: st.builds(p.events.ResponseProcessed, response_id=none_or(ids)),
    p.events.ResponseSteer: st.builds(
        p.events.ResponseSteer,
        previous_response_id=ids,
        input=st.one_of(texts, st.lists(items, max_size=3)),
    ),
    p.events.ResponseInject: st.builds(
        p.events.ResponseInject, response_id=ids, input=st.lists(items, max_size=3)
    ),
}


def lifecycle(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    return st.builds(
        cls, sequence_number=sequence_numbers, stream_id=stream_ids, response=responses
    )


def item_event(
    cls: type[msgspec.Struct], **fields: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    return st.builds(
        cls,
        sequence_number=sequence_numbers,
        stream_id=stream_ids,
        response_id=unset_or(ids),
        **fields,
    )


parts = st.one_of(
    st.builds(p.items.OutputText, text=texts),
    st.builds(p.items.Refusal, refusal=texts),
    content_parts,
)
text_position = {
    "item_id": ids,
    "output_index": st.integers(0, 10**4),
    "content_index": st.integers(0, 10**2),
}
SERVER_EVENTS: dict[type[msgspec.Struct], st.SearchStrategy[Any]] = {
    p.events.ResponseCreated: lifecycle(p.events.ResponseCreated),
    p.events.ResponseQueued: lifecycle(p.events.ResponseQueued),
    p.events.ResponseResumed: lifecycle(p.events.ResponseResumed),
    p.events.ResponseInProgress: lifecycle(p.events.ResponseInProgress),
    p.events.ResponseDone: lifecycle(p.events.ResponseDone),
    p.events.ResponseCompleted: lifecycle(p.events.ResponseCompleted),
    p.events.ResponseIncomplete: lifecycle(p.events.ResponseIncomplete),
    p.events.ResponseFailed: lifecycle(p.events.ResponseFailed),
    p.events.OutputItemAdded: item_event(
        p.events.OutputItemAdded, output_index=st.integers(0, 99), item=items
    ),
    p.events.OutputItemDone: item_event(
        p.events.OutputItemDone, output_index=st.integers(0, 99), item=items
    ),
    p.events.ContentPartAdded: item_event(p.events.ContentPartAdded, **text_position, part=parts),
    p.events.ContentPartDone: item_event(p.events.ContentPartDone, **text_position, part=parts),
    p.events.OutputTextDelta: item_event(
        p.events.OutputTextDelta,
        **text_position,
        delta=texts,
        logprobs=st.lists(json_values, max_size=2),
    ),
    p.events.OutputTextDone: item_event(p.events.OutputTextDone, **text_position, text=texts),
    p.events.FunctionCallArgumentsDelta: item_event(
        p.events.FunctionCallArgumentsDelta,
        item_id=ids,
        output_index=st.integers(0, 99),
        delta=texts,
    ),
    p.events.McpCallArgumentsDelta: item_event(
        p.events.McpCallArgumentsDelta, item_id=ids, output_index=st.integers(0, 99), delta=texts
    ),
    p.events.McpCallArgumentsDone: item_event(
        p.events.McpCallArgumentsDone,
        item_id=ids,
        output_index=st.integers(0, 99),
        arguments=texts,
    ),
    **{
        cls: item_event(cls, item_id=ids, output_index=st.integers(0, 99))
        for cls in (
            p.events.McpCallInProgress,
            p.events.McpCallCompleted,
            p.events.McpCallFailed,
            p.events.McpListToolsInProgress,
            p.events.McpListToolsCompleted,
            p.events.McpListToolsFailed,
        )
    },
    p.events.CompactionCompacting: item_event(
        p.events.CompactionCompacting, item_id=ids, output_index=st.integers(0, 99)
    ),
    p.events.FunctionCallArgumentsDone: item_event(
        p.events.FunctionCallArgumentsDone,
        item_id=ids,
        output_index=st.integers(0, 99),
        name=ids,
        arguments=texts,
    ),
    p.events.ErrorEvent: st.builds(
        p.events.ErrorEvent,
        error=st.builds(
            p.events.ErrorBody,
            type=ids,
            code=none_or(ids),
            message=texts,
            param=none_or(texts),
        ),
        status=unset_or(st.integers(400, 599)),
        sequence_number=unset_or(sequence_numbers),
        stream_id=stream_ids,
        response_id=unset_or(ids),
    ),
    p.events.TimingEvent: st.builds(
        p.events.TimingEvent,
        timing_metrics=st.dictionaries(ids, finite_floats, max_size=3),
        response_id=unset_or(ids),
        stream_id=stream_ids,
    ),
    p.events.ResponseInjectCreated: st.builds(
        p.events.ResponseInjectCreated,
        sequence_number=sequence_numbers,
        stream_id=stream_ids,
        response_id=ids,
    ),
    p.events.Keepalive: st.builds(
        p.events.Keepalive,
        sequence_number=sequence_numbers,
        stream_id=stream_ids,
        response_id=unset_or(ids),
    ),
    p.events.ResponseInjectFailed: st.builds(
        p.events.ResponseInjectFailed,
        sequence_number=sequence_numbers,
        stream_id=stream_ids,
        response_id=ids,
        input=st.lists(items, max_size=3),
        error=st.builds(p.response.ResponseError, code=ids, message=texts),
    ),
    p.events.ResponseSteerAccepted: st.builds(
        p.events.ResponseSteerAccepted,
        sequence_number=sequence_numbers,
        stream_id=stream_ids,
        steer=st.builds(p.events.SteerReceipt, id=ids, previous_response_id=ids),
    ),
    p.events.ResponseSteerPending: st.builds(
        p.events.ResponseSteerPending,
        sequence_number=sequence_numbers,
        stream_id=stream_ids,
        steer=st.builds(p.events.SteerReceipt, id=ids, previous_response_id=ids),
        reason=ids,
        required_input=st.lists(
            st.builds(p.events.SteerRequiredInput, type=ids, call_id=ids, name=ids), max_size=2
        ),
    ),
    p.events.ResponseSteerFailed: st.builds(
        p.events.ResponseSteerFailed,
        sequence_number=sequence_numbers,
        stream_id=stream_ids,
        steer=st.builds(
            p.events.SteerFailure,
            previous_response_id=ids,
            input=texts,
            id=unset_or(ids),
        ),
        error=st.builds(p.events.SteerError, code=ids, message=texts),
    ),
}
client_events = st.one_of(*CLIENT_EVENTS.values())
server_events = st.one_of(*SERVER_EVENTS.values())


def tag(event_or_class: msgspec.Struct | type[msgspec.Struct]) -> str:
    return wire_type(event_or_class)


def test_strategies_cover_every_event_type() -> None:
    assert set(CLIENT_EVENTS) == set(typing.get_args(p.events.ClientEvent))
    assert set(SERVER_EVENTS) == set(typing.get_args(p.events.ServerEvent))
    assert {tag(cls) for cls in CLIENT_EVENTS} == CLIENT_EVENT_TYPES
    assert {tag(cls) for cls in SERVER_EVENTS} == SERVER_EVENT_TYPES


# --- round trips -------------------------------------------------------------


@FUZZ
@given(event=client_events)
def test_client_events_round_trip(event: Any) -> None:
    data = encode_event(event)
    assert msgspec.json.decode(data)["type"] == tag(event)
    assert decode_client_event(data) == event
    assert decode_client_event(data.decode()) == event


@FUZZ
@given(event=server_events)
def test_server_events_round_trip(event: Any) -> None:
    data = encode_event(event)
    assert msgspec.json.decode(data)["type"] == tag(event)
    assert decode_server_event(data) == event
    assert decode_server_event(data.decode()) == event


@FUZZ
@given(
    event=st.builds(
        p.events.ResponseAppend,
        input=st.lists(messages | function_call_outputs, min_size=1, max_size=3),
        response_id=none_or(ids),
    )
)
def test_untyped_input_messages_decode_as_messages(event: Any) -> None:
    raw = msgspec.json.decode(encode_event(event))
    for item in raw["input"]:
        if item["type"] == "message":
            del item["type"]
    assert decode_client_event(msgspec.json.encode(raw)) == event


# --- garbage in: only RemoteProtocolError, and nothing changes ---------------


def snapshot(conn: Connection) -> Any:
    tracks = {
        rid: (t.state, t.next_sequence, dict(t.pending_calls), set(t.answered_calls))
        for rid, t in conn.responses.items()
    }
    return tracks, dict(conn.lanes), queued_events(conn)


def busy_connection(role: Role) -> Connection:
    """A connection with one paused response (call ``c1`` pending) and one finished."""
    conn = Connection(role)
    server = Connection(Role.SERVER)
    paused = p.response.Response(id="resp_1", created_at=0, status="in_progress", model="m")
    done = p.response.Response(id="resp_2", created_at=0, status="completed", model="m")
    call = p.items.FunctionCall(call_id="c1", name="add", arguments="{}")
    script: list[Any] = [
        p.events.ResponseCreated(sequence_number=0, response=done),
        p.events.ResponseDone(sequence_number=1, response=done),
        p.events.ResponseCreated(sequence_number=0, response=paused),
        p.events.OutputItemDone(sequence_number=1, response_id="resp_1", output_index=0, item=call),
        p.events.ResponseDone(
            sequence_number=2,
            response=msgspec.structs.replace(paused, status="requires_action"),
        ),
    ]
    for event in script:
        data = server.send(event)
        if role is Role.CLIENT:
            conn.receive_message(data)
        else:
            conn.send(event)
    while conn.next_event() is not p.NEED_DATA:
        pass
    return conn


def assert_only_remote_errors(data: bytes | str) -> None:
    for role in (Role.CLIENT, Role.SERVER):
        conn = busy_connection(role)
        before = snapshot(conn)
        error: RemoteProtocolError | None = None
        try:
            conn.receive_message(data)
        except RemoteProtocolError as exc:  # anything else fails the test
            error = exc
        if error is None:
            assert conn.next_event() is not p.NEED_DATA
        else:
            assert error.code in set(ErrorCode)
            assert snapshot(conn) == before


@FUZZ
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes(data: bytes) -> None:
    assert_only_remote_errors(data)


@FUZZ
@given(data=st.text(max_size=200))
def test_arbitrary_text(data: str) -> None:
    assert_only_remote_errors(data)


@FUZZ
@given(value=json_values)
def test_arbitrary_json_values(value: Any) -> None:
    assert_only_remote_errors(msgspec.json.encode(value))


all_types = sorted(CLIENT_EVENT_TYPES | SERVER_EVENT_TYPES)
field_names = sorted(
    {name for cls in (*CLIENT_EVENTS, *SERVER_EVENTS) for name in cls.__struct_fields__}
    | {"call_id", "role", "content", "output", "id", "status"}
)
event_shaped = st.builds(
    lambda type_, fields: {**fields, "type": type_},
    st.sampled_from(all_types) | texts,
    st.dictionaries(st.sampled_from(field_names), json_values, max_size=5),
)


@FUZZ
@given(value=event_shaped)
def test_event_shaped_json(value: dict[str, Any]) -> None:
    assert_only_remote_errors(msgspec.json.encode(value))


def mutate(raw: Any, path: list[int], new: Any, delete: bool) -> Any:
    """Replace (or delete) the node of ``raw`` that ``path`` picks."""
    if not path or not isinstance(raw, dict | list) or not raw:
        return new
    keys = list(raw) if isinstance(raw, dict) else list(range(len(raw)))
    key = keys[path[0] % len(keys)]
    if delete and len(path) == 1:
        del raw[key]
        return raw
    raw[key] = mutate(raw[key], path[1:], new, delete)
    return raw


@FUZZ
@given(
    event=client_events | server_events,
    path=st.lists(st.integers(0, 50), min_size=1, max_size=4),
    new=json_values,
    delete=st.booleans(),
)
def test_mutated_events(event: Any, path: list[int], new: Any, delete: bool) -> None:
    raw = mutate(msgspec.json.decode(encode_event(event)), path, new, delete)
    assert_only_remote_errors(msgspec.json.encode(raw))


# --- the transition table as a state machine ---------------------------------


class TransitionTable(RuleBasedStateMachine):
    """Random transitions on one :class:`ResponseStateMachine`, checked against the table."""

    def __init__(self) -> None:
        super().__init__()
        self.machine = ResponseStateMachine("resp_fuzz")
        self.ended = False

    @initialize(state=st.sampled_from(list(ResponseState)))
    def begin(self, state: ResponseState) -> None:
        self.machine = ResponseStateMachine("resp_fuzz", state)
        self.ended = state in TERMINAL_STATES

    @rule(transition=st.sampled_from(list(Transition)))
    def apply(self, transition: Transition) -> None:
        before = self.machine.state
        expected = TRANSITIONS[before].get(transition)
        assert self.machine.allows(transition) is (expected is not None)
        if expected is None:
            with pytest.raises(LocalProtocolError) as info:
                self.machine.process(transition)
            assert self.machine.state is before
            assert transition.value in info.value.message
            assert before.value in info.value.message
            assert info.value.code == (
                ErrorCode.RESPONSE_ALREADY_COMPLETED
                if before in TERMINAL_STATES
                else ErrorCode.INVALID_VALUE
            )
        else:
            assert self.machine.process(transition) is expected
            assert self.machine.state is expected
        self.ended = self.ended or self.machine.terminal

    @invariant()
    def terminal_states_absorb(self) -> None:
        assert self.machine.terminal is self.ended
        assert self.machine.terminal is (not TRANSITIONS[self.machine.state])


TestTransitionTable = TransitionTable.TestCase
TestTransitionTable.settings = settings(FUZZ, max_examples=100, stateful_step_count=20)


# --- random conversations: both ends agree, and refuse alike -----------------


class Conversation(RuleBasedStateMachine):
    """A server and a client Connection in a random but legal conversation.

    The server emits lifecycle and item events for a few responses; the client
    answers calls, steers and cancels. Illegal moves are tried too: each must
    be refused by the sender and the receiver with the same code, and change
    nothing on either side.
    """

    def __init__(self) -> None:
        super().__init__()
        self.client = Connection(Role.CLIENT)
        self.server = Connection(Role.SERVER)
        self.response_ids: list[str] = []
        self.calls = 0

    # helpers

    def carry(self, role: Role, event: Any) -> None:
        sender, receiver = (
            (self.client, self.server) if role is Role.CLIENT else (self.server, self.client)
        )
        receiver.receive_message(sender.send(event))
        assert receiver.next_event() == event

    def refuse(self, role: Role, event: Any) -> None:
        sender, receiver = (
            (self.client, self.server) if role is Role.CLIENT else (self.server, self.client)
        )
        before = snapshot(self.client), snapshot(self.server)
        with pytest.raises(LocalProtocolError) as local:
            sender.send(event)
        with pytest.raises(RemoteProtocolError) as remote:
            receiver.receive_message(encode_event(event))
        assert (remote.value.code, remote.value.param) == (local.value.code, local.value.param)
        assert (snapshot(self.client), snapshot(self.server)) == before

    def track(self, index: int) -> p.ResponseTrack:
        track = self.server.response(self.response_ids[index % len(self.response_ids)])
        assert track is not None
        return track

    def lifecycle(self, cls: type[msgspec.Struct], track: p.ResponseTrack, status: str) -> Any:
        response = p.response.Response(id=track.response_id, created_at=0, status=status, model="m")  # type: ignore[arg-type]
        return cls(sequence_number=track.next_sequence, response=response)

    # server moves

    @precondition(lambda self: len(self.response_ids) < 3)
    @rule(queued=st.booleans())
    def create(self, queued: bool) -> None:
        response_id = f"resp_{len(self.response_ids)}"
        response = p.response.Response(
            id=response_id, created_at=0, status="queued" if queued else "in_progress", model="m"
        )
        self.carry(Role.SERVER, p.events.ResponseCreated(sequence_number=0, response=response))
        self.response_ids.append(response_id)

    @precondition(lambda self: self.response_ids)
    @rule(index=st.integers(0, 2))
    def in_progress(self, index: int) -> None:
        track = self.track(index)
        event = self.lifecycle(p.events.ResponseInProgress, track, "in_progress")
        if track.state in TERMINAL_STATES:
            self.refuse(Role.SERVER, event)
        else:
            self.carry(Role.SERVER, event)

    @precondition(lambda self: self.response_ids)
    @rule(index=st.integers(0, 2), delta=texts)
    def text(self, index: int, delta: str) -> None:
        track = self.track(index)
        event = p.events.OutputTextDelta(
            sequence_number=track.next_sequence,
            response_id=track.response_id,
            item_id="msg",
            output_index=0,
            content_index=0,
            delta=delta,
        )
        if track.state in TERMINAL_STATES:
            self.refuse(Role.SERVER, event)
        else:
            self.carry(Role.SERVER, event)

    @precondition(lambda self: self.response_ids)
    @rule(index=st.integers(0, 2))
    def tool_call(self, index: int) -> None:
        track = self.track(index)
        if track.state in TERMINAL_STATES:
            return
        self.calls += 1
        call = p.items.FunctionCall(call_id=f"call_{self.calls}", name="add", arguments="{}")
        event = p.events.OutputItemDone(
            sequence_number=track.next_sequence,
            response_id=track.response_id,
            output_index=self.calls,
            item=call,
        )
        self.carry(Role.SERVER, event)
        assert call.call_id in track.pending_calls

    @precondition(lambda self: self.response_ids)
    @rule(index=st.integers(0, 2), status=statuses)
    def done(self, index: int, status: str) -> None:
        track = self.track(index)
        event = self.lifecycle(p.events.ResponseDone, track, status)
        legal = {
            "requires_action": Transition.PAUSE,
            "completed": Transition.COMPLETE,
            "incomplete": Transition.EXPIRE,
            "failed": Transition.FAIL,
            "cancelled": Transition.CANCEL,
        }.get(status)
        if legal is not None and legal in TRANSITIONS[track.state]:
            self.carry(Role.SERVER, event)
        else:
            self.refuse(Role.SERVER, event)

    @precondition(lambda self: self.response_ids)
    @rule(index=st.integers(0, 2), skip=st.integers(1, 3))
    def out_of_order(self, index: int, skip: int) -> None:
        track = self.track(index)
        event = p.events.OutputTextDelta(
            sequence_number=track.next_sequence + skip,
            response_id=track.response_id,
            item_id="msg",
            output_index=0,
            content_index=0,
            delta="x",
        )
        self.refuse(Role.SERVER, event)

    # client moves

    @precondition(lambda self: self.response_ids)
    @rule(index=st.integers(0, 2), how_many=st.integers(1, 3))
    def answer(self, index: int, how_many: int) -> None:
        track = self.track(index)
        call_ids = sorted(track.pending_calls)[:how_many]
        event = p.events.ResponseAppend(
            input=[p.items.FunctionCallOutput(call_id=c, output="ok") for c in call_ids],
            response_id=track.response_id,
        )
        # An empty append only resumes a pause with nothing pending (an engine failed).
        retry = track.state is ResponseState.REQUIRES_ACTION and not track.pending_calls
        if track.state in TERMINAL_STATES or (not call_ids and not retry):
            self.refuse(Role.CLIENT, event)
        else:
            self.carry(Role.CLIENT, event)
            assert not set(call_ids) & set(track.pending_calls)
            assert set(call_ids) <= track.answered_calls

    @precondition(lambda self: self.response_ids)
    @rule(index=st.integers(0, 2), how_many=st.integers(1, 3))
    def inject(self, index: int, how_many: int) -> None:
        """The multi-agent beta's append: the same move, then a receipt in the stream."""
        track = self.track(index)
        call_ids = sorted(track.pending_calls)[:how_many]
        event = p.events.ResponseInject(
            input=[p.items.FunctionCallOutput(call_id=c, output="ok") for c in call_ids],
            response_id=track.response_id,
        )
        if track.state in TERMINAL_STATES:
            self.refuse(Role.CLIENT, event)
            with pytest.raises(RemoteProtocolError) as refused:
                self.server.receive_message(encode_event(event))
            reply = refused.value.reply
            assert isinstance(reply, p.events.ResponseInjectFailed)
            assert (reply.input, reply.sequence_number) == (event.input, track.next_sequence)
            return
        self.carry(Role.CLIENT, event)
        assert set(call_ids) <= track.answered_calls
        sequence = track.next_sequence
        receipt = p.events.ResponseInjectCreated(
            sequence_number=sequence, response_id=track.response_id
        )
        self.carry(Role.SERVER, receipt)
        assert track.next_sequence == sequence + 1

    @precondition(lambda self: self.response_ids)
    @rule(index=st.integers(0, 2), answered=st.booleans())
    def bad_answer(self, index: int, answered: bool) -> None:
        track = self.track(index)
        if answered and track.answered_calls:
            call_id = sorted(track.answered_calls)[0]
        else:
            call_id = "call_never"
        event = p.events.ResponseAppend(
            input=[p.items.FunctionCallOutput(call_id=call_id, output="?")],
            response_id=track.response_id,
        )
        self.refuse(Role.CLIENT, event)

    @precondition(lambda self: self.response_ids)
    @rule(index=st.integers(0, 2), use_latest=st.booleans())
    def steer(self, index: int, use_latest: bool) -> None:
        track = self.track(index)
        if use_latest:
            latest = self.client.latest_response_id()
            assert latest is not None
            track = self.track(self.response_ids.index(latest))
        event = p.events.ResponseAppend(
            input=[p.items.Message(role="user", content="also")],
            response_id=None if use_latest else track.response_id,
        )
        if track.state in TERMINAL_STATES:
            self.refuse(Role.CLIENT, event)
        else:
            self.carry(Role.CLIENT, event)

    @precondition(lambda self: self.response_ids)
    @rule(index=st.integers(0, 2))
    def cancel(self, index: int) -> None:
        track = self.track(index)
        event = p.events.ResponseCancel(response_id=track.response_id)
        if track.state in TERMINAL_STATES:
            self.refuse(Role.CLIENT, event)
        else:
            self.carry(Role.CLIENT, event)

    # invariants

    @invariant()
    def both_ends_agree(self) -> None:
        assert snapshot(self.client) == snapshot(self.server)

    @invariant()
    def calls_are_pending_or_answered_never_both(self) -> None:
        for track in self.server.responses.values():
            assert not set(track.pending_calls) & track.answered_calls


TestConversation = Conversation.TestCase
TestConversation.settings = settings(FUZZ, max_examples=60, stateful_step_count=30)
