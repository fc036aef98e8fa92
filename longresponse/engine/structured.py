"""Structured outputs: checking a ``text.format`` at admission.

The simulated model's answers in a format are its own
(:mod:`longresponse.backends.sim.structured`).

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
/ ``minContains`` above :data:`MAX_SCHEMA_COUNT`, at most
``SchemaLimits.max_nodes`` JSON objects and arrays in all and at most
``SchemaLimits.max_width`` members in any one of them (one of more than
twice that many is refused as having "more than" twice the limit, its
exact count not taken: on a schema given as JSON text, members as written,
a key given twice counted twice)
(``longresponse.config``: ``--max-schema-nodes``, ``--max-schema-width``),
and every ``pattern`` must be a regular expression RE2 runs (no back
references, no lookarounds): patterns are matched in linear time, never by a
backtracking engine, and one RE2 cannot run is refused (``param`` names it:
``text.format.schema.properties.x.pattern``) rather than silently ignored, so
a client never gets an answer its own validator would reject. This cheap
walk runs first: a refused schema never reaches the metaschema check (about
0.4 ms a property). A schema too deep for the metaschema check
(``RecursionError``) is refused the same way.

A schema that fails is ``invalid_value`` with param ``text.format.schema``;
the message says where in the schema (a JSON pointer) and why.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Generator, Mapping
from typing import Any, Final

import jsonschema
import msgspec

from protocol import ErrorCode, RemoteProtocolError
from protocol.response import FormatJSONSchema, TextFormat

from ..config import MAX_SCHEMA_WIDTH, SchemaLimits
from ..json_schema import pattern_error, resolve_ref, schema_types

__all__ = [
    "FORMAT_NAME_PATTERN",
    "MAX_NESTING",
    "MAX_SCHEMA_COUNT",
    "MAX_SCHEMA_DEPTH",
    "STRICT_KEYWORDS",
    "SchemaFault",
    "check_format",
    "format_name_refusal",
    "format_schema_refusal",
    "schema_limits",
    "schema_walk",
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

_SCHEMA_PARAM: Final = "text.format.schema"
_DEFAULT_LIMITS: Final = SchemaLimits()


def _refuse(where: str, why: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"Invalid schema for response format at '{where}': {why}.",
        code=ErrorCode.INVALID_VALUE,
        param=_SCHEMA_PARAM,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class SchemaFault:
    """Where (a path of keys and indices from the schema's root) and why a
    schema breaks a limit; ``precise`` when the param should name the place
    itself (a ``pattern``), not the whole schema."""

    path: tuple[str | int, ...]
    why: str
    precise: bool = False

    @property
    def message(self) -> str:
        pointer = "#" + "".join(f"/{part}" for part in self.path)
        return f"at '{pointer}': {self.why}"

    def param(self, base: str) -> str:
        """``base`` (``text.format.schema``, ``tools[0].parameters``...), or the
        place under it when precise (``text.format.schema.properties.x.pattern``)."""
        if not self.precise:
            return base
        return base + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in self.path)


def schema_limits(schema: Any, limits: SchemaLimits = _DEFAULT_LIMITS) -> SchemaFault | None:
    """The first place where ``schema`` breaks the limits of the module
    docstring (depth, node count, width, counts, a pattern RE2 cannot run);
    None when it keeps them. A cheap walk without recursion, so any depth and
    any size are safe to ask about: it stops at the first fault."""
    walk = schema_walk(schema, limits)
    while True:
        try:
            next(walk)
        except StopIteration as end:
            fault: SchemaFault | None = end.value
            return fault


def schema_walk(
    schema: Any, limits: SchemaLimits = _DEFAULT_LIMITS
) -> Generator[None, None, SchemaFault | None]:
    """:func:`schema_limits` one object or array at a time: the generator
    stops after each, and returns the first fault (or None) when done.

    ``schema`` is a decoded schema, or its JSON text as a ``msgspec.Raw``:
    then each object or array is decoded alone as it is reached, its members
    left as their JSON text, so a schema far past the limits is refused
    without being built (the walk stops at the first fault, the same fault
    in the same place as on the decoded schema)."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(schema, ())]
    nodes = 0
    while stack:
        node, path = stack.pop()
        if len(path) >= MAX_SCHEMA_DEPTH:
            return SchemaFault(path, f"nested deeper than {MAX_SCHEMA_DEPTH} levels")
        nodes += 1
        if nodes > limits.max_nodes:
            why = f"more than {limits.max_nodes} objects and arrays in the schema"
            return SchemaFault(path, why)
        if isinstance(node, msgspec.Raw):
            if _far_past(node, _FAR_PAST * limits.max_width):
                return SchemaFault(path, _too_wide(_FAR_PAST * limits.max_width + 1, limits))
            node = _opened.decode(node)
        if len(node) > limits.max_width:
            return SchemaFault(path, _too_wide(len(node), limits))
        children = node.items() if isinstance(node, Mapping) else enumerate(node)
        for key, sub in children:
            nested = _nests(sub)
            if isinstance(sub, msgspec.Raw) and not nested:
                if key not in _COUNT_KEYWORDS and key != "pattern":
                    continue  # a value the walk does not read
                sub = msgspec.json.decode(sub)
            if key in _COUNT_KEYWORDS and isinstance(sub, int) and sub > MAX_SCHEMA_COUNT:
                return SchemaFault(path, f"'{key}' above {MAX_SCHEMA_COUNT} ({sub})")
            if key == "pattern" and isinstance(sub, str) and (bad := pattern_error(sub)):
                why = f"'pattern' is not a regular expression this server runs (RE2: {bad})"
                return SchemaFault((*path, key), why, precise=True)
            if nested and key not in _DATA_KEYWORDS:
                stack.append((sub, (*path, key)))
        yield
    return None


#: One object or array of a schema given as JSON text, its members left as text.
_opened: Final = msgspec.json.Decoder(dict[str, msgspec.Raw] | list[msgspec.Raw])

#: An object or array of more than this many times ``max_width`` members is
#: refused as having "more than" that many: one given as JSON text is then
#: refused without being opened (counting 120,000 members exactly meant
#: building their keys, 25-50 ms holding the interpreter).
_FAR_PAST: Final = 2
#: The largest count :func:`_far_past` decides without opening the object.
_MOST_DECIDED: Final = 1 << 15
#: ``{``, ``}`` and ``:`` read as ``[``, ``]`` and ``,``: an object of n members
#: becomes an array of 2n elements (no string is cut: only quotes and
#: backslashes delimit strings), the keys and values in turn.
_AS_ARRAY: Final = bytes.maketrans(b"{}:", b"[],")


def _too_wide(count: int, limits: SchemaLimits) -> str:
    far = _FAR_PAST * limits.max_width
    many = f"more than {far}" if count > far else f"{count}"
    return f"{many} members in one object or array; the limit is {limits.max_width}"


def _far_past(node: msgspec.Raw, count: int) -> bool:
    """Whether ``node``, an object as JSON text, has more than ``count``
    members as written (a key given twice counts twice), decided without
    building them: read as an array (:data:`_AS_ARRAY`), its elements are
    checked by a decoder that stops at element ``2 * count + 1``, in about
    1 ms a MB. Text too short to hold that many is not read."""
    if len(node) <= 5 * count or 2 * count > _MOST_DECIDED or memoryview(node)[0] != ord("{"):
        return False
    try:
        _at_most(2 * count).decode(bytes(node).translate(_AS_ARRAY))
    except msgspec.ValidationError:
        return True
    return False


@functools.cache
def _at_most(count: int) -> msgspec.json.Decoder[Any]:
    """A decoder of JSON arrays of at most ``count`` elements (left as text) that
    refuses a longer one as soon as it reads one element more."""
    fields = [(f"e{i}", msgspec.Raw, msgspec.Raw(b"null")) for i in range(count)]
    shape = msgspec.defstruct("_AtMost", fields, array_like=True, forbid_unknown_fields=True)
    return msgspec.json.Decoder(shape)


_at_most(2 * _FAR_PAST * MAX_SCHEMA_WIDTH)  # made once, at import, for the default limit


def _nests(value: Any) -> bool:
    """Whether ``value`` (decoded, or JSON text) is an object or an array."""
    if isinstance(value, msgspec.Raw):
        return len(value) > 0 and memoryview(value)[0] in _OPENERS
    return isinstance(value, Mapping | list)


_OPENERS: Final = frozenset(b"{[")


def format_name_refusal() -> RemoteProtocolError:
    """The refusal of a ``text.format.name`` outside :data:`FORMAT_NAME_PATTERN`."""
    return RemoteProtocolError(
        "Invalid 'text.format.name': use 1-64 characters from [A-Za-z0-9_-].",
        code=ErrorCode.INVALID_VALUE,
        param="text.format.name",
    )


def format_schema_refusal(fault: SchemaFault) -> RemoteProtocolError:
    """The refusal of a ``text.format`` schema that breaks a limit at ``fault``."""
    return RemoteProtocolError(
        f"Invalid schema for response format {fault.message}.",
        code=ErrorCode.INVALID_VALUE,
        param=fault.param(_SCHEMA_PARAM),
    )


def check_format(text_format: TextFormat | None, limits: SchemaLimits = _DEFAULT_LIMITS) -> None:
    """Check a request's ``text.format`` (the rules in the module docstring).

    Raises :class:`RemoteProtocolError` (``invalid_value``, param
    ``text.format.name`` or ``text.format.schema``); nothing is kept.
    """
    if not isinstance(text_format, FormatJSONSchema):
        return
    if not FORMAT_NAME_PATTERN.fullmatch(text_format.name):
        raise format_name_refusal()
    schema = text_format.schema
    fault = schema_limits(schema, limits)
    if fault is not None:
        raise format_schema_refusal(fault)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        pointer = "#" + "".join(f"/{part}" for part in exc.path)
        raise _refuse(pointer, exc.message) from None
    except RecursionError:
        raise _refuse("#", "nested too deeply to check") from None
    if text_format.strict:
        _check_strict(schema, schema, "#", 0)


def _check_strict(  # noqa: C901 (strict mode's rules, one after another)
    schema: Any, root: Mapping[str, Any], where: str, nesting: int
) -> None:
    if not isinstance(schema, Mapping):
        raise _refuse(where, "strict mode needs a schema object here")
    unknown = sorted(set(schema) - STRICT_KEYWORDS)
    if unknown:
        raise _refuse(where, f"strict mode does not support '{unknown[0]}'")
    if nesting > MAX_NESTING:
        raise _refuse(where, f"strict mode allows at most {MAX_NESTING} levels of nesting")
    if where == "#" and ("anyOf" in schema or schema_types(schema) != ["object"]):
        raise _refuse(where, 'the root must be an object schema ("type": "object"), not anyOf')
    for name in ("$defs", "definitions"):
        for key, sub in (schema.get(name) or {}).items():
            _check_strict(sub, root, f"{where}/{name}/{key}", 0)
    if "$ref" in schema:
        ref = schema["$ref"]
        if resolve_ref(ref, root) is None:
            raise _refuse(where, f"'$ref' {ref!r} does not point inside this schema")
        return
    if not any(key in schema for key in ("type", "anyOf", "enum", "const")):
        raise _refuse(where, "strict mode needs 'type' (or anyOf, enum, const) on every schema")
    for index, branch in enumerate(schema.get("anyOf") or []):
        _check_strict(branch, root, f"{where}/anyOf/{index}", nesting)
    types = schema_types(schema)
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
