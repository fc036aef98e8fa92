"""Which real engines serve which model names: a TOML file, flags, environment.

The registry of real backends is read from three places, the later adding to
(and, for a name already present, replacing) the earlier:

1. a TOML file (``--config PATH`` or ``LONGRESPONSE_CONFIG``), one table per
   served model name under ``[models]`` (beside the server's own settings in
   ``[server]``, read by ``longresponse.settings``)::

       [models.qwen]
       kind = "chat"                          # chat | responses | responses-ws
       base_url = "http://127.0.0.1:8000/v1"
       upstream_model = "Qwen/Qwen3-8B"       # the engine's own name
       api_key_env = "VLLM_API_KEY"           # the variable holding the key
       context_window = 32768
       first_token_timeout = 300

2. the simple case as flags (``--upstream URL --upstream-model M``, with
   ``--upstream-kind``, ``--upstream-api-key-env``, ``--served-model-name``,
   ``--upstream-context-window``),
3. or the same as ``LONGRESPONSE_UPSTREAM``, ``LONGRESPONSE_UPSTREAM_MODEL``,
   ``LONGRESPONSE_UPSTREAM_KIND``, ``LONGRESPONSE_UPSTREAM_API_KEY_ENV``,
   ``LONGRESPONSE_SERVED_MODEL_NAME``, ``LONGRESPONSE_UPSTREAM_CONTEXT_WINDOW``
   (a flag wins over its variable, and ``serve`` reads these from the file's
   ``[server]`` table too, below both).

Every field of :class:`~longresponse.config.BackendConfig` may appear in a
table; an unknown key, a wrong type or a value out of range is refused with a
message naming the table and the key (:class:`SettingsError`; ``serve``
exits 2). An API key itself is never read from the file or a flag, only the
name of the variable that holds it, so it cannot end up in a log or a shell
history by way of the configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from ..backend_kinds import KINDS
from ..config import BY_NAME, SETTINGS, BackendConfig, ranged
from ..settings import SettingsError, read_toml
from ..settings import add_arguments as add_setting_arguments

__all__ = [
    "ENV",
    "SettingsError",
    "add_arguments",
    "backends_from_args",
    "load_toml",
    "models_of",
    "shown_url",
]

#: The settings of the simple case and the file's path, declared with the rest
#: (``longresponse.config.SETTINGS``, in their own help group).
UPSTREAM_SETTINGS: Final = tuple(s for s in SETTINGS if s.group == BY_NAME["upstream"].group)
#: flag destination -> environment variable.
ENV: Final[Mapping[str, str]] = {setting.name: setting.env for setting in UPSTREAM_SETTINGS}

#: What ``tool_choice_auto`` may send the engine for a client's ``auto``.
TOOL_CHOICE_AUTO: Final = ("auto", "required")

#: (smallest, largest) of the numeric fields.
_RANGES: Final[Mapping[str, tuple[float, float]]] = {
    "context_window": (1, 100_000_000),
    "max_output_tokens": (1, 100_000_000),
    "connect_timeout": (0.001, 3600),
    "first_token_timeout": (0.001, 86_400),
    "idle_timeout": (0.001, 86_400),
    "max_retries": (0, 10),
    "retry_backoff": (0, 60),
    "slots": (0, 4096),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` flags of the backend registry."""
    add_setting_arguments(parser, UPSTREAM_SETTINGS)


_window = ranged("upstream_context_window", int)


def _setting(args: argparse.Namespace, name: str, env: Mapping[str, str]) -> Any:
    value = getattr(args, name, None)
    return value if value is not None else env.get(ENV[name]) or None


