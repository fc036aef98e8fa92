"""longresponse: a whole LLM agent rollout as ONE long-running Response.

Three layers: the engine (``longresponse.engine``: :class:`Rollout`, its
:class:`Segment` view, admission and the secrets classifier, rendering and
the token cache, the sampler interface), knowing no socket; the backends
(``longresponse.backends``: the simulated models and the real engines); Chat
Completions (``longresponse.chat``); the adapters
(``longresponse.serve``: :func:`create_app`, the WebSocket :class:`Session`,
the shipped shape, the HTTP API, one way to start a turn); and the stores
(``longresponse.storage``). Beside them the trio client
(``longresponse.client``), the config and the benchmark. The wire protocol
lives in the sibling package ``protocol`` (sans-IO).

Importing the package loads none of them: each name below is imported on
first use (PEP 562), so ``import longresponse.client`` loads the client and
the protocol only, not the server, its stores or their dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module (under this package) that defines it.
_EXPORTS: dict[str, str] = {
    "ApiKeys": "storage.keys",
    "Boundary": "engine.rollout",
    "Counters": "engine.admission",
    "Finding": "engine.classifier",
    "HTTPTokenCache": "serve.http.token_cache",
    "ModelRegistry": "backends.registry",
    "ModelSpec": "engine.sampling",
    "Persistence": "storage.persistence",
    "Pipeline": "engine.admission",
    "Policy": "engine.classifier",
    "ResponseStore": "storage.backends",
    "ResponsesEndpoint": "serve.app",
    "ResponsesHTTP": "serve.http.responses",
    "Rollout": "engine.rollout",
    "SampleRequest": "engine.sampling",
    "Sampler": "engine.sampling",
    "Segment": "engine.segment",
    "SegmentCache": "serve.ws.segment_cache",
    "ServerConfig": "config",
    "ServerProcess": "server_process",
    "Session": "serve.ws.session",
    "ShippedShape": "serve.ws.shipped",
    "SimConfig": "config",
    "SimSampler": "backends.sim.sampler",
    "StoredResponse": "storage.backends",
    "Switches": "config",
    "TokenCache": "engine.render",
    "TurnTiming": "engine.timing",
    "UsageRecord": "storage.backends",
    "create_app": "serve.app",
    "open_store": "storage.backends",
    "redact": "engine.classifier",
    "scan": "engine.classifier",
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
    from .backends.registry import ModelRegistry as ModelRegistry
    from .backends.sim.sampler import SimSampler as SimSampler
    from .config import ServerConfig as ServerConfig
    from .config import SimConfig as SimConfig
    from .config import Switches as Switches
    from .engine.admission import Counters as Counters
    from .engine.admission import Pipeline as Pipeline
    from .engine.classifier import Finding as Finding
    from .engine.classifier import Policy as Policy
    from .engine.classifier import redact as redact
    from .engine.classifier import scan as scan
    from .engine.render import TokenCache as TokenCache
    from .engine.rollout import Boundary as Boundary
    from .engine.rollout import Rollout as Rollout
    from .engine.sampling import ModelSpec as ModelSpec
    from .engine.sampling import Sampler as Sampler
    from .engine.sampling import SampleRequest as SampleRequest
    from .engine.segment import Segment as Segment
    from .engine.timing import TurnTiming as TurnTiming
    from .serve.app import ResponsesEndpoint as ResponsesEndpoint
    from .serve.app import create_app as create_app
    from .serve.http.responses import ResponsesHTTP as ResponsesHTTP
    from .serve.http.token_cache import HTTPTokenCache as HTTPTokenCache
    from .serve.ws.segment_cache import SegmentCache as SegmentCache
    from .serve.ws.session import Session as Session
    from .serve.ws.shipped import ShippedShape as ShippedShape
    from .server_process import ServerProcess as ServerProcess
    from .storage.backends import ResponseStore as ResponseStore
    from .storage.backends import StoredResponse as StoredResponse
    from .storage.backends import UsageRecord as UsageRecord
    from .storage.backends import open_store as open_store
    from .storage.keys import ApiKeys as ApiKeys
    from .storage.persistence import Persistence as Persistence
