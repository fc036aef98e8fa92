"""A JSON Schema, read: the types a subschema declares and what a local ``$ref`` names.

Both the engine's admission check of a ``text.format`` schema
(``longresponse.engine.structured``) and the simulated model's answers in a
format (``longresponse.backends.sim.structured``) walk schemas with these;
neither owns JSON Schema, so it lives beside them, importing nothing of the
project. Nothing here raises on a malformed schema: an unknown type is left
out, a ``$ref`` that does not resolve is ``None``.

A ``pattern`` is matched by RE2 (``google-re2``, the maintained binding of
Google's RE2), whose matching time is linear in the text: Python's ``re``
backtracks, and ``(x+)+y`` against 26 ``x`` held the event loop (and every
tenant) for seconds. What RE2 cannot run (back references, lookarounds,
huge repetitions) is reported by :func:`pattern_error`; admission refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Final

import re2  # type: ignore[import-untyped]

__all__ = ["TYPES", "pattern_error", "pattern_matches", "resolve_ref", "schema_types"]

#: The JSON Schema type names.
TYPES: Final = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


def schema_types(schema: Mapping[str, Any]) -> list[str]:
    """The known type names ``schema``'s ``type`` declares (one or a list)."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind] if kind in TYPES else []
    if isinstance(kind, list):
        return [k for k in kind if k in TYPES]
    return []


def resolve_ref(ref: Any, root: Mapping[str, Any]) -> Any:
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


_RE2_OPTIONS: Final = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused client pattern is an answer, not a log line


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    """``pattern`` compiled by RE2; raises ``re2.error`` when RE2 cannot run it."""
    return re2.compile(pattern, options=_RE2_OPTIONS)


def pattern_error(pattern: str) -> str | None:
    """Why RE2 cannot run ``pattern`` (back references, lookarounds, a
    repetition too large...), or None when it can."""
    try:
        _compiled(pattern)
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        return why.decode(errors="replace") if isinstance(why, bytes) else str(why)
    return None


def pattern_matches(pattern: str, value: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``value``, in time linear in
    ``value`` (RE2). False when RE2 cannot compile it (admission refuses such
    a pattern first)."""
    try:
        return _compiled(pattern).search(value) is not None
    except re2.error:
        return False
