"""longresponse: a whole LLM agent rollout as ONE long-running Response.

Three layers: the engine (``longresponse.engine``: :class:`Rollout`, its
:class:`Segment` view, admission and the secrets classifier, rendering and
the token cache, the simulated models), knowing no socket; the adapters
(``longresponse.serve``: :func:`create_app`, the WebSocket :class:`Session`,
the shipped shape, the HTTP API, one way to start a turn); and the stores
(``longresponse.storage``). Beside them the trio client
(``longresponse.client``), the config and the benchmark. The wire protocol
lives in the sibling package ``protocol`` (sans-IO).
"""

from .config import ServerConfig, SimConfig, Switches
from .engine.admission import Counters, Pipeline
from .engine.classifier import Finding, Policy, redact, scan
from .engine.models import ModelRegistry, ModelSpec, Sampler, SampleRequest, SimSampler
from .engine.render import TokenCache
from .engine.rollout import Rollout
from .engine.segment import Boundary, Segment
from .engine.timing import TurnTiming
from .serve.app import ResponsesEndpoint, create_app
from .serve.http import ResponsesHTTP
from .serve.http_token_cache import HTTPTokenCache
from .serve.shipped import SegmentCache, ShippedShape
from .serve.ws import Session
from .server_process import ServerProcess
from .storage.backends import ResponseStore, StoredResponse, UsageRecord, open_store
from .storage.keys import ApiKeys
from .storage.persistence import Persistence

__all__ = [
    "ApiKeys",
    "Boundary",
    "Counters",
    "Finding",
    "HTTPTokenCache",
    "ModelRegistry",
    "ModelSpec",
    "Persistence",
    "Pipeline",
    "Policy",
    "ResponseStore",
    "ResponsesEndpoint",
    "ResponsesHTTP",
    "Rollout",
    "SampleRequest",
    "Sampler",
    "Segment",
    "SegmentCache",
    "ServerConfig",
    "ServerProcess",
    "Session",
    "ShippedShape",
    "SimConfig",
    "SimSampler",
    "StoredResponse",
    "Switches",
    "TokenCache",
    "TurnTiming",
    "UsageRecord",
    "create_app",
    "open_store",
    "redact",
    "scan",
]
