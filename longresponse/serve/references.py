"""Item references: ``input`` items that name a stored item by its id.

A client with ``store`` on (the Vercel AI SDK at its defaults) sends earlier
items back as ``{"type": "item_reference", "id": "msg_..."}``, or as the bare
``{"id": "msg_..."}``. Each transport resolves them where it receives a
request (a create over HTTP, ``/input_tokens``, a WebSocket
``response.create`` or ``response.append``), before anything else reads the
input: admission, counting, rendering and the protocol core see only items.

A reference names an item of the API key's own stored responses (their input,
output and context items) or conversations (``Persistence.items``). One that
names no such item, another key's among them, is refused: ``invalid_value``,
param ``input[i].id``.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from protocol import ErrorCode, RemoteProtocolError
from protocol.events import ResponseAppend, ResponseCreate
from protocol.items import Item, ItemReference

from ..storage.persistence import Persistence

__all__ = ["resolve_references"]

_Event = TypeVar("_Event", bound=ResponseCreate | ResponseAppend)


async def resolve_references(
    event: _Event, persistence: Persistence | None, *, owner: str
) -> _Event:
    """``event`` with each item reference of its ``input`` replaced by the item
    ``owner`` stored under that id; ``event`` itself when it holds none.

    Raises :class:`RemoteProtocolError` ``invalid_value`` (param
    ``input[i].id``, the first reference found by no item of ``owner``), or
    the store's :class:`StoreError`; ``event`` is never changed.
    """
    if isinstance(event.input, str):
        return event
    wanted = {item.id for item in event.input if isinstance(item, ItemReference)}
    if not wanted:
        return event
    found = await persistence.items(wanted, owner=owner) if persistence is not None else {}
    resolved: list[Item] = []
    for index, item in enumerate(event.input):
        if not isinstance(item, ItemReference):
            resolved.append(item)
            continue
        stored = found.get(item.id)
        if stored is None:
            raise RemoteProtocolError(
                f"Item with id {RemoteProtocolError.clip(item.id)!r} not found.",
                code=ErrorCode.INVALID_VALUE,
                param=f"input[{index}].id",
            )
        resolved.append(stored)
    return msgspec.structs.replace(event, input=resolved)
