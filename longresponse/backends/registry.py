"""Opening the configured backends and serving them beside the simulated models.

Each :class:`~longresponse.config.BackendConfig` becomes one :class:`Backend`
(its kind's class, imported only when a model of that kind is configured, so
an unused backend's dependencies are never loaded), which owns the network
clients shared by every rollout of its model and hands each rollout a sampler
of its own. :func:`serve_backends` adds one
:class:`~longresponse.engine.models.ModelSpec` per backend to the registry;
the app closes the backends when it stops (:func:`close_backends`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Protocol

from ..config import BackendConfig
from ..engine.models import ModelRegistry, ModelSpec, Sampler
from .settings import SettingsError

__all__ = ["Backend", "close_backends", "missing_keys", "open_backends", "serve_backends"]

#: kind -> (module, class) of its backend.
KINDS: Final[Mapping[str, tuple[str, str]]] = {
    "chat": ("longresponse.backends.chat", "ChatBackend"),
    "responses": ("longresponse.backends.responses_http", "ResponsesBackend"),
    "responses-ws": ("longresponse.backends.responses_ws", "ResponsesWSBackend"),
}


class Backend(Protocol):
    """An engine behind one served model name."""

    config: BackendConfig

    def make_sampler(self) -> Sampler:
        """A sampler for one rollout (it may keep per-rollout state, e.g. an
        affinity key or an upstream socket, for the rollout's life)."""
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
            )
        )


async def close_backends(backends: Iterable[Backend]) -> None:
    for backend in backends:
        await backend.aclose()
