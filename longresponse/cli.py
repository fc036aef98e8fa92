"""``longresponse`` command line: ``longresponse serve [flags]``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from protocol import MAX_ITEMS_PER_EVENT, MAX_MESSAGE_BYTES

from . import config as limits
from .config import ServerConfig, SimConfig

__all__ = ["build_parser", "config_from_args", "main", "uvicorn_config"]


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
    serve.add_argument("--port", type=int, default=limits.DEFAULT_PORT, help="TCP port")
    serve.add_argument(
        "--max-message-bytes",
        type=int,
        default=MAX_MESSAGE_BYTES,
        help="largest client message answered with an error event; twice this closes 1009",
    )
    serve.add_argument(
        "--max-items-per-event",
        type=int,
        default=MAX_ITEMS_PER_EVENT,
        help="most input items one response.create or response.append may carry",
    )
    serve.add_argument(
        "--max-rollouts-per-connection",
        type=int,
        default=limits.MAX_ROLLOUTS_PER_CONNECTION,
        help="live rollouts one connection may run at once",
    )
    serve.add_argument(
        "--send-queue-depth",
        type=int,
        default=limits.SEND_QUEUE_DEPTH,
        help="encoded events buffered per connection before sampling waits for the reader",
    )
    serve.add_argument(
        "--slow-reader-timeout",
        type=float,
        default=limits.SLOW_READER_TIMEOUT,
        help="seconds the send queue may stay full before the reader is disconnected",
    )
    serve.add_argument(
        "--pause-timeout",
        type=float,
        default=limits.PAUSE_TIMEOUT,
        help="seconds a paused rollout waits for tool outputs before ending incomplete",
    )
    serve.add_argument(
        "--sim-ttft-ms",
        type=float,
        default=0.0,
        help="simulated model: time to first token, milliseconds",
    )
    serve.add_argument(
        "--sim-tokens-per-second",
        type=float,
        default=0.0,
        help="simulated model: decode speed (65, 1000, 4000 are reference points; 0 = unthrottled)",
    )
    serve.add_argument(
        "--sim-prefill-tokens-per-second",
        type=float,
        default=0.0,
        help="simulated model: prefill rate over uncached input tokens (0 = instant)",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="log verbosity",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        host=args.host,
        port=args.port,
        max_message_bytes=args.max_message_bytes,
        max_items_per_event=args.max_items_per_event,
        max_rollouts_per_connection=args.max_rollouts_per_connection,
        send_queue_depth=args.send_queue_depth,
        slow_reader_timeout=args.slow_reader_timeout,
        pause_timeout=args.pause_timeout,
        sim=SimConfig(
            time_to_first_token=args.sim_ttft_ms / 1000,
            tokens_per_second=args.sim_tokens_per_second,
            prefill_tokens_per_second=args.sim_prefill_tokens_per_second,
        ),
    )


def uvicorn_config(config: ServerConfig, *, log_level: str = "info") -> object:
    """The uvicorn configuration that serves ``config`` (wsproto WebSockets)."""
    import uvicorn

    from .app import create_app

    return uvicorn.Config(
        create_app(config),
        host=config.host,
        port=config.port,
        ws="wsproto",
        # Messages up to max_message_bytes get an error event and the socket
        # stays usable; uvicorn refuses (close 1009) beyond twice that, before
        # buffering more.
        ws_max_size=2 * config.max_message_bytes,
        lifespan="off",
        log_level=log_level,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        import uvicorn

        logging.basicConfig(level=args.log_level.upper())
        config = config_from_args(args)
        server = uvicorn.Server(uvicorn_config(config, log_level=args.log_level))  # type: ignore[arg-type]
        server.run()
        return 0
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
