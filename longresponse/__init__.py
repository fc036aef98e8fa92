"""longresponse: a whole LLM agent rollout as ONE long-running Response.

The server (:func:`create_app`, :class:`Session`, :class:`Rollout`, the
compat layer and the HTTP API), the request pipeline and its secrets
classifier, the stores, the simulated models, the rendered-token cache and
the trio client (``longresponse.client``). The wire protocol lives in the
sibling package ``protocol`` (sans-IO).
"""

from .app import ResponsesEndpoint, create_app
from .auth import ApiKeys
from .classifier import Finding, Policy, redact, scan
from .compat import SegmentCache, ShippedShape
from .config import ServerConfig, SimConfig
from .http import HTTPTokenCache, ResponsesHTTP
from .persistence import Persistence
from .pipeline import Counters, Pipeline, Switches
from .render import TokenCache
from .rollout import Boundary, Rollout, TurnTiming
from .sampler import ModelRegistry, ModelSpec, Sampler, SampleRequest, SimSampler
from .server_process import ServerProcess
from .session import Session
from .store import ResponseStore, StoredResponse, UsageRecord, open_store

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
