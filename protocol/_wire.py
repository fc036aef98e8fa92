"""The one way to read a Struct's wire ``type`` (its msgspec tag)."""

from __future__ import annotations

from typing import Any

__all__ = ["wire_type"]

_TAGS: dict[type, str] = {}


def wire_type(obj: Any) -> str:
    """The wire ``type`` of an event, item or content part, or of its class."""
    cls = obj if isinstance(obj, type) else type(obj)
    tag = _TAGS.get(cls)
    if tag is None:
        tag = _TAGS[cls] = str(cls.__struct_config__.tag)  # type: ignore[attr-defined]
    return tag
