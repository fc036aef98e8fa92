"""The ASGI types, declared once for the whole serve layer (as starlette's ``types.py``).

A scope and a message are mutable mappings; ``receive`` and ``send`` are the
two awaitables of the ASGI interface; an application takes all three.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["ASGIApp", "Message", "Receive", "Scope", "Send"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
