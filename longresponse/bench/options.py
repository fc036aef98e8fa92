"""What ``longresponse bench`` compares, with which knobs, and the flags that set them.

Theory of operation
-------------------
A rollout is one simulated agent loop: the client sends the task, the model
(the deterministic ``sim``) asks for ``--tool-calls`` tool calls one at a
time, the client "runs" each (sleeping ``--tool-latency-ms``) and sends back a
tool output of about ``--output-tokens`` tokens, and the model ends with an
answer that quotes every tool output. The same rollout is driven through each
transport (a :class:`Transport`: a client shape and the server flags it needs):

``http``         ``POST /v1/responses`` chained with ``previous_response_id``
                 (``store: true``): the server rebuilds the history from the
                 store on every turn. The stateless baseline (a server
                 with ``--no-prefix-reuse``).
``http-full``    HTTP resending the whole input every turn (``store: false``).
``http-cached``  ``http`` against a server with ``--prefix-reuse`` (the
                 serve default).
``ws-full``      the shipped WebSocket shape resending the whole input.
``ws``           the shipped WebSocket shape with ``previous_response_id``
                 (``store: false``; the connection-scoped cache).
``ws-stored``    ``ws`` with ``store: true``: each response is durable in the
                 store before its terminal event (what that write costs a turn).
``append``       one long-running Response continued with ``response.append``.
``append-stored`` ``append`` with ``store: true``: the rollout is checkpointed
                 in the store at every pause, before the client hears of it
                 (what a checkpoint costs a turn).
``ws-sdk``       ``ws`` driven by the official ``openai`` SDK, unchanged.
``http-sdk``     ``http`` driven by the official SDK (the same server flags).
``agents-http``  the OpenAI Agents SDK's ``Runner`` with its default model,
                 ``OpenAIResponsesModel``, over HTTP: within a run it resends
                 the whole history with every model request, as ``http-full``
                 (the serve defaults: prefix reuse on).
``agents-ws``    the Agents SDK's ``Runner`` over its Responses WebSocket
                 transport (``responses_websocket_session()``): the whole
                 history every request on one socket, as ``ws-full``.

and, with ``--ablations``, ``append`` and ``ws`` with each reuse switch of the
pipeline turned off (``append/no-token-cache``, ...; :data:`ABLATION_SWITCHES`).

``--ws-compression`` picks the server side of every WebSocket transport:
``off`` (the server's default), ``on`` (the transport named with
:data:`DEFLATE`, e.g. ``ws-sdk+deflate``, against a server started with
``--ws-compression on``), or ``both``, side by side. The clients: the official
SDK's ``responses.connect()`` offers no compression at its defaults (openai
3.x sets the ``websockets`` option off), so ``ws-sdk+deflate`` asks for it as
the ``websockets`` library does by default (``compression="deflate"``) and
fails unless it was negotiated; the trio client never offers it, so its
``+deflate`` rows measure the server setting alone.

A :class:`Workload` is the knobs of one rollout; the simulated model's own
time for a turn follows from them (:data:`MODEL_TIME_FORMULA`).
:class:`BenchOptions` is one whole run, as :func:`add_arguments` registers
its flags and :func:`options_from_args` reads them back; the flag parsers
reject a bad value with argparse's usage error, before anything starts.

This module imports nothing else of the bench: the other modules of
``longresponse bench`` build on it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Final

from ..backend_kinds import KINDS

__all__ = [
    "ABLATED",
    "ABLATION_SWITCHES",
    "AGENTS_TRANSPORTS",
    "BASE_TRANSPORTS",
    "DEFLATE",
    "ECHO_SHAPES",
    "GATEWAY_KINDS",
    "GATEWAY_TRANSPORTS",
    "GROWTH_TRANSPORTS",
    "MODEL_TIME_FORMULA",
    "SDK_TRANSPORTS",
    "SERVER_OVERHEAD_FORMULA",
    "URL_TRANSPORTS",
    "WEBSOCKET_SHAPES",
    "WS_COMPRESSION_CHOICES",
    "BenchOptions",
    "Transport",
    "Workload",
    "add_arguments",
    "options_from_args",
]

#: Every transport without an ablated switch, in the order they are listed and run.
BASE_TRANSPORTS: Final = (
    "http",
    "http-full",
    "http-cached",
    "ws-full",
    "ws",
    "ws-stored",
    "append",
    "append-stored",
    "http-sdk",
    "ws-sdk",
    "agents-http",
    "agents-ws",
)
#: The append-mode transports (one long-running Response).
APPEND_SHAPES: Final = ("append", "append-stored")
#: Transports driven by the official ``openai`` SDK (its sync client, in a worker thread).
SDK_TRANSPORTS: Final = ("http-sdk", "ws-sdk")
#: Transports driven by the OpenAI Agents SDK's ``Runner`` (asyncio, in a worker thread).
AGENTS_TRANSPORTS: Final = ("agents-http", "agents-ws")
#: The WebSocket transports (shipped shape, append mode, or an SDK's WebSocket).
WEBSOCKET_SHAPES: Final = (
    "append",
    "append-stored",
    "ws",
    "ws-stored",
    "ws-full",
    "ws-sdk",
    "agents-ws",
)
#: Transports whose continuation frames get an echo floor (WebSocket, shipped or
#: append; the Agents SDK's frames are its own to send, so it has none).
ECHO_SHAPES: Final = ("append", "append-stored", "ws", "ws-stored", "ws-full", "ws-sdk")
#: The pipeline's reuse switches, as ``longresponse serve --no-<switch>`` flags.
ABLATION_SWITCHES: Final = (
    "incremental-validation",
    "incremental-classification",
    "token-cache",
    "resolution-reuse",
    "overlapped-post-inference",
)
#: The transports whose reuse switches are ablated.
ABLATED: Final = ("append", "ws")
#: The transports of the growth scenario (targets 1 and 2).
GROWTH_TRANSPORTS: Final = ("append", "ws", "http")
#: Transports that need no server flag of their own (usable with ``--url``).
URL_TRANSPORTS: Final = (
    "http",
    "http-full",
    "ws-full",
    "ws",
    "ws-stored",
    "append",
    "append-stored",
    "http-sdk",
    "ws-sdk",
    "agents-http",
    "agents-ws",
)
#: The suffix of a WebSocket transport whose server accepts compression (``--ws-compression on``).
DEFLATE: Final = "+deflate"
#: ``<shape>@<kind>``: the transport's server is a gateway in front of a second
#: longresponse process (the engine, running the simulated model) reached through
#: the real backend of that kind (``longresponse.backends``).
GATEWAY_KINDS: Final = tuple(KINDS)
#: The gateway topologies of issue 11, run by ``--gateways``.
GATEWAY_TRANSPORTS: Final = ("append@chat", "append@responses-ws", "http@chat")
#: ``--ws-compression``: the server setting(s) every WebSocket transport runs with.
WS_COMPRESSION_CHOICES: Final = ("off", "on", "both")

#: How the simulated model's own time for a turn is computed (:meth:`Workload.model_ms`).
MODEL_TIME_FORMULA: Final = (
    "model_ms = ttft_ms + 1000 * output_tokens / tokens_per_second "
    "+ 1000 * uncached_input_tokens / prefill_tokens_per_second "
    "(a term is 0 when its rate is 0 = unthrottled; output_tokens counts the sim's paced "
    "chunks: one per answer word, one per 8 characters of call arguments)"
)
#: What a turn's ``server_overhead_ms`` adds up.
SERVER_OVERHEAD_FORMULA: Final = (
    "server_overhead_ms = resume_ms + count_ms + post_inference_ms (resume: from the "
    "decoded request to the sampler being called, incl. store reads, validation, "
    "classification, resolution, render; count: tokenizing the new input after the first "
    "output when that could wait, work the server still does while the model writes; "
    "post_inference: work done before the terminal event). Encoding the model's output "
    "events (encode_ms) is left out: it scales with the output, the same in every transport."
)


# --- what is compared ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Transport:
    """One column of the comparison: a client shape and the server flags it needs."""

    name: str
    shape: str  # one of BASE_TRANSPORTS
    switch_off: str | None = None
    ws_compression: bool = False  # the server accepts permessage-deflate
    gateway: str | None = None  # one of GATEWAY_KINDS: the server fronts an engine process

    @classmethod
    def parse(cls, name: str) -> Transport:
        """``shape``, ``shape/no-<switch>`` or ``shape@<gateway kind>``, any with
        :data:`DEFLATE` for a WebSocket shape; ``ValueError`` for an unknown one."""
        deflate = name.endswith(DEFLATE)
        shape, _, gateway = name.removesuffix(DEFLATE).partition("@")
        if gateway and gateway not in GATEWAY_KINDS:
            raise ValueError(f"unknown gateway kind in {name!r} (one of {GATEWAY_KINDS})")
        shape, _, switch = shape.partition("/no-")
        if shape not in BASE_TRANSPORTS or (switch and switch not in ABLATION_SWITCHES):
            raise ValueError(f"unknown transport {name!r}")
        if switch and shape not in ABLATED:
            raise ValueError(f"ablations exist for {' and '.join(ABLATED)} only, not {name!r}")
        transport = cls(
            name=name,
            shape=shape,
            switch_off=switch or None,
            ws_compression=deflate,
            gateway=gateway or None,
        )
        if deflate and not transport.websocket:
            raise ValueError(f"{DEFLATE} is for WebSocket transports only, not {name!r}")
        return transport

    def deflated(self) -> Transport:
        """This WebSocket transport against a server that accepts compression."""
        return Transport.parse(self.name + DEFLATE)

    @property
    def websocket(self) -> bool:
        return self.shape in WEBSOCKET_SHAPES

    @property
    def append_mode(self) -> bool:
        """One long-running Response continued with ``response.append``."""
        return self.shape in APPEND_SHAPES

    @property
    def sdk(self) -> bool:
        return self.shape in SDK_TRANSPORTS

    @property
    def agents(self) -> bool:
        return self.shape in AGENTS_TRANSPORTS

    @property
    def resends_history(self) -> bool:
        return self.shape in ("ws-full", "http-full", *AGENTS_TRANSPORTS)

    @property
    def store(self) -> bool:
        """Whether its responses are stored: ``store: true``, or, for the Agents
        SDK, which sends no ``store``, the API's default (true)."""
        stored = ("http", "http-cached", "http-sdk", "ws-stored", "append-stored")
        return self.shape in (*stored, *AGENTS_TRANSPORTS)

    @property
    def server_flags(self) -> tuple[str, ...]:
        flags: list[str] = []
        if self.shape == "http-cached":
            flags.append("--prefix-reuse")
        elif self.shape in ("http", "http-sdk"):
            flags.append("--no-prefix-reuse")  # the stateless baseline
        if self.switch_off:
            flags.append(f"--no-{self.switch_off}")
        if self.ws_compression:
            flags += ["--ws-compression", "on"]
        return tuple(flags)


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    """The knobs of one rollout."""

    tool_calls: int
    output_tokens: int
    tool_latency_ms: float
    tokens_per_second: float
    ttft_ms: float
    prefill_tokens_per_second: float

    def model_ms(self, output_tokens: int, uncached_tokens: int) -> float:
        """The simulated model's own time for one turn (:data:`MODEL_TIME_FORMULA`)."""
        ms = self.ttft_ms
        if self.tokens_per_second > 0:
            ms += 1000 * output_tokens / self.tokens_per_second
        if self.prefill_tokens_per_second > 0:
            ms += 1000 * uncached_tokens / self.prefill_tokens_per_second
        return ms


