"""``longresponse`` command line: ``longresponse serve [flags]``, the benchmarks.

``serve``'s flags are made from the settings' declarations
(``longresponse.config.SETTINGS``), which also give each its variable and its
key in a settings file (``longresponse.settings``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import logging
import math
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any, Final

from . import settings
from .backends import settings as backend_settings
from .backends.registry import missing_keys
from .config import ServerConfig
from .storage.keys import API_KEYS_ENV, ApiKeys, is_loopback

__all__ = ["BENCH_EXTRA", "build_parser", "config_from_args", "main", "uvicorn_config"]

#: The benchmark commands and the module behind each.
BENCH_COMMANDS: Final = {
    "bench": ("compare", "compare every transport and reuse switch on simulated rollouts"),
    "bench-throughput": ("throughput", "stream throughput of one connection"),
    "bench-scale": ("scale", "many concurrent paused rollouts: memory and resume latency"),
    "bench-engine": ("engine", "the two-hop benchmark on llama.cpp: direct vs each gateway path"),
    "soak": ("soak", "connections of mixed shapes for minutes: errors, latency, memory"),
}
#: What the benchmark commands import beyond the server: the ``[bench]`` extra.
BENCH_EXTRA: Final = ("httpx", "matplotlib", "tqdm", "openai", "agents")


def missing_bench_dependency() -> str | None:
    """The first package of the ``[bench]`` extra that cannot be imported, or ``None``."""
    for name in BENCH_EXTRA:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ImportError:
            return name
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="longresponse",
        description="A whole LLM agent rollout as one long-running Response over a WebSocket.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {metadata.version('longresponse')}"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the server",
        description="Run the longresponse server (uvicorn + wsproto) with the simulated model. "
        "Each setting is taken from its flag, else its LONGRESPONSE_* variable, else the "
        "[server] table of the --config file, else its default.",
        formatter_class=settings.HelpFormatter,
    )
    settings.add_arguments(serve)
    missing = missing_bench_dependency()
    for name, (module, summary) in BENCH_COMMANDS.items():
        sub = commands.add_parser(
            name,
            help=summary,
            description=f"longresponse {name}: {summary}.",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        sub.set_defaults(bench_module=module)
        if missing is None:  # without the [bench] extra, main() refuses before parsing
            _bench_module(module).add_arguments(sub)
    return parser


def _bench_module(name: str) -> Any:
    return importlib.import_module(f"longresponse.bench.{name}")


def config_from_args(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> ServerConfig:
    """The server's configuration: each setting from its flag in ``args``, else
    its variable in ``env`` (default ``os.environ``), else the settings file,
    else its default (``longresponse.settings``).

    Raises :class:`~longresponse.settings.SettingsError` for a bad variable,
    file or backend table.
    """
    return _configured(settings.resolve(args, env))


def _configured(values: Mapping[str, Any]) -> ServerConfig:
    """The ServerConfig of resolved settings, with the backends they name."""
    backends = backend_settings.backends_from_args(argparse.Namespace(**values), env={})
    return settings.server_config(values, backends=backends)


def uvicorn_config(config: ServerConfig, *, log_level: str = "info") -> object:
    """The uvicorn configuration that serves ``config`` (wsproto WebSockets)."""
    import uvicorn

    from .serve.app import create_app
    from .serve.ws.oversize import LingeringWSProtocol

    return uvicorn.Config(
        create_app(config),
        host=config.host,
        port=config.port,
        ws=LingeringWSProtocol,  # wsproto, with a 1009 that reaches the client
        # asyncio's loop, backing off accept() at the open-file limit.
        loop="longresponse.serve.accept:AcceptLoop",
        # Messages up to max_message_bytes get an error event and the socket
        # stays usable; uvicorn refuses (close 1009) beyond twice that, before
        # buffering more.
        ws_max_size=2 * config.max_message_bytes,
        ws_per_message_deflate=config.ws_compression,
        ws_ping_interval=config.ws_ping_interval or None,
        ws_ping_timeout=config.ws_ping_interval or None,
        # Open HTTP connections (SSE readers) get the drain timeout too.
        timeout_graceful_shutdown=max(1, math.ceil(config.shutdown_drain_timeout)),
        lifespan="on",
        log_level=log_level,
    )


def store_problem(config: ServerConfig) -> str | None:
    """Why the configured store cannot be used (a bad URL, nothing answering), or ``None``."""
    import asyncio

    from .storage.backends import StoreError, open_store

    async def probe() -> None:
        store = open_store(config.store, ttl=config.store_ttl)
        try:
            await store.ping()
        finally:
            await store.aclose()

    try:
        asyncio.run(probe())
    except (ValueError, StoreError) as exc:
        return f"cannot use the store {config.store!r}: {exc}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in BENCH_COMMANDS and (missing := missing_bench_dependency()):
        print(
            f"longresponse {argv[0]}: needs the [bench] extra ({missing} is not installed): "
            "pip install 'longresponse[bench]'",
            file=sys.stderr,
        )
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        import uvicorn

        try:
            values = settings.resolve(args)
            config = _configured(values)
        except settings.SettingsError as exc:
            parser.error(str(exc))
        if (missing := missing_keys(config.backends)) is not None:
            parser.error(missing)
        keys = ApiKeys.from_env(config.api_keys, operator=config.operator_key)
        if not is_loopback(config.host) and not keys.enabled and not config.allow_unauthenticated:
            parser.error(
                f"refusing to listen on {config.host} without API keys: pass --api-key "
                f"(or set {API_KEYS_ENV}), or --allow-unauthenticated to accept anyone"
            )
        problem = store_problem(config)
        if problem is not None:
            print(f"longresponse: {problem}", file=sys.stderr)
            return 2
        from .serve.shutdown import GracefulServer

        logging.basicConfig(level=values["log_level"].upper())
        served = uvicorn_config(config, log_level=values["log_level"])
        assert isinstance(served, uvicorn.Config)
        parts = served.app.parts  # type: ignore[union-attr]
        server = GracefulServer(
            served,
            parts.endpoint,
            drain_timeout=config.shutdown_drain_timeout,
            background=parts.background,
        )
        from .serve.collector import fix_mmap_threshold, set_switch_interval, tune_gc

        tune_gc(values["gc_young_threshold"])
        fix_mmap_threshold(values["mmap_threshold"])
        set_switch_interval()
        # On SIGINT/SIGTERM the WebSockets drain (turns in flight finish, then
        # close 1012), uvicorn shuts down cleanly (the lifespan drains the
        # post-inference queue), then re-raises the signal it captured.
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
        return 0
    if getattr(args, "bench_module", None):
        return int(_bench_module(args.bench_module).main(args))
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
