"""``longresponse`` command line: ``longresponse serve [flags]``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import logging
import math
import sys
from collections.abc import Sequence
from typing import Any, Final

from protocol import MAX_ITEMS_PER_EVENT, MAX_MESSAGE_BYTES

from . import config as limits
from .backends import settings as backend_settings
from .backends.registry import missing_keys
from .config import McpLimits, SchemaLimits, ServerConfig, SimConfig, Switches
from .storage.keys import API_KEYS_ENV, ApiKeys, is_loopback
from .storage.server_keys import COMPACTION_KEY_ENV

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
BENCH_EXTRA: Final = ("httpx", "matplotlib", "tqdm", "openai")


def missing_bench_dependency() -> str | None:
    """The first package of the ``[bench]`` extra that cannot be imported, or ``None``."""
    for name in BENCH_EXTRA:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ImportError:
            return name
    return None


_ranged = limits.ranged


def _scripted_call(text: str) -> tuple[str, str]:
    """An argparse type: ``NAME=JSON``, the JSON an object (``--sim-call``)."""
    name, sep, arguments = text.partition("=")
    try:
        value = json.loads(arguments) if sep and name else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"not NAME=<a JSON object>: {text!r}")
    return name, json.dumps(value, separators=(",", ":"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="longresponse",
        description="A whole LLM agent rollout as one long-running Response over a WebSocket.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the server",
        description="Run the longresponse server (uvicorn + wsproto) with the simulated model.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.add_argument("--host", default=limits.DEFAULT_HOST, help="address to listen on")
    serve.add_argument(
        "--port",
        type=_ranged("port", int),
        default=limits.DEFAULT_PORT,
        help="TCP port (0: any free one)",
    )
    serve.add_argument(
        "--max-message-bytes",
        type=_ranged("max_message_bytes", int),
        default=MAX_MESSAGE_BYTES,
        help="largest client message answered with an error event; twice this closes 1009",
    )
    serve.add_argument(
        "--max-items-per-event",
        type=_ranged("max_items_per_event", int),
        default=MAX_ITEMS_PER_EVENT,
        help="most input items one response.create or response.append may carry",
    )
    serve.add_argument(
        "--max-rollouts-per-connection",
        type=_ranged("max_rollouts_per_connection", int),
        default=limits.MAX_ROLLOUTS_PER_CONNECTION,
        help="append mode: live rollouts one connection may run at once",
    )
    serve.add_argument(
        "--send-queue-depth",
        type=_ranged("send_queue_depth", int),
        default=limits.SEND_QUEUE_DEPTH,
        help="encoded events buffered per connection before sampling waits for the reader",
    )
    serve.add_argument(
        "--send-queue-bytes",
        type=_ranged("send_queue_bytes", int),
        default=limits.SEND_QUEUE_BYTES,
        help="bytes of encoded events buffered per connection before sampling waits",
    )
    serve.add_argument(
        "--slow-reader-timeout",
        type=_ranged("slow_reader_timeout", float),
        default=limits.SLOW_READER_TIMEOUT,
        help="seconds the send queue may stay full before the reader is disconnected",
    )
    serve.add_argument(
        "--pause-timeout",
        type=_ranged("pause_timeout", float),
        default=limits.PAUSE_TIMEOUT,
        help="append mode: seconds a paused rollout waits for tool outputs before ending "
        "incomplete",
    )
    serve.add_argument(
        "--max-in-flight",
        type=_ranged("max_in_flight", int),
        default=limits.MAX_IN_FLIGHT,
        help="shipped shape: responses running at once per connection, across lanes; "
        "further creates wait in their lane's queue",
    )
    serve.add_argument(
        "--max-lanes",
        type=_ranged("max_lanes", int),
        default=limits.MAX_LANES,
        help="shipped shape: distinct named lanes (stream_id) per connection; "
        "the default lane does not count",
    )
    serve.add_argument(
        "--max-queued",
        type=_ranged("max_queued", int),
        default=limits.MAX_QUEUED,
        help="shipped shape: creates waiting to run per connection; beyond it an error "
        "(websocket_queue_limit_reached)",
    )
    serve.add_argument(
        "--max-pending-steers",
        type=_ranged("max_pending_steers", int),
        default=limits.MAX_PENDING_STEERS,
        help="shipped shape: response.steer submissions queued per response; beyond it "
        "response.steer.failed (too_many_pending_steers)",
    )
    serve.add_argument(
        "--connection-cache-bytes",
        type=_ranged("connection_cache_bytes", int),
        default=limits.CONNECTION_CACHE_BYTES,
        help="shipped shape: approximate bytes of rollout state one connection keeps for "
        "previous_response_id (least recently used rollouts are evicted)",
    )
    serve.add_argument(
        "--connection-lifetime",
        type=_ranged("connection_lifetime", float),
        default=limits.CONNECTION_LIFETIME,
        help="seconds a connection may live; then an error event "
        "(websocket_connection_limit_reached) and close 1000",
    )
    serve.add_argument(
        "--shutdown-drain-timeout",
        type=_ranged("shutdown_drain_timeout", float),
        default=limits.SHUTDOWN_DRAIN_TIMEOUT,
        help="on SIGTERM/SIGINT: seconds WebSocket turns in flight may run to their end "
        "before every connection is closed 1012 (clients reconnect and resend)",
    )
    serve.add_argument(
        "--max-response-events",
        type=_ranged("max_response_events", int),
        default=limits.MAX_RESPONSE_EVENTS,
        help="events one Response may send; past it the model stops and the Response ends "
        "incomplete (reason max_events)",
    )
    serve.add_argument(
        "--max-response-output-tokens",
        type=_ranged("max_response_output_tokens", int),
        default=limits.MAX_RESPONSE_OUTPUT_TOKENS,
        help="output tokens one Response may write whatever its max_output_tokens; past it "
        "the Response ends incomplete (reason max_output_tokens)",
    )
    serve.add_argument(
        "--max-tools",
        type=_ranged("max_tools", int),
        default=limits.MAX_TOOLS,
        help="tools one request may offer (a namespace's tools counted); more is "
        "invalid_value on tools",
    )
    serve.add_argument(
        "--max-schema-nodes",
        type=_ranged("max_schema_nodes", int),
        default=limits.MAX_SCHEMA_NODES,
        help="JSON objects and arrays one schema (text.format, response_format, a tool's "
        "parameters) may hold; checked before the metaschema check",
    )
    serve.add_argument(
        "--max-schema-width",
        type=_ranged("max_schema_width", int),
        default=limits.MAX_SCHEMA_WIDTH,
        help="members one object or array of a schema may hold (properties per object)",
    )
    serve.add_argument(
        "--store",
        default=limits.DEFAULT_STORE,
        help="where store=true responses are kept: sqlite:///abs/path.db, sqlite://rel/path.db, "
        "redis://host:port/db (several processes) or memory://",
    )
    serve.add_argument(
        "--store-ttl",
        type=_ranged("store_ttl", float),
        default=None,
        help="seconds a stored response is kept (default: forever)",
    )
    serve.add_argument(
        "--api-key",
        action="append",
        default=[],
        dest="api_keys",
        help="accept this API key (repeatable; also LONGRESPONSE_API_KEYS, comma-separated); "
        "with keys, every request needs 'Authorization: Bearer <key>'",
    )
    serve.add_argument(
        "--operator-key",
        default=None,
        metavar="KEY",
        help="the operator's API key (also LONGRESPONSE_OPERATOR_KEY): the only key that "
        "sees every tenant in /inspect and reads /metrics; other keys see their own",
    )
    serve.add_argument(
        "--compaction-key",
        default=None,
        metavar="SECRET",
        help=f"seal compaction items with a key derived from SECRET (also {COMPACTION_KEY_ENV}); "
        "give every process behind one store the same one (default: a random key kept in the "
        "store)",
    )
    serve.add_argument(
        "--compaction-lifetime",
        type=_ranged("compaction_lifetime", float),
        default=limits.COMPACTION_LIFETIME,
        help="seconds a compaction item opens for after it was made; an older one is "
        "refused (invalid_encrypted_content)",
    )
    serve.add_argument(
        "--gc-young-threshold",
        type=_ranged("gc_young_threshold", int),
        default=limits.GC_YOUNG_THRESHOLD,
        metavar="N",
        help="run the garbage collector's young generation every N net allocations "
        f"(default {limits.GC_YOUNG_THRESHOLD:,}; 0 keeps Python's own, 700); objects made at "
        "start-up are frozen out of every collection either way",
    )
    serve.add_argument(
        "--mmap-threshold",
        type=_ranged("mmap_threshold", int),
        default=limits.MMAP_THRESHOLD,
        metavar="BYTES",
        help="with glibc, give each allocation of BYTES or more its own mapping, returned to "
        f"the system when freed (default {limits.MMAP_THRESHOLD:,}; 0 keeps glibc's sliding "
        "threshold, which after one large message keeps its size in the heap for good)",
    )
    serve.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="listen on a non-loopback address without API keys (refused otherwise)",
    )
    serve.add_argument(
        "--ws-compression",
        choices=("on", "off"),
        default="on" if limits.WS_COMPRESSION else "off",
        help="accept permessage-deflate when a WebSocket client offers it (the websockets "
        "library does by default; the openai SDK only when asked); off costs less memory per "
        "connection and CPU",
    )
    serve.add_argument(
        "--http-token-cache",
        action="store_true",
        help="HTTP: keep each response's rendered tokens in a process-wide cache, so a "
        "continuation reads its history from the store but does not render it again",
    )
    serve.add_argument(
        "--inspector",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the observations behind /inspect (off: every hook returns at once)",
    )
    serve.add_argument(
        "--inspector-watchers",
        type=_ranged("inspector_watchers", int),
        default=limits.INSPECTOR_WATCHERS,
        help="live /inspect feeds open at once; one more gets 429 (too_many_watchers)",
    )
    serve.add_argument(
        "--inspector-watchers-per-key",
        type=_ranged("inspector_watchers_per_key", int),
        default=limits.INSPECTOR_WATCHERS_PER_KEY,
        help="live /inspect feeds one API key may hold open (with keys on); one more "
        "gets 429 (too_many_watchers)",
    )
    serve.add_argument(
        "--inspector-feed-lifetime",
        type=_ranged("inspector_feed_lifetime", float),
        default=limits.INSPECTOR_FEED_LIFETIME,
        help="seconds a live /inspect feed stays open (an EventSource reconnects)",
    )
    serve.add_argument(
        "--max-background",
        type=_ranged("max_background", int),
        default=limits.MAX_BACKGROUND,
        help="HTTP: background=true responses running at once; beyond it a create gets 429 "
        "(too_many_background_responses)",
    )
    serve.add_argument(
        "--max-background-per-key",
        type=_ranged("max_background_per_key", int),
        default=limits.MAX_BACKGROUND_PER_KEY,
        help="HTTP: background responses one API key may run at once (with keys on); "
        "beyond it that key's create gets 429 (too_many_background_responses)",
    )
    serve.add_argument(
        "--background-max-duration",
        type=_ranged("background_max_duration", float),
        default=limits.BACKGROUND_MAX_DURATION,
        help="HTTP: seconds a background response may run; then it ends incomplete "
        "(reason max_duration)",
    )
    serve.add_argument(
        "--background-log-bytes",
        type=_ranged("background_log_bytes", int),
        default=limits.BACKGROUND_LOG_BYTES,
        help="HTTP: bytes of SSE events a running background response keeps for readers "
        "resuming with starting_after (oldest dropped first)",
    )
    serve.add_argument(
        "--background-endings-bytes",
        type=_ranged("background_endings_bytes", int),
        default=limits.BACKGROUND_ENDINGS_BYTES,
        help="HTTP: bytes of terminal events of finished background responses kept for a "
        "late GET ?stream=true (oldest dropped first)",
    )
    serve.add_argument(
        "--secrets-policy",
        choices=["flag", "redact", "refuse"],
        default="flag",
        help="what the secrets classifier does with a credential in new input: record it on "
        "the response's metadata, redact it before the model sees it, or refuse the input",
    )
    serve.add_argument(
        "--hosted-tools",
        choices=["accept", "refuse"],
        default="accept",
        help="hosted tools this server cannot run (web_search, file_search, mcp, "
        "code_interpreter, image_generation, tool_search, ...): accept them (echoed in the "
        "response's tools, never offered to the model) or refuse the request",
    )
    serve.add_argument(
        "--mcp-allow-host",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="a host the hosted mcp tool's server_url may name (repeatable); with none, "
        "every mcp tool is refused, so a tenant cannot make the server call any address",
    )
    serve.add_argument(
        "--mcp-connect-timeout",
        type=_ranged("mcp_connect_timeout", float),
        default=10.0,
        help="seconds to connect to an MCP server and finish its handshake",
    )
    serve.add_argument(
        "--mcp-call-timeout",
        type=_ranged("mcp_call_timeout", float),
        default=60.0,
        help="seconds one MCP listing or call may take once connected",
    )
    serve.add_argument(
        "--mcp-max-listing-bytes",
        type=_ranged("mcp_max_listing_bytes", int),
        default=1 << 20,
        help="bytes of an MCP server's tool listing (as JSON); a larger one fails",
    )
    serve.add_argument(
        "--mcp-max-output-bytes",
        type=_ranged("mcp_max_output_bytes", int),
        default=1 << 20,
        help="bytes of one MCP call's output; a larger one fails the call",
    )
    serve.add_argument(
        "--mcp-max-calls",
        type=_ranged("mcp_max_calls", int),
        default=64,
        help="MCP calls one Response may make; further calls fail",
    )
    for switch, what in (
        ("incremental-validation", "validate only new input (off: the whole history, every time)"),
        (
            "incremental-classification",
            "classify only new input (off: the whole history, every time)",
        ),
        ("token-cache", "render only new items (off: render the whole context every turn)"),
        ("resolution-reuse", "resolve the model once per rollout (off: every turn)"),
        (
            "overlapped-post-inference",
            "write usage and stored responses after the terminal event (off: before it)",
        ),
    ):
        serve.add_argument(
            f"--no-{switch}",
            dest=switch.replace("-", "_"),
            action="store_false",
            help=f"turn off reuse: {what}",
        )
    serve.add_argument(
        "--sim-ttft-ms",
        type=_ranged("sim_ttft_ms", float),
        default=0.0,
        help="simulated model: time to first token, milliseconds",
    )
    serve.add_argument(
        "--sim-tokens-per-second",
        type=_ranged("sim_tokens_per_second", float),
        default=0.0,
        help="simulated model: decode speed (65, 1000, 4000 are reference points; 0 = unthrottled)",
    )
    serve.add_argument(
        "--sim-prefill-tokens-per-second",
        type=_ranged("sim_prefill_tokens_per_second", float),
        default=0.0,
        help="simulated model: prefill rate over uncached input tokens (0 = instant)",
    )
    serve.add_argument(
        "--sim-context-window",
        type=_ranged("sim_context_window", int),
        default=1_000_000,
        help="simulated models: context window in tokens (longer input: context_length_exceeded, "
        "or dropped oldest items with truncation=auto)",
    )
    serve.add_argument(
        "--keepalive-interval",
        type=_ranged("keepalive_interval", float),
        default=limits.KEEPALIVE_INTERVAL,
        help="seconds a running response may stay silent (a slow model) before a keepalive "
        "event (clients' stream watchdogs, proxies); 0 = never",
    )
    serve.add_argument(
        "--ws-ping-interval",
        type=_ranged("ws_ping_interval", float),
        default=limits.WS_PING_INTERVAL,
        help="seconds between the server's WebSocket pings (the client has as long again "
        "to answer); 0 = no pings",
    )
    serve.add_argument(
        "--sim-tool-calls",
        type=_ranged("sim_tool_calls", int),
        default=1,
        help="simulated model: tool calls before its final answer when a request's metadata "
        "does not say (sim_tool_calls)",
    )
    serve.add_argument(
        "--sim-call",
        dest="sim_calls",
        metavar="NAME=JSON",
        type=_scripted_call,
        action="append",
        default=[],
        help="simulated model: script its calls (repeatable, in order, cycling): call tool "
        "NAME with these JSON arguments when it is offered, instead of arguments made from "
        "its schema",
    )
    backend_settings.add_arguments(serve)
    serve.add_argument(
        "--chat-prefix-cache-tokens",
        type=_ranged("chat_prefix_cache_tokens", int),
        default=limits.CHAT_PREFIX_CACHE_TOKENS,
        help="POST /v1/chat/completions: tokens of recent prompts kept by the prefix cache "
        "(blocks of 16, LRU; about 140 bytes a block); prefill time is charged only for "
        "uncached tokens; 0 turns it off",
    )
    serve.add_argument(
        "--chat-max-in-flight",
        type=_ranged("chat_max_in_flight", int),
        default=limits.CHAT_MAX_IN_FLIGHT,
        help="POST /v1/chat/completions: completions running at once; one more gets 429 "
        "rate_limit_exceeded with Retry-After, as an engine's queue limit does",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="log verbosity",
    )
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


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        host=args.host,
        port=args.port,
        max_message_bytes=args.max_message_bytes,
        max_items_per_event=args.max_items_per_event,
        max_rollouts_per_connection=args.max_rollouts_per_connection,
        send_queue_depth=args.send_queue_depth,
        send_queue_bytes=args.send_queue_bytes,
        slow_reader_timeout=args.slow_reader_timeout,
        pause_timeout=args.pause_timeout,
        keepalive_interval=args.keepalive_interval,
        ws_ping_interval=args.ws_ping_interval,
        max_in_flight=args.max_in_flight,
        max_lanes=args.max_lanes,
        max_queued=args.max_queued,
        max_pending_steers=args.max_pending_steers,
        connection_cache_bytes=args.connection_cache_bytes,
        connection_lifetime=args.connection_lifetime,
        shutdown_drain_timeout=args.shutdown_drain_timeout,
        max_response_events=args.max_response_events,
        max_response_output_tokens=args.max_response_output_tokens,
        schema_limits=SchemaLimits(
            max_tools=args.max_tools,
            max_nodes=args.max_schema_nodes,
            max_width=args.max_schema_width,
        ),
        store=args.store,
        store_ttl=args.store_ttl,
        api_keys=tuple(args.api_keys),
        operator_key=args.operator_key,
        allow_unauthenticated=args.allow_unauthenticated,
        secrets_policy=args.secrets_policy,
        hosted_tools=args.hosted_tools,
        mcp=McpLimits(
            allowed_hosts=frozenset(host.lower() for host in args.mcp_allow_host),
            connect_timeout=args.mcp_connect_timeout,
            call_timeout=args.mcp_call_timeout,
            max_listing_bytes=args.mcp_max_listing_bytes,
            max_output_bytes=args.mcp_max_output_bytes,
            max_calls=args.mcp_max_calls,
        ),
        compaction_key=args.compaction_key,
        compaction_lifetime=args.compaction_lifetime,
        http_token_cache=args.http_token_cache,
        ws_compression=args.ws_compression == "on",
        max_background=args.max_background,
        max_background_per_key=args.max_background_per_key,
        background_max_duration=args.background_max_duration,
        inspector=args.inspector,
        inspector_watchers=args.inspector_watchers,
        inspector_watchers_per_key=args.inspector_watchers_per_key,
        inspector_feed_lifetime=args.inspector_feed_lifetime,
        background_log_bytes=args.background_log_bytes,
        background_endings_bytes=args.background_endings_bytes,
        switches=Switches(
            incremental_validation=args.incremental_validation,
            incremental_classification=args.incremental_classification,
            token_cache=args.token_cache,
            resolution_reuse=args.resolution_reuse,
            overlapped_post_inference=args.overlapped_post_inference,
        ),
        backends=backend_settings.backends_from_args(args),
        sim=SimConfig(
            time_to_first_token=args.sim_ttft_ms / 1000,
            tokens_per_second=args.sim_tokens_per_second,
            prefill_tokens_per_second=args.sim_prefill_tokens_per_second,
            context_window=args.sim_context_window,
            tool_calls=args.sim_tool_calls,
            calls=tuple(args.sim_calls),
        ),
        chat_prefix_cache_tokens=args.chat_prefix_cache_tokens,
        chat_max_in_flight=args.chat_max_in_flight,
    )


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
            config = config_from_args(args)
        except backend_settings.SettingsError as exc:
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

        logging.basicConfig(level=args.log_level.upper())
        served = uvicorn_config(config, log_level=args.log_level)
        assert isinstance(served, uvicorn.Config)
        parts = served.app.parts  # type: ignore[union-attr]
        server = GracefulServer(
            served,
            parts.endpoint,
            drain_timeout=config.shutdown_drain_timeout,
            background=parts.background,
        )
        from .serve.collector import fix_mmap_threshold, set_switch_interval, tune_gc

        tune_gc(args.gc_young_threshold)
        fix_mmap_threshold(args.mmap_threshold)
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