@dataclasses.dataclass(frozen=True, slots=True)
class BenchOptions:
    """One run of ``longresponse bench``: its flags, with their defaults."""

    tool_calls: int = 25
    output_tokens: int = 2000
    tool_latency_ms: float = 0.0
    concurrency: int = 1
    speeds: tuple[float, ...] = (65.0, 1000.0, 4000.0)
    ttft_ms: float = 0.0
    prefill_tokens_per_second: float = 0.0
    rollouts: int = 5
    transports: tuple[str, ...] = BASE_TRANSPORTS
    ablations: bool = True
    ablation_speed: float = 1000.0
    growth_tool_calls: int = 50
    growth_output_tokens: int = 2000
    url: str | None = None
    store: str = "sqlite"
    out: Path = Path("bench-results")
    echo: bool = True
    progress: bool = True
    ws_compression: str = "both"  # one of WS_COMPRESSION_CHOICES
    gateways: bool = False  # also run GATEWAY_TRANSPORTS

    @property
    def chosen_transports(self) -> tuple[str, ...]:
        """``transports``, with the gateway topologies when ``gateways``."""
        extra = GATEWAY_TRANSPORTS if self.gateways else ()
        return tuple(dict.fromkeys((*self.transports, *extra)))

    def workload(self, speed: float, *, growth: bool = False) -> Workload:
        """The knobs of one rollout at ``speed`` (of the growth scenario with ``growth``)."""
        return Workload(
            tool_calls=self.growth_tool_calls if growth else self.tool_calls,
            output_tokens=self.growth_output_tokens if growth else self.output_tokens,
            tool_latency_ms=self.tool_latency_ms,
            tokens_per_second=speed,
            ttft_ms=self.ttft_ms,
            prefill_tokens_per_second=self.prefill_tokens_per_second,
        )


