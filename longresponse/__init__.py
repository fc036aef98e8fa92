"""longresponse: a whole LLM agent rollout as ONE long-running Response.

The names here are what a user of the package imports: the trio client
(:func:`connect` and its :class:`AppendClient`, :func:`resilient` and its
:class:`ResilientClient`, which reconnects and resumes, with the errors they raise),
the server's settings (:class:`ServerConfig`, :class:`SimConfig`,
:class:`Switches`), the ASGI app factory (:func:`create_app`, to embed the
server under another ASGI server) and :class:`ServerProcess` (a
``longresponse serve`` child process, for tests and benchmarks). Everything
else is the server's inside and is imported from its module, where it is
declared: the engine (``longresponse.engine``: the Rollout, admission, the
token cache, the sampler interface), knowing no socket; the backends
(``longresponse.backends``); Chat Completions (``longresponse.chat``); the
adapters (``longresponse.serve``: the WebSocket session and its shapes, the
HTTP API); and the stores (``longresponse.storage``). The wire protocol lives
in the sibling package ``protocol`` (sans-IO).

Importing the package loads none of them: each name below is imported on
first use (PEP 562), so ``import longresponse.client`` loads the client and
the protocol only, not the server, its stores or their dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module (under this package) that defines it.
_EXPORTS: dict[str, str] = {
    "AppendClient": "client",
    "ClientError": "client",
    "ConnectionClosedError": "client",
    "HandshakeError": "client",
    "ResilientClient": "client",
    "ServerConfig": "config",
    "ServerProcess": "server_process",
    "SimConfig": "config",
    "Switches": "config",
    "connect": "client",
    "create_app": "serve.app",
    "resilient": "client",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'longresponse' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from .client import AppendClient as AppendClient
    from .client import ClientError as ClientError
    from .client import ConnectionClosedError as ConnectionClosedError
    from .client import HandshakeError as HandshakeError
    from .client import ResilientClient as ResilientClient
    from .client import connect as connect
    from .client import resilient as resilient
    from .config import ServerConfig as ServerConfig
    from .config import SimConfig as SimConfig
    from .config import Switches as Switches
    from .serve.app import create_app as create_app
    from .server_process import ServerProcess as ServerProcess
