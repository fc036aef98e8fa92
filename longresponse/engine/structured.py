"""Structured outputs: checking a ``text.format`` at admission, and answering in it.

Theory of operation
-------------------
A request may ask for JSON through ``text.format``: ``json_object`` (any JSON
object) or ``json_schema`` (JSON matching ``schema``; with ``strict: true``
the model must follow it exactly). Before anything is accepted,
:func:`check_format` makes sure the format is usable:

- ``name`` is 1-64 characters of ``[A-Za-z0-9_-]`` (param ``text.format.name``);
- ``schema`` is a valid JSON Schema (the 2020-12 metaschema);
- with ``strict: true``, the schema stays inside the subset that strict mode
  can hold a model to: the root is an object schema (not ``anyOf``); every
  subschema says what it is (``type``, ``anyOf``, ``enum``, ``const`` or a
  local ``$ref``); every object schema lists its ``properties``, names each
  of them in ``required`` and sets ``additionalProperties: false``; ``$ref``
  points inside the schema; no keyword outside :data:`STRICT_KEYWORDS`; at
  most :data:`MAX_NESTING` levels of ``properties`` and ``items``.

Every schema (strict or not, and every tool's ``parameters``) must also
stay inside two limits that keep the checks and the answer bounded
(:func:`schema_limits`): at most :data:`MAX_SCHEMA_DEPTH` levels of JSON
objects and arrays, and no ``minItems`` / ``minLength`` / ``minProperties``
/ ``minContains`` above :data:`MAX_SCHEMA_COUNT`. A schema too deep for the
metaschema check (``RecursionError``) is refused the same way.

A schema that fails is ``invalid_value`` with param ``text.format.schema``;
the message says where in the schema (a JSON pointer) and why.

:func:`answer_in_format` is the simulated model's side. Given the text it
would have answered, it writes JSON instead: for ``json_object``,
``{"answer": text}``; for a schema, the first value the schema allows,
built from the root down (the first ``anyOf`` branch, the first ``enum``
value, numbers from their bounds, arrays of ``minItems`` or one item), where
every free string (no ``enum``, ``const`` or ``format``, and a ``pattern``
the text meets) holds the text itself, so the answer still quotes its whole
context. A string whose ``pattern`` the text does not meet gets an example
built from the pattern (its first branch, the least repetitions, the first
character of each class: ``longresponse.engine.patterns``).

The answer is bounded by the Response's output budget before it is built:
every value costs at least one token, and a string one more per
:data:`_CHARS_PER_TOKEN` characters, so an array of ``minItems`` (or a
padded ``minLength``) stops where the budget does, and a ``$ref`` cycle
ends after :data:`_GIVE_UP` levels. An answer cut short this way is
reported incomplete (the model ran out of tokens), never sent as complete.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

import jsonschema
import msgspec

from protocol import ErrorCode, RemoteProtocolError
from protocol.response import FormatJSONObject, FormatJSONSchema, TextFormat

from .patterns import pattern_example, pattern_matches

__all__ = [
    "FORMAT_NAME_PATTERN",
    "MAX_NESTING",
    "MAX_SCHEMA_COUNT",
    "MAX_SCHEMA_DEPTH",
    "STRICT_KEYWORDS",
    "answer_in_format",
    "check_format",
    "schema_limits",
    "value_for_schema",
]

#: What ``text.format.name`` may be.
FORMAT_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")

#: Levels of ``properties`` / ``items`` a strict schema may nest.
MAX_NESTING: Final = 10

#: Levels of JSON objects and arrays any schema may nest (a strict schema's
#: ten levels of ``properties`` take about twenty; the metaschema check
#: itself recurses past about 160).
MAX_SCHEMA_DEPTH: Final = 64

#: The largest ``minItems`` / ``minLength`` / ``minProperties`` / ``minContains``.
MAX_SCHEMA_COUNT: Final = 10_000
_COUNT_KEYWORDS: Final = frozenset({"minItems", "minLength", "minProperties", "minContains"})
#: Keywords whose value is data, not a schema (not walked by :func:`schema_limits`).
_DATA_KEYWORDS: Final = frozenset({"enum", "const", "default", "examples"})

#: The keywords a strict schema may use (annotations included).
STRICT_KEYWORDS: Final = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items",
        "anyOf", "enum", "const", "$ref", "$defs", "definitions",
        "pattern", "format",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minItems", "maxItems",
        "title", "description", "$comment", "$schema", "$id", "examples", "default",
    }
)  # fmt: skip

_TYPES: Final = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_SCHEMA_PARAM: Final = "text.format.schema"

#: A value for each string ``format`` strict mode knows.
_FORMAT_VALUES: Final[Mapping[str, str]] = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00Z",
    "duration": "P1D",
    "email": "sim@example.com",
    "hostname": "example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "uuid": "00000000-0000-4000-8000-000000000000",
}

#: Beyond this depth the generator takes the shortest way out (null, empty array).
_DEEP: Final = 16
#: Beyond this depth it gives up (a ``$ref`` cycle with no way out): null, incomplete.
_GIVE_UP: Final = 32
#: A string costs one token per this many characters (fewer than any tokenizer
#: packs into one; the cost only bounds the work, the real count cuts the answer).
_CHARS_PER_TOKEN: Final = 64
#: The output budget when a request sets none (the simulated models' largest answer).
DEFAULT_ANSWER_TOKENS: Final = 128_000



def _refuse(where: str, why: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"Invalid schema for response format at '{where}': {why}.",
        code=ErrorCode.INVALID_VALUE,
        param=_SCHEMA_PARAM,
    )


def schema_limits(schema: Any) -> str | None:
    """Where and why ``schema`` breaks the size limits (see the module
    docstring), as ``"at '#/pointer': reason"``; None when it keeps them.
    Walks without recursion, so any depth is safe to ask about."""
    stack: list[tuple[Any, int, str]] = [(schema, 1, "#")]
    while stack:
        node, depth, where = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            return f"at '{where}': nested deeper than {MAX_SCHEMA_DEPTH} levels"
        if isinstance(node, Mapping):
            children = list(node.items())
        elif isinstance(node, list):
            children = list(enumerate(node))
        else:
            continue
        for key, sub in children:
            if key in _COUNT_KEYWORDS and isinstance(sub, int) and sub > MAX_SCHEMA_COUNT:
                return f"at '{where}': '{key}' above {MAX_SCHEMA_COUNT} ({sub})"
            if isinstance(sub, Mapping | list) and key not in _DATA_KEYWORDS:
                stack.append((sub, depth + 1, f"{where}/{key}"))
    return None


def check_format(text_format: TextFormat | None) -> None:
    """Check a request's ``text.format`` (the rules in the module docstring).

    Raises :class:`RemoteProtocolError` (``invalid_value``, param
    ``text.format.name`` or ``text.format.schema``); nothing is kept.
    """
    if not isinstance(text_format, FormatJSONSchema):
        return
    if not FORMAT_NAME_PATTERN.fullmatch(text_format.name):
        raise RemoteProtocolError(
            "Invalid 'text.format.name': use 1-64 characters from [A-Za-z0-9_-].",
            code=ErrorCode.INVALID_VALUE,
            param="text.format.name",
        )
    schema = text_format.schema
    too_big = schema_limits(schema)
    if too_big is not None:
        raise RemoteProtocolError(
            f"Invalid schema for response format {too_big}.",
            code=ErrorCode.INVALID_VALUE,
            param=_SCHEMA_PARAM,
        )
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        pointer = "#" + "".join(f"/{part}" for part in exc.path)
        raise _refuse(pointer, exc.message) from None
    except RecursionError:
        raise _refuse("#", "nested too deeply to check") from None
    if text_format.strict:
        _check_strict(schema, schema, "#", 0)


def _check_strict(schema: Any, root: Mapping[str, Any], where: str, nesting: int) -> None:
    if not isinstance(schema, Mapping):
        raise _refuse(where, "strict mode needs a schema object here")
    unknown = sorted(set(schema) - STRICT_KEYWORDS)
    if unknown:
        raise _refuse(where, f"strict mode does not support '{unknown[0]}'")
    if nesting > MAX_NESTING:
        raise _refuse(where, f"strict mode allows at most {MAX_NESTING} levels of nesting")
    if where == "#" and ("anyOf" in schema or _types(schema) != ["object"]):
        raise _refuse(where, 'the root must be an object schema ("type": "object"), not anyOf')
    for name in ("$defs", "definitions"):
        for key, sub in (schema.get(name) or {}).items():
            _check_strict(sub, root, f"{where}/{name}/{key}", 0)
    if "$ref" in schema:
        ref = schema["$ref"]
        if _resolve(ref, root) is None:
            raise _refuse(where, f"'$ref' {ref!r} does not point inside this schema")
        return
    if not any(key in schema for key in ("type", "anyOf", "enum", "const")):
        raise _refuse(where, "strict mode needs 'type' (or anyOf, enum, const) on every schema")
    for index, branch in enumerate(schema.get("anyOf") or []):
        _check_strict(branch, root, f"{where}/anyOf/{index}", nesting)
    types = _types(schema)
    if "object" in types:
        properties = schema.get("properties")
        if not isinstance(properties, Mapping):
            raise _refuse(where, "strict mode needs 'properties' on every object schema")
        if schema.get("additionalProperties") is not False:
            raise _refuse(where, "strict mode needs 'additionalProperties': false")
        missing = [key for key in properties if key not in (schema.get("required") or [])]
        if missing:
            raise _refuse(where, f"strict mode needs every property in 'required' ({missing[0]!r})")
        for key, sub in properties.items():
            _check_strict(sub, root, f"{where}/properties/{key}", nesting + 1)
    if "array" in types and "items" in schema:
        _check_strict(schema["items"], root, f"{where}/items", nesting + 1)


def _types(schema: Mapping[str, Any]) -> list[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind] if kind in _TYPES else []
    if isinstance(kind, list):
        return [k for k in kind if k in _TYPES]
    return []


def _resolve(ref: Any, root: Mapping[str, Any]) -> Any:
    """The subschema a local ``$ref`` (``#`` or a JSON pointer into the root) names."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node: Any = root
    for raw in ref[1:].split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


# --- the simulated model's side ------------------------------------------------


def answer_in_format(
    text_format: TextFormat | None, text: str, budget: int | None = None
) -> tuple[str, bool]:
    """``text`` as the model writes it in ``text_format`` (as is, or as compact
    JSON), and whether the JSON is whole: False when ``budget`` (tokens;
    :data:`DEFAULT_ANSWER_TOKENS` when None) ran out before the value did."""
    if isinstance(text_format, FormatJSONSchema):
        writer = _Writer(text_format.schema, text, budget)
        value = writer.value(text_format.schema, 0)
        return msgspec.json.encode(value).decode(), writer.complete
    if isinstance(text_format, FormatJSONObject):
        return msgspec.json.encode({"answer": text}).decode(), True
    return text, True


def value_for_schema(schema: Mapping[str, Any], text: str, budget: int | None = None) -> Any:
    """The first value ``schema`` allows, with ``text`` in every free string
    (cut short where ``budget`` tokens run out)."""
    return _Writer(schema, text, budget).value(schema, 0)


class _Writer:
    """Builds the first value a schema allows, charging each value to a budget."""

    def __init__(self, root: Mapping[str, Any], text: str, budget: int | None) -> None:
        self.root = root
        self.text = text
        self.left = DEFAULT_ANSWER_TOKENS if budget is None else max(0, budget)
        self.complete = True

    def _charge(self, tokens: int) -> bool:
        if tokens > self.left:
            self.left = 0
            self.complete = False
            return False
        self.left -= tokens
        return True

    def value(self, schema: Any, depth: int) -> Any:
        if depth > _GIVE_UP or not self._charge(1):
            self.complete = False
            return None
        if not isinstance(schema, Mapping):
            return self._string({})  # ``true`` (anything goes)
        if "$ref" in schema:
            target = _resolve(schema["$ref"], self.root)
            return self.value(target if target is not None else {}, depth + 1)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        branches = schema.get("anyOf") or schema.get("oneOf")
        if branches:
            nullable = [b for b in branches if isinstance(b, Mapping) and _types(b) == ["null"]]
            branch = nullable[0] if depth > _DEEP and nullable else branches[0]
            return self.value(branch, depth + 1)
        types = _types(schema)
        if not types:
            types = ["object"] if "properties" in schema else ["string"]
        kind = "null" if depth > _DEEP and "null" in types else types[0]
        if kind == "object":
            result: dict[str, Any] = {}
            for key, sub in (schema.get("properties") or {}).items():
                if not self.left:
                    self.complete = False
                    break
                result[key] = self.value(sub, depth + 1)
            return result
        if kind == "array":
            low = int(schema.get("minItems", 0))
            count = low if depth > _DEEP else max(low, 1)
            if "maxItems" in schema:
                count = min(count, int(schema["maxItems"]))
            items: list[Any] = []
            for _ in range(count):  # each item costs a token: the budget ends the loop
                if not self.left:
                    self.complete = False
                    break
                items.append(self.value(schema.get("items", {}), depth + 1))
            return items
        if kind in ("integer", "number"):
            return _number(schema, integer=kind == "integer")
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return self._string(schema)

    def _string(self, schema: Mapping[str, Any]) -> str:
        room = self.left * _CHARS_PER_TOKEN
        value = _string(schema, self.text, room)
        if not self._charge(len(value) // _CHARS_PER_TOKEN):
            value = value[:room]
        return value


def _string(schema: Mapping[str, Any], text: str, room: int) -> str:
    """The string for ``schema``; ``minLength`` pads it to at most ``room`` characters."""
    known = _FORMAT_VALUES.get(schema.get("format", ""))
    if known is not None:
        return known
    value = text
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and not pattern_matches(pattern, text):
        value = pattern_example(pattern) or text
    low, high = schema.get("minLength"), schema.get("maxLength")
    if isinstance(high, int):
        value = value[:high]
    if isinstance(low, int) and len(value) < low:
        value += "." * max(0, min(low, room) - len(value))
    return value


def _number(schema: Mapping[str, Any], *, integer: bool) -> int | float:
    low = schema.get("minimum")
    high = schema.get("maximum")
    above = schema.get("exclusiveMinimum")
    below = schema.get("exclusiveMaximum")
    step = schema.get("multipleOf")

    def allowed(value: float) -> bool:
        return (
            (low is None or value >= low)
            and (high is None or value <= high)
            and (above is None or value > above)
            and (below is None or value < below)
            and (not step or math.isclose(value / step, round(value / step), abs_tol=1e-9))
        )

    starts = [0, low, high, above, below]
    candidates: list[float] = []
    try:
        for start in (s for s in starts if isinstance(s, int | float)):
            if step:
                base = math.ceil(start / step) * step
                candidates += [base, base + step, base - step]
            else:
                candidates += [start, start + 1, start - 1, start + 0.5, start - 0.5]
        if low is not None and high is not None:
            candidates.append((low + high) / 2)
        for value in candidates:
            if integer and value != int(value):
                continue
            if allowed(value):
                return int(value) if integer else float(value)
    except (OverflowError, ValueError):  # bounds past what a float holds: no example
        pass
    start = low if isinstance(low, int | float) and math.isfinite(low) else 0
    return int(start) if integer else float(start)
