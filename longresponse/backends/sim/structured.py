"""The simulated model's answers in JSON: the first value a schema allows.

:func:`answer_in_format` is the simulated model's side of structured outputs
(their check at admission is :mod:`longresponse.engine.structured`). Given the text it
would have answered, it writes JSON instead: for ``json_object``,
``{"answer": text}``; for a schema, the first value the schema allows,
built from the root down (the first ``anyOf`` branch, the first ``enum``
value, numbers from their bounds, arrays of ``minItems`` or one item), where
every free string (no ``enum``, ``const`` or ``format``, and a ``pattern``
the text meets) holds the text itself, so the answer still quotes its whole
context. A string whose ``pattern`` the text does not meet gets an example
built from the pattern (its first branch, the least repetitions, the first
character of each class: ``longresponse.backends.sim.patterns``).

The answer is bounded by the Response's output budget before it is built:
every value costs at least one token, and a string one more per
:data:`CHARS_PER_TOKEN` characters, so an array of ``minItems`` (or a
padded ``minLength``) stops where the budget does, and a ``$ref`` cycle
ends after :data:`_GIVE_UP` levels. An answer cut short this way is
reported incomplete (the model ran out of tokens), never sent as complete.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from protocol.response import FormatJSONObject, FormatJSONSchema, TextFormat

from ...json_schema import resolve_ref, schema_types
from .patterns import pattern_example, pattern_matches

__all__ = ["CHARS_PER_TOKEN", "DEFAULT_ANSWER_TOKENS", "answer_in_format", "value_for_schema"]

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
CHARS_PER_TOKEN: Final = 64

#: The output budget when a request sets none (the simulated models' largest answer).
DEFAULT_ANSWER_TOKENS: Final = 128_000

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
            target = resolve_ref(schema["$ref"], self.root)
            return self.value(target if target is not None else {}, depth + 1)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        branches = schema.get("anyOf") or schema.get("oneOf")
        if branches:
            nullable = [
                b for b in branches if isinstance(b, Mapping) and schema_types(b) == ["null"]
            ]
            branch = nullable[0] if depth > _DEEP and nullable else branches[0]
            return self.value(branch, depth + 1)
        types = schema_types(schema)
        if not types:
            types = ["object"] if "properties" in schema else ["string"]
        kind = "null" if depth > _DEEP and "null" in types else types[0]
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind in ("integer", "number"):
            return _number(schema, integer=kind == "integer")
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return self._string(schema)

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, sub in (schema.get("properties") or {}).items():
            if not self.left:
                self.complete = False
                break
            result[key] = self.value(sub, depth + 1)
        return result

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
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

    def _string(self, schema: Mapping[str, Any]) -> str:
        room = self.left * CHARS_PER_TOKEN
        value = _string(schema, self.text, room)
        if not self._charge(len(value) // CHARS_PER_TOKEN):
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