def backends_from_args(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> tuple[BackendConfig, ...]:
    """The configured backends: the TOML file's, then the one of the flags/environment."""
    env = os.environ if env is None else env
    backends: dict[str, BackendConfig] = {}
    path = _setting(args, "config", env)
    if path is not None:
        # The file may carry the server's settings too ([server], longresponse.settings).
        models = models_of(read_toml(path), path, beside=("server",))
        backends.update((b.name, b) for b in models)
    url = _setting(args, "upstream", env)
    model = _setting(args, "upstream_model", env)
    if url is None and model is None:
        return tuple(backends.values())
    if url is None or model is None:
        raise SettingsError("--upstream and --upstream-model go together (or their variables)")
    table: dict[str, Any] = {
        "kind": _setting(args, "upstream_kind", env) or "chat",
        "base_url": url,
        "upstream_model": model,
    }
    if (key_env := _setting(args, "upstream_api_key_env", env)) is not None:
        table["api_key_env"] = key_env
    if (window := _setting(args, "upstream_context_window", env)) is not None:
        try:
            table["context_window"] = _window(str(window))
        except argparse.ArgumentTypeError as exc:
            raise SettingsError(f"the upstream's context window {exc}") from None
    name = _setting(args, "served_model_name", env) or model
    backends[name] = backend(name, table, where="--upstream")
    return tuple(backends.values())


def load_toml(path: str) -> tuple[BackendConfig, ...]:
    """The ``[models.NAME]`` tables of the TOML file at ``path``, a file of models only."""
    return models_of(read_toml(path), path)


def models_of(
    data: Mapping[str, Any], path: str, *, beside: tuple[str, ...] = ()
) -> tuple[BackendConfig, ...]:
    """The ``[models.NAME]`` tables of a parsed TOML file, which may hold the
    ``beside`` tables too (any other is refused)."""
    unknown = sorted(set(data) - {"models", *beside})
    if unknown:
        allowed = " and ".join([*(f"[{table}]" for table in beside), "[models.NAME]"])
        raise SettingsError(f"{path}: unknown table {unknown[0]!r} (only {allowed})")
    models = data.get("models", {})
    if not isinstance(models, dict) or not all(isinstance(t, dict) for t in models.values()):
        raise SettingsError(f"{path}: [models] must hold one table per served model name")
    return tuple(
        backend(name, table, where=f"{path}: [models.{name}]") for name, table in models.items()
    )


def backend(name: str, table: Mapping[str, Any], *, where: str) -> BackendConfig:
    """One checked :class:`BackendConfig` from a table of settings."""
    fields = {f.name: f for f in dataclasses.fields(BackendConfig)}
    for key, value in table.items():
        field = fields.get(key)
        if field is None or key == "name":
            raise SettingsError(f"{where}: unknown setting {key!r}")
        _check(where, key, value, str(field.type))
    auto = table.get("tool_choice_auto", "auto")
    if auto not in TOOL_CHOICE_AUTO:
        raise SettingsError(f"{where}: tool_choice_auto must be auto or required, not {auto!r}")
    kind = table.get("kind")
    if kind not in KINDS:
        kinds = ", ".join(KINDS)
        raise SettingsError(f"{where}: kind must be one of {kinds}, not {kind!r}")
    url = table.get("base_url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https", "ws", "wss"):
        shown = shown_url(url) if isinstance(url, str) else url
        raise SettingsError(f"{where}: base_url must be an http(s) or ws(s) URL, not {shown!r}")
    if not urlsplit(url).hostname:
        raise SettingsError(f"{where}: base_url {shown_url(url)!r} names no host")
    return BackendConfig(name=name, **table)


def shown_url(url: str) -> str:
    """``url`` as a message may show it: without ``user:password@``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _check(where: str, key: str, value: Any, annotation: str) -> None:
    if "bool" in annotation:
        ok = isinstance(value, bool)
    elif "int" in annotation:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif "float" in annotation:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        ok = isinstance(value, str) or ("None" in annotation and value is None)
    if not ok:
        raise SettingsError(f"{where}: {key} must be of type {annotation}, not {value!r}")
    low, high = _RANGES.get(key, (None, None))
    if low is not None and high is not None and not low <= value <= high:
        raise SettingsError(f"{where}: {key} must be from {low:g} to {high:g}, not {value!r}")
