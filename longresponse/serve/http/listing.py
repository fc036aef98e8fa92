"""A list of items as the list endpoints answer it: ``limit``, ``order`` and
``after`` read from the query, and the ``{object: "list", ...}`` page
(``GET /v1/responses/{id}/input_items`` and a conversation's items)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeVar

from protocol import ErrorCode, RemoteProtocolError

__all__ = ["item_id", "list_query", "page", "past"]

#: Items a page holds when the query names no ``limit``, and at most.
DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 100

_T = TypeVar("_T")


def item_id(item: object) -> str | None:
    """An item's ``id``, when it has one."""
    found = getattr(item, "id", None)
    return found if isinstance(found, str) else None


def list_query(query: Mapping[str, str]) -> tuple[int, str]:
    """``(limit, order)`` of a list request. Raises :class:`RemoteProtocolError`
    ``invalid_value`` naming the parameter."""
    limit = DEFAULT_LIMIT
    if (written := query.get("limit")) is not None:
        try:
            limit = int(written)
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_LIMIT:
            raise RemoteProtocolError(
                f"Invalid 'limit': expected an integer from 1 to {MAX_LIMIT}.",
                code=ErrorCode.INVALID_VALUE,
                param="limit",
            )
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise RemoteProtocolError(
            "Invalid 'order': expected 'asc' or 'desc'.",
            code=ErrorCode.INVALID_VALUE,
            param="order",
        )
    return limit, order


def past(items: list[_T], after: str | None, *, noun: str, where: str) -> list[_T]:
    """The ``items`` after the one whose id is ``after`` (all of them without
    one). Raises ``invalid_value`` (param ``after``) when no item has that id:
    "No ``noun`` with id '…' in ``where``."."""
    if after is None:
        return items
    ids = [item_id(item) for item in items]
    if after not in ids:
        raise RemoteProtocolError(
            f"No {noun} with id '{RemoteProtocolError.clip(after)}' in {where}.",
            code=ErrorCode.INVALID_VALUE,
            param="after",
        )
    return items[ids.index(after) + 1 :]


def page(items: Sequence[Any], *, has_more: bool) -> dict[str, Any]:
    """The list object of ``items``."""
    return {
        "object": "list",
        "data": list(items),
        "first_id": item_id(items[0]) if items else None,
        "last_id": item_id(items[-1]) if items else None,
        "has_more": has_more,
    }