# --- the command line -----------------------------------------------------------------


def _speeds(text: str) -> tuple[float, ...]:
    try:
        speeds = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, not {text!r}"
        ) from None
    if not speeds or any(s < 0 for s in speeds):
        raise argparse.ArgumentTypeError("expected one or more speeds >= 0 (0 = unthrottled)")
    return speeds


def _transports(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in names:
        try:
            Transport.parse(name)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return names


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, not {value}")
        return value

    return parse


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``longresponse bench`` flags on ``parser``."""
    parser.description = (
        "Compare every transport (http, http-full, http-cached, ws-full, ws, append; http-sdk "
        "and ws-sdk through the official openai SDK; agents-http and agents-ws through the "
        "OpenAI Agents SDK's Runner) and each "
        "reuse switch on simulated agent rollouts, side by side, in one run: end-to-end time, "
        "time to first token, server phase times, client-observed overhead, server CPU, bytes "
        "per turn. Writes turns.json, summary.md and PNG plots to --out."
    )
    parser.epilog = (
        "Overhead = observed turn time - the simulated model's own time, where "
        f"{MODEL_TIME_FORMULA}. Each transport at each speed gets its own server process; "
        "--url runs only the transports that need no server flags."
    )
    defaults = BenchOptions()
    add = parser.add_argument
    add(
        "--tool-calls",
        type=_bounded_int(1, 200),
        default=defaults.tool_calls,
        help="tool calls per rollout (5 to 200 are the reference range)",
    )
    add(
        "--output-tokens",
        type=_bounded_int(1, 200_000),
        default=defaults.output_tokens,
        help="size of each tool output, in tokens",
    )
    add(
        "--tool-latency-ms",
        type=_non_negative,
        default=defaults.tool_latency_ms,
        help="time the client spends running each tool (a sleep)",
    )
    add(
        "--concurrency",
        type=_bounded_int(1, 1000),
        default=defaults.concurrency,
        help="concurrent rollouts per transport",
    )
    add(
        "--tokens-per-second",
        type=_speeds,
        default=",".join(f"{speed:g}" for speed in defaults.speeds),
        dest="speeds",
        help="simulated decode speeds, comma-separated (0 = unthrottled)",
    )
    add(
        "--ttft-ms",
        type=_non_negative,
        default=defaults.ttft_ms,
        help="simulated time to first token",
    )
    add(
        "--prefill-tps",
        type=_non_negative,
        default=defaults.prefill_tokens_per_second,
        help="simulated prefill rate over uncached input tokens (0 = instant)",
    )
    add(
        "--rollouts",
        type=_bounded_int(1, 1000),
        default=defaults.rollouts,
        help="rounds of rollouts per transport and speed (each round: --concurrency rollouts)",
    )
    add(
        "--transports",
        type=_transports,
        default=",".join(defaults.transports),
        help="comma-separated subset of: "
        + ", ".join(BASE_TRANSPORTS)
        + "; ablations by name too, e.g. append/no-token-cache; a gateway in front of an "
        + "engine process as <shape>@<kind>, kind one of "
        + ", ".join(GATEWAY_KINDS),
    )
    add(
        "--ablations",
        action=argparse.BooleanOptionalAction,
        default=defaults.ablations,
        help="also run append and ws with each reuse switch off",
    )
    add(
        "--ablation-tokens-per-second",
        type=_non_negative,
        default=defaults.ablation_speed,
        dest="ablation_speed",
        help="the speed the ablations run at (if not among --tokens-per-second: the last one)",
    )
    add(
        "--growth-tool-calls",
        type=_bounded_int(0, 200),
        default=defaults.growth_tool_calls,
        help="tool calls of the growth scenario (append, ws, http at the fastest speed; "
        "targets 1 and 2); 0 = skip it",
    )
    add(
        "--growth-output-tokens",
        type=_bounded_int(1, 200_000),
        default=defaults.growth_output_tokens,
        help="tool-output size of the growth scenario",
    )
    add(
        "--url",
        default=None,
        help="benchmark a running server (ws://host:port/v1/responses) instead of starting "
        "servers; only the transports that need no server flags run",
    )
    add(
        "--store",
        default=defaults.store,
        help="the servers' --store; 'sqlite' = a fresh SQLite file per server in a temporary "
        "directory",
    )
    add(
        "--ws-compression",
        choices=WS_COMPRESSION_CHOICES,
        default=defaults.ws_compression,
        help="the servers' --ws-compression for every WebSocket transport (clients keep their "
        "own: the trio client offers no compression; ws-sdk+deflate asks the openai SDK for "
        "permessage-deflate, which it leaves off by default); "
        f"'on' names a transport with {DEFLATE}, 'both' runs each side by side",
    )
    add(
        "--gateways",
        action=argparse.BooleanOptionalAction,
        default=defaults.gateways,
        help="also run the gateway topologies (" + ", ".join(GATEWAY_TRANSPORTS) + "): the "
        "transport's server fronts a second process running the simulated model",
    )
    add("--out", type=Path, default=defaults.out, help="directory for the results")
    add(
        "--echo",
        action=argparse.BooleanOptionalAction,
        default=defaults.echo,
        help="measure the floor: the same frames against a bare WebSocket echo endpoint",
    )
    add("--progress", action=argparse.BooleanOptionalAction, default=defaults.progress,
        help="show a progress bar on stderr")  # fmt: skip


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """The :class:`BenchOptions` of flags parsed with :func:`add_arguments`."""
    return BenchOptions(
        tool_calls=args.tool_calls,
        output_tokens=args.output_tokens,
        tool_latency_ms=args.tool_latency_ms,
        concurrency=args.concurrency,
        speeds=tuple(args.speeds),
        ttft_ms=args.ttft_ms,
        prefill_tokens_per_second=args.prefill_tps,
        rollouts=args.rollouts,
        transports=tuple(args.transports),
        ablations=args.ablations,
        ablation_speed=args.ablation_speed,
        growth_tool_calls=args.growth_tool_calls,
        growth_output_tokens=args.growth_output_tokens,
        url=args.url,
        store=args.store,
        out=args.out,
        echo=args.echo,
        progress=args.progress,
        ws_compression=args.ws_compression,
        gateways=args.gateways,
    )
