"""A body's limits checked on its skeleton (``longresponse/serve/skeleton.py``).

What is checked here: a refusal on the skeleton is the very error the decoded
body gets from admission (code, param and message), for tools, namespaces,
schemas in each place and items; a body within the limits passes; what the
skeleton cannot read is left alone. And the schema walk on a schema's JSON
text finds exactly the fault it finds on the decoded schema, whatever the
schema (Hypothesis).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longresponse.config import SchemaLimits
from longresponse.engine.admission import Pipeline, Switches
from longresponse.engine.structured import schema_limits
from longresponse.serve.skeleton import check_chat_skeleton, check_create_skeleton
from protocol import ErrorCode, ProtocolError, RemoteProtocolError, decode_create_body

LIMITS = SchemaLimits(max_tools=8, max_nodes=20, max_width=6)
MAX_ITEMS = 10


def count_items(count: int) -> None:
    if count > MAX_ITEMS:
        raise RemoteProtocolError(f"{count} items", code=ErrorCode.TOO_MANY_ITEMS, param="input")


def refusal(check: Callable[[], Any]) -> ProtocolError | None:
    """The error ``check`` raises (run on a loop of its own when it is a coroutine)."""
    try:
        if asyncio.iscoroutine(awaitable := check()):
            asyncio.run(awaitable)
    except ProtocolError as error:
        return error
    return None


def skeleton_refusal(body: dict[str, Any]) -> ProtocolError | None:
    async def check() -> None:
        await check_create_skeleton(json.dumps(body).encode(), LIMITS, count_items)

    return refusal(check)


def admission_refusal(body: dict[str, Any]) -> ProtocolError | None:
    """What admission says of the decoded body (tools first, then the format)."""
    decoded = decode_create_body(json.dumps(body).encode())
    pipeline = Pipeline(Switches(), limits=LIMITS)

    def check() -> None:
        pipeline.check_tools(decoded.tools)
        pipeline.check_text_format(decoded.text.format if decoded.text is not None else None)

    return refusal(check)


def wide(width: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(width)}}


def function(name: str, parameters: Any = None) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": parameters or wide(1)}


BODIES = {
    "tools past the limit": {"tools": [function(f"t{i}") for i in range(9)]},
    "tools past the limit, namespaces counted": {
        "tools": [
            *[function(f"t{i}") for i in range(5)],
            {"type": "namespace", "name": "ns", "description": "d", "tools": [function("a")] * 4},
        ]
        * 2
    },
    "a namespace of too many tools": {
        "tools": [
            function("a"),
            {"type": "namespace", "name": "ns", "description": "d", "tools": [function("b")] * 9},
        ]
    },
    "a wide tool schema": {"tools": [function("a"), function("b", wide(7))]},
    "a wide schema in a namespace": {
        "tools": [
            {
                "type": "namespace",
                "name": "ns",
                "description": "d",
                "tools": [function("b", wide(9))],
            }
        ]
    },
    "a schema of too many nodes": {
        "tools": [
            function(
                "a",
                {
                    "type": "object",
                    "$defs": {f"d{i}": {} for i in range(4)},
                    "x": [[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]],
                },
            )
        ]
    },
    "a wide format": {"text": {"format": {"type": "json_schema", "name": "f", "schema": wide(40)}}},
    "a wide tool schema with a long name": {"tools": [function("n" * 300, wide(40))]},
    "a wide format with a bad name": {
        "text": {"format": {"type": "json_schema", "name": "f f", "schema": wide(40)}}
    },
    "a bad pattern and a wide list in a tool schema": {
        "tools": [
            function(
                "a",
                {
                    "type": "object",
                    "properties": {"x": {"type": "string", "pattern": "(?=x)"}},
                    "required": list("abcdefg"),
                },
            )
        ]
    },
}


@pytest.mark.parametrize("name", list(BODIES))
def test_a_refusal_on_the_skeleton_is_admissions_own(name: str) -> None:
    body = {"model": "sim", "input": "hi", **BODIES[name]}
    expected = admission_refusal(body)
    got = skeleton_refusal(body)
    assert expected is not None
    assert got is not None
    assert (got.code, got.param, got.message) == (expected.code, expected.param, expected.message)


def test_items_are_counted_before_decoding() -> None:
    items = [{"role": "user", "content": "x"}]
    assert skeleton_refusal({"model": "sim", "input": items * MAX_ITEMS}) is None
    refused = skeleton_refusal({"model": "sim", "input": items * (MAX_ITEMS + 1)})
    assert refused is not None
    assert (refused.code, refused.message) == (ErrorCode.TOO_MANY_ITEMS, "11 items")


@pytest.mark.parametrize(
    "body",
    [
        {"model": "sim", "input": "hi", "tools": [function(f"t{i}", wide(6)) for i in range(8)]},
        {
            "model": "sim",
            "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "f", "schema": wide(6)}},
        },
        # Not the skeleton's to refuse: the decoder's errors, later.
        {"model": "sim", "input": "hi", "tools": 5},
        {
            "model": "sim",
            "input": "hi",
            "tools": [{"type": "custom", "name": "c", "parameters": wide(40)}],
        },
        {
            "model": "sim",
            "input": "hi",
            "text": {"format": {"type": "json_object", "schema": wide(40)}},
        },
        {
            "model": "sim",
            "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "f", "schema": [wide(40)]}},
        },
    ],
)
def test_what_the_skeleton_does_not_refuse(body: dict[str, Any]) -> None:
    assert skeleton_refusal(body) is None


def test_a_frame_is_refused_on_its_lane_and_other_frames_pass() -> None:
    async def check(frame: dict[str, Any]) -> None:
        await check_create_skeleton(json.dumps(frame).encode(), LIMITS, count_items, frame=True)

    tools = [function(f"t{i}") for i in range(9)]
    create = {"type": "response.create", "stream_id": "lane", "tools": tools}
    refused = refusal(lambda: check(create))
    assert refused is not None
    assert (refused.param, refused.stream_id) == ("tools", "lane")
    assert refusal(lambda: check({**create, "type": "response.append"})) is None


def test_chat_tools_and_response_format() -> None:
    async def check(body: dict[str, Any]) -> None:
        await check_chat_skeleton(json.dumps(body).encode(), LIMITS, count_items)

    chat_tool = {"type": "function", "function": {"name": "a", "parameters": wide(7)}}
    refused = refusal(lambda: check({"messages": [], "tools": [chat_tool]}))
    assert refused is not None
    assert refused.param == "tools[0].parameters"  # the chat endpoint renames it
    response_format = {"type": "json_schema", "json_schema": {"name": "f", "schema": wide(7)}}
    refused = refusal(lambda: check({"messages": [], "response_format": response_format}))
    assert refused is not None
    assert refused.param == "text.format.schema"
    assert refusal(lambda: check({"messages": [{}] * (MAX_ITEMS + 1)})) is not None


# --- the walk on a schema's text ---------------------------------------------

KEYS = st.sampled_from(["type", "properties", "items", "pattern", "minItems", "enum", "a", "b"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 20_000),
    st.sampled_from(["string", "(x+)+y", "(?=x)", "a,b{c}[d]"]),
)
SCHEMAS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=8), st.dictionaries(KEYS, inner, max_size=8)),
    max_leaves=60,
)


@pytest.mark.slow  # 300 examples of nested schemas: seconds of CPU
@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, SCHEMAS, max_size=8), st.integers(1, 12), st.integers(1, 8))
def test_the_walk_on_text_finds_the_fault_of_the_decoded_walk(
    schema: dict[str, Any], nodes: int, width: int
) -> None:
    limits = SchemaLimits(max_nodes=nodes, max_width=width)
    text = msgspec.Raw(json.dumps(schema).encode())
    assert schema_limits(text, limits) == schema_limits(json.loads(bytes(text)), limits)


def test_far_too_wide_an_object_is_counted_as_written() -> None:
    """Past twice the width limit an object given as text is refused unopened,
    its members counted as written: a key given twice counts twice (the one
    difference from the decoded schema, where the later value replaces the
    earlier)."""
    limits = SchemaLimits(max_width=3)
    members = ",".join(['"a": {}'] * 7)
    text = msgspec.Raw(f'{{"properties": {{{members}}}}}'.encode())
    fault = schema_limits(text, limits)
    assert fault is not None
    assert fault.message == (
        "at '#/properties': more than 6 members in one object or array; the limit is 3"
    )
    assert schema_limits(json.loads(bytes(text)), limits) is None
