"""A JSON Schema, read: the types a subschema declares and what a local ``$ref`` names.

Both the engine's admission check of a ``text.format`` schema
(``longresponse.engine.structured``) and the simulated model's answers in a
format (``longresponse.backends.sim.structured``) walk schemas with these;
neither owns JSON Schema, so it lives beside them, importing nothing of the
project. Nothing here raises on a malformed schema: an unknown type is left
out, a ``$ref`` that does not resolve is ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["TYPES", "resolve_ref", "schema_types"]

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
