"""Opening the configured backends and serving them beside the simulated models.

Each :class:`~longresponse.config.BackendConfig` becomes one :class:`Backend`
(its kind's class, imported only when a model of that kind is configured, so
an unused backend's dependencies are never loaded), which owns the network
clients shared by every rollout of its model and hands each rollout a sampler
of its own. :func:`serve_backends` adds one
:class:`~longresponse.engine.sampling.ModelSpec` per backend to the registry
(no ``check_request``: the ``sim_*`` metadata is the simulated model's own;
it compacts with the engine's summary, ``longresponse.engine.summary``, as
the server has no model-written summary). As the app starts it asks each
upstream whether it serves the configured model (:func:`check_backends`,
``backends/served_model.py``: a wrong name or path is logged at ERROR with
the setting to change), and it closes the backends when it stops
(:func:`close_backends`).
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from protocol import ErrorCode, RemoteProtocolError

from ..backend_kinds import KINDS
from ..config import BackendConfig, SimConfig
from ..engine.sampling import ModelSpec, Sampler
from .settings import SettingsError
from .sim.sampler import sim_spec

__all__ = [
    "Backend",
    "ModelRegistry",
    "check_backends",
    "close_backends",
    "missing_keys",
    "open_backends",
    "serve_backends",
]


class ModelRegistry:
    """Resolves a model name (or alias) to a :class:`ModelSpec`."""

    def __init__(self, sim: SimConfig | None = None, *, counters: Any = None) -> None:
        sim = sim or SimConfig()
        # Two simulated models with the same behaviour and separate sampler
        # state, so that switching models mid-conversation can be exercised.
        self._models: dict[str, ModelSpec] = {
            name: sim_spec(name, sim) for name in ("sim", "sim-alt")
        }
        self.resolutions = 0  # how many times resolve() ran (for measurement)
        #: Optional shared counters (the pipeline's) that also count resolutions.
        self.counters: Any = counters

    def names(self) -> list[str]:
        return sorted(self._models)

    def specs(self) -> list[ModelSpec]:
        return [self._models[name] for name in self.names()]

    def add(self, spec: ModelSpec) -> None:
        """Serve ``spec`` under its name (a real backend; replaces a sim of that name)."""
        self._models[spec.name] = spec

    def get(self, name: str | None) -> ModelSpec | None:
        """The model named ``name`` (``None``: ``sim``), if served; not counted as
        a resolution, and never an error (:meth:`resolve` refuses an unknown name)."""
        return self._models.get(name or "sim")

    def resolve(self, name: str | None) -> ModelSpec:
        """The model named ``name`` (``None`` means the default, ``sim``).

        Raises :class:`RemoteProtocolError` ``model_not_found`` (param ``model``).
        """
        self.resolutions += 1
        if self.counters is not None:
            self.counters.resolutions += 1
        spec = self._models.get(name or "sim")
        if spec is None:
            raise RemoteProtocolError(
                f"The model {name!r} does not exist. Available: {', '.join(self.names())}.",
                code=ErrorCode.MODEL_NOT_FOUND,
                param="model",
                status=404,
            )
        return spec


class Backend(Protocol):
    """An engine behind one served model name."""

    config: BackendConfig

    def make_sampler(self) -> Sampler:
        """A sampler for one rollout (it may keep per-rollout state, e.g. an
        affinity key or an upstream socket, for the rollout's life)."""
        ...

    async def check(self) -> None:
        """Ask the upstream once whether it serves the configured model; log what a
        wrong setting is and how to mend it (``backends/served_model.py``). Never raises."""
        ...

    async def aclose(self) -> None:
        """Close the network clients (the app is stopping)."""
        ...


def missing_keys(
    configs: Iterable[BackendConfig], env: Mapping[str, str] | None = None
) -> str | None:
    """Why a backend cannot start for want of its API key (naming only the variable)."""
    env = os.environ if env is None else env
    for config in configs:
        if config.api_key_env and not env.get(config.api_key_env):
            return (
                f"model {config.name!r}: the environment variable {config.api_key_env} "
                "(its API key) is not set"
            )
    return None


def open_backends(configs: Sequence[BackendConfig]) -> list[Backend]:
    """One backend per configuration (raises :class:`SettingsError` for a kind not built in)."""
    backends: list[Backend] = []
    for config in configs:
        where = KINDS.get(config.kind)
        if where is None:
            raise SettingsError(f"model {config.name!r}: unknown backend kind {config.kind!r}")
        module, name = where
        backends.append(getattr(importlib.import_module(module), name)(config))
    return backends


def serve_backends(registry: ModelRegistry, backends: Iterable[Backend]) -> None:
    """Serve each backend's model under its configured name."""
    for backend in backends:
        config = backend.config
        registry.add(
            ModelSpec(
                name=config.name,
                context_window=config.context_window,
                max_output_tokens=config.max_output_tokens,
                make_sampler=backend.make_sampler,
                owned_by=config.kind,
                # No sim_* checks; it compacts with the engine's summary.
            )
        )


async def check_backends(backends: Iterable[Backend]) -> None:
    """Each backend's check of its upstream (:meth:`Backend.check`), all at once."""
    await asyncio.gather(*(backend.check() for backend in backends))


async def close_backends(backends: Iterable[Backend]) -> None:
    for backend in backends:
        await backend.aclose()
