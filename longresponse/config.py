"""Server configuration: every limit is a named constant, and every setting
is declared once (:data:`SETTINGS`).

A :class:`Setting` names its flag, its ``LONGRESPONSE_*`` variable, its key in
a settings file, its default, its help and where it lands in
:class:`ServerConfig`; ``longresponse.settings`` reads them from those three
places. Every numeric setting has a range (:data:`RANGES`, keyed by its
name); a value outside it is refused from any source, so no setting can make
the server wait forever or allocate without bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from protocol import MAX_ITEMS_PER_EVENT, MAX_MESSAGE_BYTES

from .backend_kinds import KINDS

__all__ = [
    "BACKGROUND_ENDINGS_BYTES",
    "BACKGROUND_LEASE",
    "BACKGROUND_LOG_BYTES",
    "BACKGROUND_MAX_DURATION",
    "BY_NAME",
    "CHAT_MAX_IN_FLIGHT",
    "CHAT_MAX_IN_FLIGHT_PER_KEY",
    "CHAT_PREFIX_CACHE_TOKENS",
    "CHECKPOINT_TTL",
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
    "MAX_CONNECTIONS_PER_KEY",
    "MAX_IN_FLIGHT",
    "MAX_LANES",
    "MAX_LIVE_INPUT_BYTES",
    "MAX_LIVE_INPUT_BYTES_PER_KEY",
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
    "PREFIX_REUSE_BYTES",
    "RANGES",
    "SEND_QUEUE_BYTES",
    "SEND_QUEUE_DEPTH",
    "SETTINGS",
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
    "Setting",
    "SimConfig",
    "Switches",
    "parse_bool",
    "ranged",
    "scripted_call",
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
#: WebSocket connections one API key may hold open at once (with keys on);
#: one more is refused at the handshake with 429 ``too_many_connections``, so
#: one key cannot take the process's file descriptors from the others.
MAX_CONNECTIONS_PER_KEY: Final = 256
#: Creates waiting (not yet running) per connection; beyond it, an error.
MAX_QUEUED: Final = 64
#: Steering submissions queued for one response (``response.steer``); beyond it,
#: ``response.steer.failed`` ``too_many_pending_steers``.
MAX_PENDING_STEERS: Final = 8
#: Bytes of input one live response may hold that its model has not taken in
#: yet (appended, injected or steered: ``longresponse.serve.input_budget``);
#: twice the largest message, so one message always fits.
MAX_LIVE_INPUT_BYTES: Final = 32 * 1024 * 1024
#: Bytes of such input one API key may hold across its connections.
MAX_LIVE_INPUT_BYTES_PER_KEY: Final = 128 * 1024 * 1024
#: Bytes of cached rollout state one connection may keep for continuations.
CONNECTION_CACHE_BYTES: Final = 256 * 1024 * 1024
#: Bytes of tokens prefix reuse keeps (``serve/prefix_reuse.py``): 1,000
#: conversations of 20,000 tokens take about 80 MB.
PREFIX_REUSE_BYTES: Final = 256 * 1024 * 1024
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
#: How long an append-mode rollout's checkpoint (``store: true``) outlives its
#: last write or take-over: a client may take the response up within it.
CHECKPOINT_TTL: Final = 3600.0
#: HTTP ``background: true`` responses running at once in one server process;
#: beyond it a create gets a 429.
MAX_BACKGROUND: Final = 64
#: Of those, the most one API key may run (with keys on; keys off is one
#: tenant, held by MAX_BACKGROUND alone): one key cannot use up the pool.
MAX_BACKGROUND_PER_KEY: Final = 16
#: Seconds a background response may run; then it ends ``incomplete``
#: (reason ``max_duration``), billed and stored with what it wrote.
BACKGROUND_MAX_DURATION: Final = 2 * 3600.0
#: Seconds a server process's lease on a running background response lasts
#: unless renewed. The process renews its leases every third of it (and
#: stores what each response has written so far); a response whose lease ran
#: out (its process stopped) is ended ``failed`` by the first process on the
#: store that looks: each looks every third of it, and at once when the
#: response is read, cancelled or deleted.
BACKGROUND_LEASE: Final = 30.0
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
#: Bytes of the logs of finished background responses kept for a late
#: ``GET ?stream=true`` (a log larger than all of it keeps its terminal event
#: alone); oldest out first.
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
#: Of those, what one API key may run at once (with keys on), so that one key
#: cannot fill the limit in all: its next gets the same 429, other keys' do not.
CHAT_MAX_IN_FLIGHT_PER_KEY: Final = 256
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
    #: One of ``longresponse.backend_kinds.KINDS``.
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
    #: Chat kind: ask llama.cpp for its running counts in every stream record
    #: (``timings_per_token``, ``return_progress``), so that a turn cut before
    #: the engine's last record (a cancel, a client gone, a steer) is billed
    #: the engine's own count of what it read and wrote, not an estimate.
    running_counts: bool = False

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
    #: ``mcp`` tools (MCP servers, a session each) one request may name.
    max_servers: int = 16
    #: MCP listings and calls running at once in the server, and of one API
    #: key's (with keys on); one more fails at once, its limit named.
    max_in_flight: int = 256
    max_in_flight_per_key: int = 32


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
    checkpoint_ttl: float = CHECKPOINT_TTL
    max_in_flight: int = MAX_IN_FLIGHT
    max_lanes: int = MAX_LANES
    max_queued: int = MAX_QUEUED
    max_connections_per_key: int = MAX_CONNECTIONS_PER_KEY
    max_pending_steers: int = MAX_PENDING_STEERS
    #: Bytes of input not yet taken in by the model, per live response and per key.
    max_live_input_bytes: int = MAX_LIVE_INPUT_BYTES
    max_live_input_bytes_per_key: int = MAX_LIVE_INPUT_BYTES_PER_KEY
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
    #: Accept permessage-deflate when a client offers it (the ``websockets``
    #: library does by default; the official SDK only when asked). Off by
    #: default: see WS_COMPRESSION.
    ws_compression: bool = WS_COMPRESSION
    #: Prefix reuse (on by default): the conversations rollouts held lately,
    #: which a new rollout's input may begin with, and their byte budget.
    prefix_reuse: bool = True
    prefix_reuse_bytes: int = PREFIX_REUSE_BYTES
    #: HTTP ``background: true``: responses running at once, bytes of each
    #: one's event log, bytes of finished ones' logs.
    max_background: int = MAX_BACKGROUND
    max_background_per_key: int = MAX_BACKGROUND_PER_KEY
    background_max_duration: float = BACKGROUND_MAX_DURATION
    background_lease: float = BACKGROUND_LEASE
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
    #: Of those, what one API key may run at once.
    chat_max_in_flight_per_key: int = CHAT_MAX_IN_FLIGHT_PER_KEY


# --- the settings, each declared once ----------------------------------------
#
# One record per setting of ``longresponse serve``: its flag, its environment
# variable, its key in a settings file's ``[server]`` table, its range, its
# help, and where it lands in :class:`ServerConfig`. The command line, the
# environment, the settings file (``longresponse.settings``) and the flags
# table of docs/SERVING.md are all read from or checked against this table.

#: The words a boolean setting takes from a variable or an ``on|off`` flag.
_TRUE: Final = frozenset({"1", "true", "on", "yes"})
_FALSE: Final = frozenset({"0", "false", "off", "no"})
_KINDS: Final[Mapping[type, str]] = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list of strings",
}


def parse_bool(text: str) -> bool:
    """``on``/``off`` (or true/false, yes/no, 1/0, any case) as a bool; ValueError otherwise."""
    word = text.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(f"not on or off: {text!r}")


def scripted_call(text: str) -> tuple[str, str]:
    """``NAME=JSON``, the JSON an object (``--sim-call``), as (name, compact JSON)."""
    name, sep, arguments = text.partition("=")
    try:
        value = json.loads(arguments) if sep and name else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"not NAME=<a JSON object>: {text!r}")
    return name, json.dumps(value, separators=(",", ":"))


@dataclasses.dataclass(frozen=True, slots=True)
class Setting:
    """One server setting, declared once.

    Its name (underscores) is its key in a settings file's ``[server]`` table
    and, upper-cased after ``LONGRESPONSE_``, its environment variable; its
    flag is the name with dashes unless ``flag`` says otherwise.
    """

    name: str
    #: ``int``, ``float``, ``str``, ``bool``, or ``list`` (a repeatable flag).
    kind: type
    default: Any
    help: str
    #: A number's accepted values (every number has one: RANGES).
    range: Range | None = None
    #: A string's accepted values.
    choices: tuple[str, ...] = ()
    #: Where it lands in ServerConfig: ``"port"``, ``"sim.tokens_per_second"``;
    #: ``""`` is the field of its own name, ``None`` none (the process's own
    #: settings, and the upstream's, which become ``ServerConfig.backends``).
    field: str | None = ""
    #: Other flags for the same setting: uvicorn's or vLLM's name for it.
    aliases: tuple[str, ...] = ()
    flag: str = ""
    metavar: str | None = None
    #: How help and docs state the default when the value does not say it.
    shown: str = ""
    #: A repeatable setting: one value from its text, and what separates the
    #: values in its environment variable.
    item: Callable[[str], Any] | None = None
    separator: str = ","
    #: The value as its ServerConfig field holds it (milliseconds to seconds...).
    to_field: Callable[[Any], Any] | None = None
    #: The help section its flag is listed under (``""``: the main one).
    group: str = ""
    #: A boolean flag that also takes ``on|off`` (``--ws-compression on``).
    takes_value: bool = False
    #: Whether a settings file may set it (not the file's own path).
    in_file: bool = True

    @property
    def option(self) -> str:
        """The flag: ``--send-queue-depth``."""
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        """The environment variable: ``LONGRESPONSE_SEND_QUEUE_DEPTH``."""
        return "LONGRESPONSE_" + self.name.upper()

    @property
    def shown_default(self) -> str:
        """The default as help and docs state it."""
        if self.shown:
            return self.shown
        if self.kind is bool:
            return "on" if self.default else "off"
        if self.default is None or self.default == ():
            return "none"
        if isinstance(self.default, float) and self.default.is_integer():
            return str(int(self.default))
        return str(self.default)

    def parse(self, text: str) -> Any:
        """The value of ``text`` (a flag's or a variable's); ValueError says why not."""
        if self.kind is bool:
            return parse_bool(text)
        if self.kind is list:
            parts = [part.strip() for part in text.split(self.separator)]
            return [self.item(part) if self.item else part for part in parts if part]
        if self.kind is str:
            if self.choices and text not in self.choices:
                raise ValueError(f"must be one of {', '.join(self.choices)}, not {text!r}")
            return text
        try:
            value = self.kind(text)
        except ValueError:
            raise ValueError(f"not {_KINDS[self.kind]}: {text!r}") from None
        assert self.range is not None, self.name  # every number has a range
        if value not in self.range:
            raise ValueError(f"must be {self.range}, not {text}")
        return value

    def take(self, value: object) -> Any:
        """The value of a settings file's (TOML) ``value``; ValueError says why not."""
        if self.kind is list:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"must be {_KINDS[list]}, not {value!r}")
            return [self.item(v) if self.item else v for v in value]
        accepted: tuple[type, ...] = (int, float) if self.kind is float else (self.kind,)
        if not isinstance(value, accepted) or (self.kind is not bool and isinstance(value, bool)):
            raise ValueError(f"must be {_KINDS[self.kind]}, not {value!r}")
        return value if self.kind is bool else self.parse(str(value))


