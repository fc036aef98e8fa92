"""Server configuration: every limit is a named constant, overridable by flag.

Every numeric flag has a range (:data:`RANGES`, keyed by the flag's name
without its dashes); the command line refuses a value outside it, so no
setting can make the server wait forever or allocate without bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from protocol import MAX_ITEMS_PER_EVENT, MAX_MESSAGE_BYTES

__all__ = [
    "BACKGROUND_ENDINGS_BYTES",
    "BACKGROUND_LOG_BYTES",
    "BACKGROUND_MAX_DURATION",
    "CHAT_MAX_IN_FLIGHT",
    "CHAT_PREFIX_CACHE_TOKENS",
    "COMPACTION_LIFETIME",
    "CONNECTION_CACHE_BYTES",
    "CONNECTION_LIFETIME",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_STORE",
    "GC_YOUNG_THRESHOLD",
    "INSPECTOR_FEED_LIFETIME",
    "INSPECTOR_WATCHERS",
    "INSPECTOR_WATCHERS_PER_KEY",
    "KEEPALIVE_INTERVAL",
    "MAX_BACKGROUND",
    "MAX_BACKGROUND_PER_KEY",
    "MAX_IN_FLIGHT",
    "MAX_LANES",
    "MAX_PENDING_STEERS",
    "MAX_QUEUED",
    "MAX_RESPONSE_EVENTS",
    "MAX_RESPONSE_OUTPUT_TOKENS",
    "MAX_ROLLOUTS_PER_CONNECTION",
    "MAX_SCHEMA_NODES",
    "MAX_SCHEMA_WIDTH",
    "MAX_TOOLS",
    "MMAP_THRESHOLD",
    "PAUSE_TIMEOUT",
    "RANGES",
    "SEND_QUEUE_BYTES",
    "SEND_QUEUE_DEPTH",
    "SHUTDOWN_DRAIN_TIMEOUT",
    "SLOW_READER_TIMEOUT",
    "WRITE_BATCH_BYTES",
    "WRITE_SLICE_SECONDS",
    "WS_COMPRESSION",
    "WS_PING_INTERVAL",
    "McpLimits",
    "Range",
    "SchemaLimits",
    "ServerConfig",
    "SimConfig",
    "Switches",
    "ranged",
]

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8000
#: Rollouts that may be live (not terminal) at once on one connection.
MAX_ROLLOUTS_PER_CONNECTION: Final = 16
#: Encoded events waiting to be written to one socket. When it is full the
#: sampling loops that feed it wait: a slow reader slows the stream.
SEND_QUEUE_DEPTH: Final = 256
#: The most bytes of encoded events waiting for one socket: sampling also
#: waits while the queue holds this much (checked before each step of the
#: stream, so one step's events may pass it; error replies are exempt, as from
#: the depth).
SEND_QUEUE_BYTES: Final = 1024 * 1024
#: How long an event may wait for room in a full send queue before the reader
#: is judged too slow and disconnected (close 1008).
SLOW_READER_TIMEOUT: Final = 30.0
#: Responses running at once on one connection, across lanes (the shipped
#: shape); further creates wait in their lane's queue.
MAX_IN_FLIGHT: Final = 16
#: Distinct named lanes (``stream_id``) per connection; the default lane is free.
MAX_LANES: Final = 32
#: Creates waiting (not yet running) per connection; beyond it, an error.
MAX_QUEUED: Final = 64
#: Steering submissions queued for one response (``response.steer``); beyond it,
#: ``response.steer.failed`` ``too_many_pending_steers``.
MAX_PENDING_STEERS: Final = 8
#: Bytes of cached rollout state one connection may keep for continuations.
CONNECTION_CACHE_BYTES: Final = 256 * 1024 * 1024
#: Seconds a running response may stay silent (a long prefill, a slow engine)
#: before the server sends a ``keepalive`` event, on every transport; below the
#: idle timeouts of common proxies (nginx 60 s, Cloudflare about 100 s) and of
#: clients' stream watchdogs, which pings do not reset (Codex's). 0 = never.
KEEPALIVE_INTERVAL: Final = 15.0
#: Seconds between WebSocket pings from the server (uvicorn's, answered by
#: every client library, which keep proxies from cutting a quiet socket); the
#: peer has as long again to answer with a pong. 0 = no pings.
WS_PING_INTERVAL: Final = 20.0
#: Connection lifetime in seconds, as shipped (60 minutes).
CONNECTION_LIFETIME: Final = 3600.0
#: Where stored responses go: ``sqlite:///path``, ``redis://host:port/db``
#: or ``memory://`` (see ``longresponse.storage.backends``).
DEFAULT_STORE: Final = "sqlite://longresponse-data/responses.db"
#: WebSocket compression (permessage-deflate), when a client offers it. Off:
#: measured with the `websockets` client at its defaults (which offers it),
#: compression costs a paused connection a compressor and a decompressor
#: (about 10 times the memory of a paused rollout without it) and costs the
#: stream rate more CPU than it saves on loopback and in data centres; the
#: frames are small JSON events (docs/BENCHMARKS.md, "WebSocket compression").
WS_COMPRESSION: Final = False
#: How long a paused rollout waits for its tool outputs before it ends
#: ``incomplete`` with reason ``pause_timeout``.
PAUSE_TIMEOUT: Final = 600.0
#: HTTP ``background: true`` responses running at once in one server process;
#: beyond it a create gets a 429.
MAX_BACKGROUND: Final = 64
#: Of those, the most one API key may run (with keys on; keys off is one
#: tenant, held by MAX_BACKGROUND alone): one key cannot use up the pool.
MAX_BACKGROUND_PER_KEY: Final = 16
#: Seconds a background response may run; then it ends ``incomplete``
#: (reason ``max_duration``), billed and stored with what it wrote.
BACKGROUND_MAX_DURATION: Final = 2 * 3600.0
#: Live /inspect feeds open at once (``--inspector-watchers``).
INSPECTOR_WATCHERS: Final = 4
#: Of those, the most one API key may hold open (with keys on).
INSPECTOR_WATCHERS_PER_KEY: Final = 2
#: Seconds a live /inspect feed stays open; then it ends (an ``EventSource``
#: reconnects and starts from a fresh state).
INSPECTOR_FEED_LIFETIME: Final = 3600.0
#: Seconds a compaction item opens after it was sealed; older ones are
#: refused like a tampered item (``invalid_encrypted_content``).
COMPACTION_LIFETIME: Final = 30 * 86_400.0
#: Bytes of SSE records one running background response keeps for readers
#: that resume (``starting_after``); the oldest records go first beyond it.
BACKGROUND_LOG_BYTES: Final = 4 * 1024 * 1024
#: Bytes of terminal events of finished background responses kept for a late
#: ``GET ?stream=true`` (the rest of a finished log is freed); oldest out first.
BACKGROUND_ENDINGS_BYTES: Final = 16 * 1024 * 1024
#: On SIGTERM/SIGINT, how long WebSocket turns in flight may run to their end
#: before every connection is closed 1012 anyway (below Kubernetes' default
#: 30 s grace period, leaving time for the post-inference queue to drain).
SHUTDOWN_DRAIN_TIMEOUT: Final = 20.0
#: Events one Response may send. Past it the model is stopped (at the next
#: message word or call), the open item is closed, and the Response ends
#: ``incomplete`` with reason ``max_events``.
MAX_RESPONSE_EVENTS: Final = 2_000_000
#: Output tokens one Response may write, whatever its ``max_output_tokens``
#: (the smaller of the two applies): as many as the default context window
#: holds. Past it the Response ends ``incomplete``, reason ``max_output_tokens``.
MAX_RESPONSE_OUTPUT_TOKENS: Final = 1_000_000
#: ``POST /v1/chat/completions``: tokens of recent prompts the prefix cache
#: keeps (in blocks of 16; about 140 bytes a block); 0 turns it off.
CHAT_PREFIX_CACHE_TOKENS: Final = 1024 * 1024
#: ``POST /v1/chat/completions``: completions running at once; one more is
#: refused with 429 ``rate_limit_exceeded`` and ``Retry-After``, as engines do.
CHAT_MAX_IN_FLIGHT: Final = 1024
#: A writer draining a long queue to a fast reader (WebSocket or SSE) gives
#: the event loop a turn after this long, so other connections never wait
#: behind it (not a flag: it only trades a little throughput for fairness).
WRITE_SLICE_SECONDS: Final = 0.0005
#: Most bytes of queued WebSocket events joined into one transport write.
WRITE_BATCH_BYTES: Final = 64 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Range:
    """The values a numeric flag takes: ``low`` to ``high``, and 0 if ``zero``
    (the flag's "off"), every one finite."""

    low: float
    high: float
    zero: bool = False

    def __contains__(self, value: float) -> bool:
        if value == 0 and self.zero:
            return True
        return math.isfinite(value) and self.low <= value <= self.high

    def __str__(self) -> str:
        return f"{self.low:g} to {self.high:g}" + (", or 0" if self.zero else "")


#: Tools one request may offer (``tools``, a namespace's tools counted too);
#: more is ``invalid_value`` on ``tools`` before any tool is checked.
MAX_TOOLS: Final = 512
#: JSON objects and arrays one schema (a ``text.format`` / ``response_format``
#: schema, or one tool's ``parameters``) may hold in all: counted by a cheap
#: walk before the metaschema check, which costs about 0.4 ms a property.
MAX_SCHEMA_NODES: Final = 5_000
#: Members one object (``properties``, ``$defs``...) or array (``anyOf``...)
#: of a schema may hold.
MAX_SCHEMA_WIDTH: Final = 1_000


@dataclasses.dataclass(frozen=True, slots=True)
class SchemaLimits:
    """What admission allows of a request's tools and schemas (each a flag)."""

    max_tools: int = MAX_TOOLS
    max_nodes: int = MAX_SCHEMA_NODES
    max_width: int = MAX_SCHEMA_WIDTH


_GIB: Final = 1024 * 1024 * 1024
_DAY: Final = 86_400.0
#: The range of every numeric flag, keyed by its name (``--send-queue-depth``
#: is ``send_queue_depth``). Times are in seconds unless the name says ms.
RANGES: Final[Mapping[str, Range]] = {
    "port": Range(0, 65_535),
    "max_message_bytes": Range(1, _GIB),
    "max_items_per_event": Range(1, 1_000_000),
    "max_rollouts_per_connection": Range(1, 100_000),
    "send_queue_depth": Range(1, 1_000_000),
    "send_queue_bytes": Range(1024, _GIB),
    "slow_reader_timeout": Range(0.001, _DAY),
    "pause_timeout": Range(0.001, 7 * _DAY),
    "max_in_flight": Range(1, 100_000),
    "max_lanes": Range(1, 100_000),
    "max_queued": Range(1, 1_000_000),
    "max_pending_steers": Range(1, 4096),
    "connection_cache_bytes": Range(1, 1024 * _GIB),
    "connection_lifetime": Range(0.001, 7 * _DAY),
    "shutdown_drain_timeout": Range(0.001, _DAY),
    "keepalive_interval": Range(0.01, _DAY, zero=True),
    "ws_ping_interval": Range(0.01, _DAY, zero=True),
    "store_ttl": Range(0.001, 100 * 365 * _DAY),
    "max_background": Range(1, 1_000_000),
    "max_background_per_key": Range(1, 1_000_000),
    "background_max_duration": Range(0.001, 365 * _DAY),
    "background_log_bytes": Range(1, 1024 * _GIB),
    "background_endings_bytes": Range(1, 1024 * _GIB),
    "max_response_events": Range(1, 1_000_000_000),
    "max_response_output_tokens": Range(1, 1_000_000_000),
    "max_tools": Range(1, 100_000),
    "mcp_connect_timeout": Range(0.001, _DAY),
    "mcp_call_timeout": Range(0.001, _DAY),
    "mcp_max_listing_bytes": Range(1, _GIB),
    "mcp_max_output_bytes": Range(1, _GIB),
    "mcp_max_calls": Range(1, 100_000),
    "max_schema_nodes": Range(1, 10_000_000),
    "max_schema_width": Range(1, 10_000_000),
    "inspector_watchers": Range(1, 1_000),
    "inspector_watchers_per_key": Range(1, 1_000),
    "inspector_feed_lifetime": Range(0.001, 365 * _DAY),
    "compaction_lifetime": Range(1, 100 * 365 * _DAY),
    "sim_ttft_ms": Range(0, 600_000),
    "sim_tokens_per_second": Range(1, 1_000_000, zero=True),
    "sim_prefill_tokens_per_second": Range(1, 1_000_000_000, zero=True),
    "sim_context_window": Range(1, 1_000_000_000),
    "sim_tool_calls": Range(0, 1024),
    "upstream_context_window": Range(1, 100_000_000),
    "chat_prefix_cache_tokens": Range(16, 1_000_000_000, zero=True),
    "chat_max_in_flight": Range(1, 1_000_000),
    "gc_young_threshold": Range(100, 1_000_000_000, zero=True),
    "mmap_threshold": Range(128 * 1024, 32 * 1024 * 1024, zero=True),
}


def ranged(name: str, kind: type[int] | type[float]) -> Callable[[str], Any]:
    """An argparse type: ``kind`` within the flag's range (:data:`RANGES`)."""
    accepted = RANGES[name]

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if value not in accepted:
            raise argparse.ArgumentTypeError(f"must be {accepted}, not {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


#: ``--gc-young-threshold``'s default: net allocations between the collector's
#: young collections (Python's own is 700), chosen by measurement
#: (``longresponse.serve.collector``; docs/BENCHMARKS.md, "Close to the floor").
GC_YOUNG_THRESHOLD: Final = 20_000

#: ``--mmap-threshold``'s default: allocations from this size up get their own
#: mapping from glibc, given back to the system when freed
#: (``longresponse.serve.collector``).
MMAP_THRESHOLD: Final = 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Switches:
    """One flag per reuse (see the module docstring); all on by default."""

    incremental_validation: bool = True
    incremental_classification: bool = True
    token_cache: bool = True
    resolution_reuse: bool = True
    overlapped_post_inference: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class SimConfig:
    """The simulated model's speed. Zero means no artificial delay."""

    #: Seconds before the first output token, on top of prefill.
    time_to_first_token: float = 0.0
    #: Output tokens per second while decoding (65, 1,000 and 4,000 are the
    #: reference points); 0 = unthrottled.
    tokens_per_second: float = 0.0
    #: Prefill rate over UNCACHED input tokens; 0 = instant.
    prefill_tokens_per_second: float = 0.0
    #: The simulated models' context window, in tokens.
    context_window: int = 1_000_000
    #: Tool calls before the final answer when a request's metadata does not
    #: say (``sim_tool_calls``): a client that cannot set metadata (Codex) gets this.
    tool_calls: int = 1
    #: A script of calls, ``(tool name, arguments as JSON)``: the k-th call since
    #: the last user message is entry k (cycling) among those whose tool is
    #: offered, with those arguments instead of ones made from the schema. Empty:
    #: no script (every offered tool in turn, arguments from its schema).
    calls: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class BackendConfig:
    """One served model that a real engine answers (``longresponse.backends``).

    The API key is never held here: ``api_key_env`` names the environment
    variable that holds it, read when the backend opens.
    """

    #: The model name clients ask for (and ``GET /v1/models`` lists).
    name: str
    #: One of ``longresponse.backends.kinds.KINDS``.
    kind: str
    #: The engine's API root, e.g. ``http://127.0.0.1:8000/v1``.
    base_url: str
    #: The engine's own name for the model (default: ``name``).
    upstream_model: str = ""
    api_key_env: str | None = None
    context_window: int = 128_000
    max_output_tokens: int = 32_768
    #: Seconds: to connect, from the request to the first token, between
    #: two chunks of a stream.
    connect_timeout: float = 10.0
    first_token_timeout: float = 120.0
    idle_timeout: float = 60.0
    #: Retries of a request the upstream refused before any output (connect
    #: errors, 429, 502/503/504), with exponential backoff from ``retry_backoff`` s.
    max_retries: int = 2
    retry_backoff: float = 0.25
    #: The header carrying the rollout's affinity key (empty: none is sent).
    affinity_header: str = "x-longresponse-affinity"
    #: Responses kinds: the upstream stores responses, so a turn continues
    #: with ``previous_response_id`` and only the new items (else full input).
    upstream_store: bool = False
    #: Chat kind: the request field of the turn's output budget
    #: (``max_completion_tokens``, or ``max_tokens`` for engines that know only it).
    max_tokens_field: str = "max_completion_tokens"
    #: Chat kind: send llama.cpp's ``cache_prompt: true`` (its prefix cache).
    cache_prompt: bool = False
    #: Chat kind: llama.cpp's slots; > 0 pins each rollout to one of them
    #: (``id_slot``, chosen from its affinity key), so its prompt stays in that slot.
    slots: int = 0
    #: Chat kind: count the context with the engine's ``POST /tokenize`` (vLLM's
    #: shape, at the API root's host) before each turn, for the window check.
    tokenize: bool = False
    #: Chat kind: the ``tool_choice`` the engine gets when the client's is
    #: ``auto``: ``auto``, or ``required`` for an engine whose template cannot
    #: parse what its model writes under ``auto`` (its grammar then forces a call).
    tool_choice_auto: str = "auto"
    #: Chat kind: a llama.cpp grammar (GBNF, its ``grammar`` field) sent on a
    #: turn that may not call a tool (``tool_choice: "none"``, or no tools), for
    #: a template whose answers must begin with a marker its parser expects
    #: (functionary v3.2: ``all`` and a newline). Empty: none is sent.
    text_grammar: str = ""

    @property
    def model(self) -> str:
        return self.upstream_model or self.name


@dataclasses.dataclass(frozen=True, slots=True)
class McpLimits:
    """What a tenant's ``mcp`` tool may make this server do (``--mcp-*`` flags)."""

    #: Hosts (``host`` or ``host:port``) a ``server_url`` may name; empty: none.
    allowed_hosts: frozenset[str] = frozenset()
    #: Seconds to connect and finish the MCP handshake.
    connect_timeout: float = 10.0
    #: Seconds one listing or call may take once connected.
    call_timeout: float = 60.0
    #: Bytes of a listing's tools (as JSON) and of one call's output.
    max_listing_bytes: int = 1 << 20
    max_output_bytes: int = 1 << 20
    #: MCP calls one Response may make.
    max_calls: int = 64


@dataclasses.dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_items_per_event: int = MAX_ITEMS_PER_EVENT
    max_rollouts_per_connection: int = MAX_ROLLOUTS_PER_CONNECTION
    send_queue_depth: int = SEND_QUEUE_DEPTH
    send_queue_bytes: int = SEND_QUEUE_BYTES
    slow_reader_timeout: float = SLOW_READER_TIMEOUT
    pause_timeout: float = PAUSE_TIMEOUT
    max_in_flight: int = MAX_IN_FLIGHT
    max_lanes: int = MAX_LANES
    max_queued: int = MAX_QUEUED
    max_pending_steers: int = MAX_PENDING_STEERS
    connection_cache_bytes: int = CONNECTION_CACHE_BYTES
    connection_lifetime: float = CONNECTION_LIFETIME
    shutdown_drain_timeout: float = SHUTDOWN_DRAIN_TIMEOUT
    #: Liveness through silences: ``keepalive`` events, WebSocket pings (0: none).
    keepalive_interval: float = KEEPALIVE_INTERVAL
    ws_ping_interval: float = WS_PING_INTERVAL
    #: Per-Response caps: events sent, and output tokens written.
    max_response_events: int = MAX_RESPONSE_EVENTS
    max_response_output_tokens: int = MAX_RESPONSE_OUTPUT_TOKENS
    #: Tools per request, and a schema's JSON nodes and members per node.
    schema_limits: SchemaLimits = dataclasses.field(default_factory=SchemaLimits)
    #: Store URL and retention (seconds; ``None`` keeps records forever).
    store: str = DEFAULT_STORE
    store_ttl: float | None = None
    #: Accepted API keys; empty = no authentication (loopback only, unless
    #: ``allow_unauthenticated``).
    api_keys: tuple[str, ...] = ()
    #: The operator key: sees every tenant in the inspector, and ``/metrics``
    #: (else ``LONGRESPONSE_OPERATOR_KEY``; ``storage.keys``). Never logged.
    operator_key: str | None = dataclasses.field(default=None, repr=False)
    allow_unauthenticated: bool = False
    #: The HTTP path's optional process-wide token cache, and its byte budget.
    #: Accept permessage-deflate when a client offers it (the ``websockets``
    #: library does by default; the official SDK only when asked). Off by
    #: default: see WS_COMPRESSION.
    ws_compression: bool = WS_COMPRESSION
    http_token_cache: bool = False
    http_token_cache_bytes: int = 256 * 1024 * 1024
    #: HTTP ``background: true``: responses running at once, bytes of each
    #: one's event log, bytes of finished ones' terminal events.
    max_background: int = MAX_BACKGROUND
    max_background_per_key: int = MAX_BACKGROUND_PER_KEY
    background_max_duration: float = BACKGROUND_MAX_DURATION
    background_log_bytes: int = BACKGROUND_LOG_BYTES
    background_endings_bytes: int = BACKGROUND_ENDINGS_BYTES
    #: The pipeline's reuse switches (all on) and the secrets policy.
    switches: Switches = dataclasses.field(default_factory=Switches)
    secrets_policy: str = "flag"
    #: Hosted tools (web search, MCP, ...): ``accept`` (echoed, never offered to
    #: the model) or ``refuse`` (``invalid_value`` on ``tools[i].type``).
    hosted_tools: str = "accept"
    #: The hosted ``mcp`` tool's limits (``--mcp-*``): which hosts, timeouts, sizes.
    mcp: McpLimits = dataclasses.field(default_factory=McpLimits)
    #: The secret compaction items are sealed with (else LONGRESPONSE_COMPACTION_KEY,
    #: else a random key kept in the store: ``longresponse.storage.server_keys``).
    compaction_key: str | None = None
    #: Seconds a sealed compaction item opens for.
    compaction_lifetime: float = COMPACTION_LIFETIME
    #: The inspector (``/inspect``): keeping observations, and live feeds at once.
    inspector: bool = True
    inspector_watchers: int = INSPECTOR_WATCHERS
    inspector_watchers_per_key: int = INSPECTOR_WATCHERS_PER_KEY
    inspector_feed_lifetime: float = INSPECTOR_FEED_LIFETIME
    sim: SimConfig = dataclasses.field(default_factory=SimConfig)
    #: Models answered by real engines, beside the simulated ones.
    backends: tuple[BackendConfig, ...] = ()
    #: The chat endpoint's prefix cache budget, in tokens (0: off).
    chat_prefix_cache_tokens: int = CHAT_PREFIX_CACHE_TOKENS
    #: The chat endpoint's completions at once (more: 429 with Retry-After).
    chat_max_in_flight: int = CHAT_MAX_IN_FLIGHT
