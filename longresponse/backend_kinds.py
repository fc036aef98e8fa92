"""The kinds of real model backend: the one list of them, each with where its class lives.

``chat`` (an engine's Chat Completions API), ``responses`` (a Responses API
over HTTP, SSE) and ``responses-ws`` (its WebSocket mode). A new kind is named
here and nowhere else: the registry opens a backend by its kind's entry
(``backends/registry.py``, importing the class only when a model of that kind
is configured), and the settings offer and check the kinds listed here
(``config.py``, ``backends/settings.py``). The module imports nothing and
stands below both, so the settings read it without an import up into the
backends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["KINDS"]

#: kind -> (module, class) of its backend; the first is the default kind.
KINDS: Final[Mapping[str, tuple[str, str]]] = {
    "chat": ("longresponse.backends.chat", "ChatBackend"),
    "responses": ("longresponse.backends.responses_http", "ResponsesBackend"),
    "responses-ws": ("longresponse.backends.responses_ws", "ResponsesWSBackend"),
}
