"""longresponse: a whole LLM agent rollout as ONE long-running Response.

The server (:func:`create_app`, :class:`Session`, :class:`Rollout`), the
simulated model, the rendered-token cache and the trio client. The wire
protocol lives in the sibling package ``protocol`` (sans-IO).
"""

from .app import ResponsesEndpoint, create_app
from .config import ServerConfig, SimConfig
from .rollout import Rollout, TurnTiming
from .sampler import ModelRegistry, ModelSpec, Sampler, SampleRequest, SimSampler
from .session import Session

__all__ = [
    "ModelRegistry",
    "ModelSpec",
    "ResponsesEndpoint",
    "Rollout",
    "SampleRequest",
    "Sampler",
    "ServerConfig",
    "Session",
    "SimConfig",
    "SimSampler",
    "TurnTiming",
    "create_app",
]
