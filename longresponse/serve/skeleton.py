"""A body's limits, checked on its skeleton before it is decoded (issue 20).

msgspec decodes a body in one piece and holds the interpreter while it does
(a worker thread would not help): 40,000 tools take about 100 ms to become
Structs, a schema of 120,000 properties about 50 ms, all before any limit of
SPEC.md §12.4 can be checked. So a create (HTTP, ``/input_tokens``, a
WebSocket ``response.create``) and a chat completion are first read as their
skeleton: the members whose size grows with what the client sent
(``input``, ``messages``, ``tools``, a function's ``parameters``,
``text.format`` and ``response_format``) are kept as ``msgspec.Raw``, JSON
that is validated and not built (about 0.6 ms a MB). On the skeleton:

- the items (chat: the messages) and the tools offered are counted against
  ``--max-items-per-event`` and ``--max-tools``;
- each schema's text bounds its size: it holds at most one object or array
  per ``{`` or ``[``, and no object or array has more members than its
  commas plus one. A schema within ``--max-schema-nodes`` by the first and
  with fewer commas than ``--max-schema-width`` keeps both limits unread.
  Any other is walked exactly (``structured.schema_walk`` on its text), one
  object or array at a time, the loop given a turn every
  :data:`SLICE_SECONDS`; the walk stops at the first fault.

Opening an object costs about 0.2 µs a member (its keys are built), so an
object far wider than allowed is refused without being opened (more than
twice ``--max-schema-width`` members as written: ``structured._far_past``).
``/compact`` counts its items on the text of its members the same way
(``serve/http/compact.py``).

Only then is the body decoded, what it builds now bounded by the limits. A refusal
here is the error the decoded body would get (the same code, param and
message, built by the same functions), and the decoded body is checked again
in full. What the skeleton cannot read (not JSON, not an object, a member of
the wrong type) is left to the decoder, whose error that is. One difference
remains: a body with faults of several kinds hears of an item, tool or
schema limit before a fault the decoder or an earlier check would name.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec

from protocol import ProtocolError

from ..config import SchemaLimits
from ..engine.admission import TOOL_NAME_PATTERN, name_refusal, parameters_refusal, too_many_tools
from ..engine.structured import (
    FORMAT_NAME_PATTERN,
    SchemaFault,
    format_name_refusal,
    format_schema_refusal,
    schema_walk,
)

__all__ = ["SLICE_SECONDS", "check_chat_skeleton", "check_create_skeleton"]

#: The longest a schema walk holds the loop before it gives it a turn.
SLICE_SECONDS: Final = 0.0005
#: JSON text longer than this is followed by a turn for the loop once read
#: (reading it takes about 0.6 ms a MB).
_LONG: Final = 256 * 1024

_Raw = msgspec.Raw
_NULL: Final = msgspec.Raw(b"null")


class _Create(msgspec.Struct):
    """A create body or ``response.create`` frame: its scaling members as text."""

    type: _Raw = _NULL
    stream_id: _Raw = _NULL
    input: _Raw = _NULL
    tools: _Raw = _NULL
    text: _Raw = _NULL


class _Chat(msgspec.Struct):
    """A chat completions body: its scaling members as text."""

    messages: _Raw = _NULL
    tools: _Raw = _NULL
    response_format: _Raw = _NULL


class _Tool(msgspec.Struct):
    """A Responses tool (a namespace's tools included), or a chat tool's ``function``."""

    type: _Raw = _NULL
    name: _Raw = _NULL
    parameters: _Raw = _NULL
    tools: _Raw = _NULL
    function: _Raw = _NULL


class _Format(msgspec.Struct):
    """A format (``text.format``), chat's ``response_format`` or its ``json_schema``."""

    type: _Raw = _NULL
    name: _Raw = _NULL
    schema: _Raw = _NULL
    json_schema: _Raw = _NULL


class _Text(msgspec.Struct):
    """``text``: its format read in the same pass (not an object: left to the decoder)."""

    format: _Format | None = None


#: Refuses ``count`` items (or messages) when past their limit (raises its error).
_Count = Callable[[int], None]


async def check_create_skeleton(
    data: bytes | bytearray | str,
    limits: SchemaLimits,
    check_count: _Count,
    *,
    frame: bool = False,
) -> None:
    """Check a create's items, tools and schemas on its skeleton (the module
    docstring), the items by ``check_count``. Raises the limit's
    :class:`ProtocolError`; returns when the body keeps them or is left to
    its decoder. ``frame``: ``data`` is a WebSocket message, checked only
    when it is a ``response.create``, and refused on its lane (``stream_id``)."""
    if frame and _leads_with_other_type(data):
        return  # an append, a cancel...: not read twice
    create = await _read(data, _Create)
    if create is None or (frame and _text(create.type) != "response.create"):
        return
    try:
        await _check_create(create, limits, check_count)
    except ProtocolError as error:
        if not frame:
            raise
        raise error.with_(stream_id=_decode(create.stream_id, str | None)) from None


#: A frame that begins with its ``type``, as clients write them.
_TYPE_FIRST: Final = re.compile(r'\s*\{\s*"type"\s*:\s*"([a-z._]*)"')
_TYPE_FIRST_BYTES: Final = re.compile(_TYPE_FIRST.pattern.encode())


def _leads_with_other_type(data: bytes | bytearray | str) -> bool:
    """Whether ``data`` begins with a ``type`` other than ``response.create``
    (read on its first bytes; anything else is read as a whole)."""
    head = data[:128]
    found = _TYPE_FIRST.match(head) if isinstance(head, str) else _TYPE_FIRST_BYTES.match(head)
    return found is not None and found.group(1) not in ("response.create", b"response.create")


async def _check_create(create: _Create, limits: SchemaLimits, check_count: _Count) -> None:
    await _count(create.input, check_count)
    tools = await _read(create.tools, list[_Raw])
    if tools is not None:
        offered = len(tools)
        if b"namespace" in bytes(create.tools):
            offered += await _namespaced(create.tools)
        if offered > limits.max_tools:
            raise too_many_tools(offered, limits.max_tools)
        await _check_tools(tools, limits)
    text = await _read(create.text, _Text)
    text_format = None if text is None else text.format
    if text_format is not None and _text(text_format.type) == "json_schema":
        await _check_format(text_format, limits)


async def check_chat_skeleton(
    data: bytes | bytearray, limits: SchemaLimits, check_count: _Count
) -> None:
    """:func:`check_create_skeleton` for a chat body: its messages, tools (each
    ``function``) and ``response_format.json_schema``. The errors name the
    Responses fields (``tools[0].parameters``, ``text.format.schema``) as
    admission does; the chat endpoint renames them."""
    chat = await _read(data, _Chat)
    if chat is None:
        return
    await _count(chat.messages, check_count)
    tools = await _read(chat.tools, list[_Raw])
    if tools is not None:
        if len(tools) > limits.max_tools:
            raise too_many_tools(len(tools), limits.max_tools)
        functions = []
        for tool in tools:
            head = await _read(tool, _Tool)
            functions.append(_NULL if head is None else head.function)
        await _check_tools(functions, limits, function_only=False)
    response_format = await _read(chat.response_format, _Format)
    if response_format is not None and _text(response_format.type) == "json_schema":
        await _check_format(await _read(response_format.json_schema, _Format), limits)


def _decode(raw: bytes | bytearray | str | _Raw, kind: Any) -> Any:
    """``raw`` as the skeleton ``kind``, or None where it is not one."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.DecodeError, RecursionError, UnicodeError):
        return None


async def _read(raw: bytes | bytearray | str | _Raw, kind: Any) -> Any:
    """:func:`_decode`, then a turn for the loop when ``raw`` was long."""
    value = _decode(raw, kind)
    if len(raw) > _LONG:
        await asyncio.sleep(0)
    return value


def _text(raw: _Raw) -> str | None:
    """A short JSON string's value (None for anything else)."""
    if len(raw) > 256:
        return None
    value = _decode(raw, str)
    return value if isinstance(value, str) else None


async def _count(raw: _Raw, check_count: _Count) -> None:
    items = await _read(raw, list[_Raw])
    if items is not None:
        check_count(len(items))


async def _namespaced(tools: _Raw) -> int:
    """The tools inside the namespaces of ``tools`` (each offered to the model);
    0 when a tool is not an object (the decoder's error)."""
    heads: list[_Tool] | None = await _read(tools, list[_Tool])
    inside = 0
    deadline = time.perf_counter() + SLICE_SECONDS
    for head in heads or ():
        if head.tools != _NULL and _text(head.type) == "namespace":
            inside += len(_decode(head.tools, list[_Raw]) or ())
        if time.perf_counter() > deadline:
            await asyncio.sleep(0)
            deadline = time.perf_counter() + SLICE_SECONDS
    return inside


async def _check_tools(
    tools: Sequence[_Raw], limits: SchemaLimits, *, function_only: bool = True
) -> None:
    """The ``parameters`` of each function (a namespace's too), in order.
    ``function_only`` False: every member is a function (chat's)."""
    for index, tool in enumerate(tools):
        head = await _read(tool, _Tool)
        if head is None:
            continue
        kind = _text(head.type) if function_only else "function"
        if kind == "namespace":
            for position, sub in enumerate(await _read(head.tools, list[_Raw]) or ()):
                inner = await _read(sub, _Tool)
                if inner is not None and _text(inner.type) == "function":
                    await _check_parameters(inner, f"tools[{index}].tools[{position}]", limits)
        elif kind == "function":
            await _check_parameters(head, f"tools[{index}]", limits)


async def _check_parameters(tool: _Tool, where: str, limits: SchemaLimits) -> None:
    """A function's ``parameters``, its name first (as admission checks them)."""
    name = _decode(tool.name, str)  # any length: a long name is refused, not skipped
    if name is None:
        return  # not a string: the decoder's error
    fault = await _walked(tool.parameters, limits)
    if fault is None:
        return
    if not TOOL_NAME_PATTERN.fullmatch(name):
        raise name_refusal(where)
    raise parameters_refusal(name, fault.message, fault.param(f"{where}.parameters"))


async def _check_format(text_format: _Format | None, limits: SchemaLimits) -> None:
    """A ``json_schema`` format's schema, its name first (as ``check_format`` does)."""
    if text_format is None:
        return
    fault = await _walked(text_format.schema, limits)
    if fault is None:
        return
    name = _decode(text_format.name, str)
    if name is None:
        return  # absent or not a string: the decoder's error
    if not FORMAT_NAME_PATTERN.fullmatch(name):
        raise format_name_refusal()
    raise format_schema_refusal(fault)


async def _walked(schema: _Raw, limits: SchemaLimits) -> SchemaFault | None:
    """The first fault of ``schema`` (an object's text; anything else: None),
    read by its bound first, then walked exactly in slices."""
    text = bytes(schema)
    if not text.startswith(b"{"):
        return None
    nodes = text.count(b"{") + text.count(b"[")
    if nodes <= limits.max_nodes and text.count(b",") < limits.max_width:
        return None
    if len(text) > _LONG:
        await asyncio.sleep(0)
    walk = schema_walk(schema, limits)
    deadline = time.perf_counter() + SLICE_SECONDS
    while True:
        try:
            next(walk)
        except StopIteration as end:
            fault: SchemaFault | None = end.value
            return fault
        except (msgspec.DecodeError, RecursionError, UnicodeError):
            return None  # pragma: no cover - the body's text was validated whole
        if time.perf_counter() > deadline:
            await asyncio.sleep(0)
            deadline = time.perf_counter() + SLICE_SECONDS