_GIB: Final = 1024 * 1024 * 1024
_MIB: Final = 1024 * 1024
_DAY: Final = 86_400.0
_SIM: Final = "the simulated model"
_MCP_DEFAULTS: Final = McpLimits()
_SIM_DEFAULTS: Final = SimConfig()
_BACKENDS: Final = "real model backends (see docs/REAL_MODELS.md)"
_REUSE: Final = "reuse switches (all on; see docs/SERVING.md)"


def _n(
    name: str,
    kind: type,
    default: float | None,
    low: float,
    high: float,
    help: str,
    *,
    zero: bool = False,
    **more: Any,
) -> Setting:
    """A numeric setting and its range."""
    return Setting(name, kind, default, help, range=Range(low, high, zero), **more)


def _switch(name: str, what: str) -> Setting:
    """One reuse of the pipeline, on unless turned off."""
    return Setting(name, bool, True, f"reuse: {what}", field=f"switches.{name}", group=_REUSE)


def _hosts(hosts: list[str]) -> frozenset[str]:
    return frozenset(host.lower() for host in hosts)


def _seconds(milliseconds: float) -> float:
    return milliseconds / 1000


#: Every setting of ``longresponse serve``, in the order of ``--help``.
SETTINGS: Final[tuple[Setting, ...]] = (
    Setting("host", str, DEFAULT_HOST, "address to listen on"),
    _n("port", int, DEFAULT_PORT, 0, 65_535, "TCP port (0: any free one)"),
    _n("max_message_bytes", int, MAX_MESSAGE_BYTES, 1, _GIB,
       "largest client message answered with an error event; twice this closes 1009"),
    _n("max_items_per_event", int, MAX_ITEMS_PER_EVENT, 1, 1_000_000,
       "most input items one response.create or response.append may carry"),
    _n("max_rollouts_per_connection", int, MAX_ROLLOUTS_PER_CONNECTION, 1, 100_000,
       "append mode: live rollouts one connection may run at once"),
    _n("send_queue_depth", int, SEND_QUEUE_DEPTH, 1, 1_000_000,
       "encoded events buffered per connection before sampling waits for the reader"),
    _n("send_queue_bytes", int, SEND_QUEUE_BYTES, 1024, _GIB,
       "bytes of encoded events buffered per connection before sampling waits"),
    _n("slow_reader_timeout", float, SLOW_READER_TIMEOUT, 0.001, _DAY,
       "seconds the send queue may stay full before the reader is disconnected"),
    _n("pause_timeout", float, PAUSE_TIMEOUT, 0.001, 7 * _DAY,
       "append mode: seconds a paused rollout waits for tool outputs before ending incomplete"),
    _n("checkpoint_ttl", float, CHECKPOINT_TTL, 1, 30 * _DAY,
       "append mode with store: true: seconds a rollout's checkpoint is kept after its last "
       "write, for a client whose connection was lost to take the response up "
       "(response.resume)"),
    _n("max_in_flight", int, MAX_IN_FLIGHT, 1, 100_000,
       "shipped shape: responses running at once per connection, across lanes; further "
       "creates wait in their lane's queue"),
    _n("max_lanes", int, MAX_LANES, 1, 100_000,
       "shipped shape: distinct named lanes (stream_id) per connection; the default lane "
       "does not count"),
    _n("max_queued", int, MAX_QUEUED, 1, 1_000_000,
       "shipped shape: creates waiting to run per connection; beyond it an error "
       "(websocket_queue_limit_reached)"),
    _n("max_connections_per_key", int, MAX_CONNECTIONS_PER_KEY, 1, 1_000_000,
       "WebSocket connections one API key may hold open at once (with keys on); one more "
       "is refused at the handshake with 429 (too_many_connections)"),
    _n("max_pending_steers", int, MAX_PENDING_STEERS, 1, 4096,
       "shipped shape: response.steer submissions queued per response; beyond it "
       "response.steer.failed (too_many_pending_steers)"),
    _n("max_live_input_bytes", int, MAX_LIVE_INPUT_BYTES, 1024, 1024 * _GIB,
       "bytes of input one live response may hold that its model has not taken in yet "
       "(response.append, response.inject, response.steer); one more message is refused "
       "input_budget_exceeded (steers: too_many_pending_steers)"),
    _n("max_live_input_bytes_per_key", int, MAX_LIVE_INPUT_BYTES_PER_KEY, 1024, 1024 * _GIB,
       "bytes of such input one API key may hold across its connections (keys off: the "
       "server's one tenant); one more message is refused the same way"),
    _n("connection_cache_bytes", int, CONNECTION_CACHE_BYTES, 1, 1024 * _GIB,
       "shipped shape: approximate bytes of rollout state one connection keeps for "
       "previous_response_id (least recently used rollouts are evicted)"),
    _n("connection_lifetime", float, CONNECTION_LIFETIME, 0.001, 7 * _DAY,
       "seconds a connection may live; then an error event "
       "(websocket_connection_limit_reached) and close 1000"),
    _n("shutdown_drain_timeout", float, SHUTDOWN_DRAIN_TIMEOUT, 0.001, _DAY,
       "on SIGTERM/SIGINT: seconds WebSocket turns in flight (and open HTTP responses) may "
       "run to their end before every connection is closed 1012 (clients reconnect and resend)",
       aliases=("--timeout-graceful-shutdown",)),
    _n("keepalive_interval", float, KEEPALIVE_INTERVAL, 0.01, _DAY,
       "seconds a running response may stay silent (a slow model) before a keepalive event "
       "(clients' stream watchdogs, proxies); 0 = never", zero=True),
    _n("ws_ping_interval", float, WS_PING_INTERVAL, 0.01, _DAY,
       "seconds between the server's WebSocket pings (the client has as long again to "
       "answer); 0 = no pings", zero=True),
    _n("max_response_events", int, MAX_RESPONSE_EVENTS, 1, 1_000_000_000,
       "events one Response may send; past it the model stops and the Response ends "
       "incomplete (reason max_events)"),
    _n("max_response_output_tokens", int, MAX_RESPONSE_OUTPUT_TOKENS, 1, 1_000_000_000,
       "output tokens one Response may write whatever its max_output_tokens; past it the "
       "Response ends incomplete (reason max_output_tokens)"),
    _n("max_tools", int, MAX_TOOLS, 1, 100_000,
       "tools one request may offer (a namespace's tools counted); more is invalid_value "
       "on tools", field="schema_limits.max_tools"),
    _n("max_schema_nodes", int, MAX_SCHEMA_NODES, 1, 10_000_000,
       "JSON objects and arrays one schema (text.format, response_format, a tool's "
       "parameters) may hold; checked before the metaschema check",
       field="schema_limits.max_nodes"),
    _n("max_schema_width", int, MAX_SCHEMA_WIDTH, 1, 10_000_000,
       "members one object or array of a schema may hold (properties per object)",
       field="schema_limits.max_width"),
    Setting("store", str, DEFAULT_STORE,
            "where store=true responses are kept: sqlite:///abs/path.db, sqlite://rel/path.db, "
            "redis://host:port/db (several processes) or memory://"),
    _n("store_ttl", float, None, 0.001, 100 * 365 * _DAY,
       "seconds a stored response is kept", shown="forever"),
    Setting("api_keys", list, (),
            "accept this API key (repeatable; the variable holds them comma-separated); with "
            "keys, every request needs 'Authorization: Bearer <key>'",
            flag="--api-key", to_field=tuple, metavar="KEY"),
    Setting("operator_key", str, None,
            "the operator's API key: the only key that sees every tenant in /inspect and "
            "reads /metrics; other keys see their own", metavar="KEY"),
    Setting("allow_unauthenticated", bool, False,
            "listen on a non-loopback address without API keys (refused otherwise)"),
    Setting("compaction_key", str, None,
            "seal compaction items with a key derived from SECRET; give every process behind "
            "one store the same one", metavar="SECRET", shown="a random key kept in the store"),
    _n("compaction_lifetime", float, COMPACTION_LIFETIME, 1, 100 * 365 * _DAY,
       "seconds a compaction item opens for after it was made; an older one is refused "
       "(invalid_encrypted_content)"),
    _n("gc_young_threshold", int, GC_YOUNG_THRESHOLD, 100, 1_000_000_000,
       "run the garbage collector's young generation every N net allocations (0 keeps "
       "Python's own, 700); objects made at start-up are frozen out of every collection "
       "either way", zero=True, field=None, metavar="N"),
    _n("mmap_threshold", int, MMAP_THRESHOLD, 128 * 1024, 32 * _MIB,
       "with glibc, give each allocation of BYTES or more its own mapping, returned to the "
       "system when freed (0 keeps glibc's sliding threshold, which after one large message "
       "keeps its size in the heap for good)", zero=True, field=None, metavar="BYTES"),
    Setting("ws_compression", bool, WS_COMPRESSION,
            "accept permessage-deflate when a WebSocket client offers it (the websockets "
            "library does by default; the openai SDK only when asked); off costs less memory "
            "per connection and CPU", takes_value=True, aliases=("--ws-per-message-deflate",)),
    Setting("prefix_reuse", bool, True,
            "keep the conversations rollouts held at the end of each turn (their tokens, "
            "per API key, shared by every transport), so a request whose input begins with "
            "one, resent whole or read back from the store, renders, tokenizes and "
            "classifies only what is new, and reports the rest as cached_tokens"),
    _n("prefix_reuse_bytes", int, PREFIX_REUSE_BYTES, 1, 1024 * _GIB,
       "bytes of tokens prefix reuse keeps, shared by every key (the least recently "
       "used conversations go first)"),
    Setting("inspector", bool, True,
            "keep the observations behind /inspect (off: every hook returns at once)"),
    _n("inspector_watchers", int, INSPECTOR_WATCHERS, 1, 1_000,
       "live /inspect feeds open at once; one more gets 429 (too_many_watchers)"),
    _n("inspector_watchers_per_key", int, INSPECTOR_WATCHERS_PER_KEY, 1, 1_000,
       "live /inspect feeds one API key may hold open (with keys on); one more gets 429 "
       "(too_many_watchers)"),
    _n("inspector_feed_lifetime", float, INSPECTOR_FEED_LIFETIME, 0.001, 365 * _DAY,
       "seconds a live /inspect feed stays open (an EventSource reconnects)"),
    _n("max_background", int, MAX_BACKGROUND, 1, 1_000_000,
       "HTTP: background=true responses running at once; beyond it a create gets 429 "
       "(too_many_background_responses)"),
    _n("max_background_per_key", int, MAX_BACKGROUND_PER_KEY, 1, 1_000_000,
       "HTTP: background responses one API key may run at once (with keys on); beyond it "
       "that key's create gets 429 (too_many_background_responses)"),
    _n("background_max_duration", float, BACKGROUND_MAX_DURATION, 0.001, 365 * _DAY,
       "HTTP: seconds a background response may run; then it ends incomplete "
       "(reason max_duration)"),
    _n("background_lease", float, BACKGROUND_LEASE, 0.03, _DAY,
       "HTTP: seconds a process's lease on a running background response lasts; renewed "
       "(with what it wrote so far) every third of it; once it runs out (the process "
       "stopped), the first process on the store that looks ends the response failed "
       "(server_error): each looks every third of it, and when the response is read"),
    _n("background_log_bytes", int, BACKGROUND_LOG_BYTES, 1, 1024 * _GIB,
       "HTTP: bytes of SSE events a running background response keeps for readers resuming "
       "with starting_after (oldest dropped first)"),
    _n("background_endings_bytes", int, BACKGROUND_ENDINGS_BYTES, 1, 1024 * _GIB,
       "HTTP: bytes of the event logs of finished background responses kept for a late "
       "GET ?stream=true, replayed from the first event (oldest dropped first; a log "
       "larger than this keeps its terminal event alone)"),
    Setting("secrets_policy", str, "flag",
            "what the secrets classifier does with a credential in new input: record it on "
            "the response's metadata, redact it before the model sees it, or refuse the input",
            choices=("flag", "redact", "refuse")),
    Setting("hosted_tools", str, "accept",
            "hosted tools this server cannot run (web_search, file_search, mcp, "
            "code_interpreter, image_generation, tool_search, ...): accept them (echoed in "
            "the response's tools, never offered to the model) or refuse the request",
            choices=("accept", "refuse")),
    Setting("mcp_allow_host", list, (),
            "a host the hosted mcp tool's server_url may name (repeatable); with none, every "
            "mcp tool is refused, so a tenant cannot make the server call any address",
            metavar="HOST[:PORT]", field="mcp.allowed_hosts", to_field=_hosts),
    _n("mcp_connect_timeout", float, _MCP_DEFAULTS.connect_timeout, 0.001, _DAY,
       "seconds to connect to an MCP server and finish its handshake",
       field="mcp.connect_timeout"),
    _n("mcp_call_timeout", float, _MCP_DEFAULTS.call_timeout, 0.001, _DAY,
       "seconds one MCP listing or call may take once connected", field="mcp.call_timeout"),
    _n("mcp_max_listing_bytes", int, _MCP_DEFAULTS.max_listing_bytes, 1, _GIB,
       "bytes of an MCP server's tool listing (as JSON); a larger one fails",
       field="mcp.max_listing_bytes"),
    _n("mcp_max_output_bytes", int, _MCP_DEFAULTS.max_output_bytes, 1, _GIB,
       "bytes of one MCP call's output; a larger one fails the call",
       field="mcp.max_output_bytes"),
    _n("mcp_max_calls", int, _MCP_DEFAULTS.max_calls, 1, 100_000,
       "MCP calls one Response may make; further calls fail", field="mcp.max_calls"),
    _n("mcp_max_servers", int, _MCP_DEFAULTS.max_servers, 1, 1_000,
       "mcp tools (MCP servers) one request may name; a request naming more is refused",
       field="mcp.max_servers"),
    _n("mcp_max_in_flight", int, _MCP_DEFAULTS.max_in_flight, 1, 100_000,
       "MCP listings and calls running at once in the server; one more fails at once "
       "(mcp_protocol_error -32001), the Response goes on", field="mcp.max_in_flight"),
    _n("mcp_max_in_flight_per_key", int, _MCP_DEFAULTS.max_in_flight_per_key, 1, 100_000,
       "of those, what one API key may run at once (with keys on); its next fails the "
       "same way, other keys' do not", field="mcp.max_in_flight_per_key"),
    _switch("incremental_validation",
            "validate only new input (off: the whole history, every time)"),
    _switch("incremental_classification",
            "classify only new input (off: the whole history, every time)"),
    _switch("token_cache", "render only new items (off: render the whole context every turn)"),
    _switch("resolution_reuse", "resolve the model once per rollout (off: every turn)"),
    _switch("overlapped_post_inference",
            "write usage and stored responses after the terminal event (off: before it)"),
    _n("sim_ttft_ms", float, 0.0, 0, 600_000, "time to first token, milliseconds",
       field="sim.time_to_first_token", to_field=_seconds, group=_SIM),
    _n("sim_tokens_per_second", float, _SIM_DEFAULTS.tokens_per_second, 1, 1_000_000,
       "decode speed (65, 1000, 4000 are reference points; 0 = unthrottled)", zero=True,
       field="sim.tokens_per_second", group=_SIM),
    _n("sim_prefill_tokens_per_second", float, _SIM_DEFAULTS.prefill_tokens_per_second, 1,
       1_000_000_000, "prefill rate over uncached input tokens (0 = instant)", zero=True,
       field="sim.prefill_tokens_per_second", group=_SIM),
    _n("sim_context_window", int, _SIM_DEFAULTS.context_window, 1, 1_000_000_000,
       "context window in tokens (longer input: context_length_exceeded, or dropped oldest "
       "items with truncation=auto)", field="sim.context_window", group=_SIM),
    _n("sim_tool_calls", int, _SIM_DEFAULTS.tool_calls, 0, 1024,
       "tool calls before its final answer when a request's metadata does not say "
       "(sim_tool_calls)", field="sim.tool_calls", group=_SIM),
    Setting("sim_calls", list, (),
            "script its calls (repeatable, in order, cycling): call tool NAME with these JSON "
            "arguments when it is offered, instead of arguments made from its schema (the "
            "variable holds one a line)", flag="--sim-call", metavar="NAME=JSON",
            item=scripted_call, separator="\n", field="sim.calls", to_field=tuple, group=_SIM),
    Setting("config", str, None,
            "TOML file of served models ([models.NAME]) and server settings ([server])",
            metavar="PATH", field=None, in_file=False, group=_BACKENDS),
    Setting("upstream", str, None, "an engine's API root, e.g. .../v1", metavar="URL",
            field=None, group=_BACKENDS),
    Setting("upstream_model", str, None, "the engine's name of the model", metavar="NAME",
            field=None, group=_BACKENDS),
    Setting("upstream_kind", str, "chat", "the engine's API", choices=tuple(KINDS),
            field=None, group=_BACKENDS),
    Setting("upstream_api_key_env", str, None, "environment variable holding the key",
            metavar="VAR", field=None, group=_BACKENDS),
    Setting("served_model_name", str, None, "the name clients use", metavar="NAME",
            shown="the upstream model's", field=None, group=_BACKENDS),
    _n("upstream_context_window", int, 128_000, 1, 100_000_000,
       "the model's window in tokens", metavar="TOKENS", aliases=("--max-model-len",),
       field=None, group=_BACKENDS),
    _n("chat_prefix_cache_tokens", int, CHAT_PREFIX_CACHE_TOKENS, 16, 1_000_000_000,
       "POST /v1/chat/completions: tokens of recent prompts kept by the prefix cache (blocks "
       "of 16, LRU; about 140 bytes a block); prefill time is charged only for uncached "
       "tokens; 0 turns it off", zero=True),
    _n("chat_max_in_flight", int, CHAT_MAX_IN_FLIGHT, 1, 1_000_000,
       "POST /v1/chat/completions: completions running at once; one more gets 429 "
       "rate_limit_exceeded with Retry-After, as an engine's queue limit does"),
    _n("chat_max_in_flight_per_key", int, CHAT_MAX_IN_FLIGHT_PER_KEY, 1, 1_000_000,
       "POST /v1/chat/completions: of those, what one API key may run at once (with keys "
       "on); its next gets the same 429, other keys' do not"),
    Setting("log_level", str, "info", "log verbosity",
            choices=("critical", "error", "warning", "info", "debug"), field=None),
)  # fmt: skip

#: The settings by name.
BY_NAME: Final[Mapping[str, Setting]] = {setting.name: setting for setting in SETTINGS}

#: The range of every numeric setting, keyed by its name (``--send-queue-depth``
#: is ``send_queue_depth``). Times are in seconds unless the name says ms.
RANGES: Final[Mapping[str, Range]] = {
    setting.name: setting.range for setting in SETTINGS if setting.range is not None
}


def ranged(name: str, kind: type[int] | type[float]) -> Callable[[str], Any]:
    """An argparse type: ``kind`` within the setting's range (:data:`RANGES`)."""
    setting = dataclasses.replace(BY_NAME[name], kind=kind)

    def parse(text: str) -> Any:
        try:
            return setting.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse
