"""The ``mcp`` tool's client: the tenant's MCP servers, called by this server.

Theory of operation
-------------------
A request's ``mcp`` tools are checked before anything is accepted
(:func:`check_mcp_tools`: a ``server_url`` on a host the operator allowed,
no ``connector_id``), then taken apart (:func:`redact_mcp_tools`): the
request the engine, the Response, the store and every log line see keeps no
``authorization`` and no ``headers``; those go into the request's
:class:`McpServers`, the engine's ``McpHost``
(``longresponse.engine.hosted``), which alone sends them, to the MCP server.

The listings and calls of one model turn share one MCP session per server,
made with the official SDK (``mcp``): streamable HTTP, or the older SSE
transport for a ``server_url`` whose path ends in ``/sse``. The session is
opened by the turn's first operation and ended by the rollout when the turn
ends (:meth:`McpServers.aclose`, in the turn's own task: a session is never
shared between tasks, and none is held while a rollout waits for its client);
one that failed or was cancelled is ended at once and the next operation
opens another. A cancelled turn (``response.cancel``, a disconnect) cancels
the operation in flight.
Each has the limits of :class:`McpLimits` (``--mcp-*`` flags): connecting and
the initialize handshake within ``connect_timeout``, the operation within
``call_timeout``, a listing or an output of at most so many bytes, so many
calls per Response, so many listings and calls running at once in the server
and of one API key's (:class:`McpInFlight`: one more fails at once, before
it connects, its limit named); its answers are read through the server's one HTTP
pool (``longresponse.hosted.pool``), with the session's headers on each of
its requests and each answer cut off at its operation's limit as it is read
(the operation fails with that limit's error). A server that is down, slow, answers an error or
garbage, or hangs fails that operation with :class:`McpFailure` and a
message of this module's own (never the exception's text, which may quote a
URL with credentials): the rollout goes on.

The SDK is imported when the server starts (:func:`load_sdk`, from the
app), and only if the operator allowed an MCP host: importing it takes
seconds (1.4 s of CPU measured), which the event loop must not spend in the
middle of a turn, and which a server that can call no MCP server need not
spend at all.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import math
import re
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

import msgspec

from protocol import ErrorCode, RemoteProtocolError
from protocol.events import ResponseCreate
from protocol.items import McpListedTool, McpTool, Tool

from ..config import McpLimits, SchemaLimits
from ..engine.admission import check_parameters
from ..engine.hosted import McpFailure

if TYPE_CHECKING:
    from .pool import Answers, McpPool

__all__ = [
    "McpInFlight",
    "McpLimits",
    "McpServers",
    "check_mcp_tools",
    "load_sdk",
    "redact_mcp_tools",
]

log = logging.getLogger(__name__)
# The SDK's HTTP client logs each request's URL at INFO: a line per MCP
# message, with a tenant's URL in it. Its warnings are kept.
logging.getLogger("httpx2").setLevel(logging.WARNING)

#: The error codes of an ``mcp_call``'s ``http_error`` (HTTP statuses).
BAD_GATEWAY: Final = 502
GATEWAY_TIMEOUT: Final = 504
#: JSON-RPC's "internal error": the server's answer could not be used.
INTERNAL_ERROR: Final = -32603
#: Our own code for a limit of this server's (JSON-RPC's implementation range).
LIMIT_EXCEEDED: Final = -32001
#: The code of a parameter the server knows but does not serve.
UNSUPPORTED_PARAMETER: Final = "unsupported_parameter"


@functools.cache
def load_sdk() -> Any:
    """The ``mcp`` SDK and its HTTP client, imported once (see the module docstring)."""
    import httpx2
    import mcp
    import mcp.client.sse
    import mcp.client.streamable_http
    import mcp.shared.exceptions
    import pydantic

    from .pool import Answers, McpPool

    for name in ("mcp.client.sse", "mcp.client.streamable_http", "mcp.shared.session"):
        logger = logging.getLogger(name)
        if _QUIETED not in logger.filters:
            logger.addFilter(_QUIETED)
    return types.SimpleNamespace(
        httpx2=httpx2,
        McpPool=McpPool,
        Answers=Answers,
        Client=mcp.Client,
        sse_client=mcp.client.sse.sse_client,
        streamable_http_client=mcp.client.streamable_http.streamable_http_client,
        MCPError=mcp.shared.exceptions.MCPError,
        ValidationError=pydantic.ValidationError,
    )


class _TenantText(logging.Filter):
    """The MCP SDK's own errors, as debug lines without a traceback.

    Their text is a tenant's server's (a URL from its ``endpoint`` event, the
    body it sent), and the SDK writes it at ERROR with a traceback: a tenant
    could fill the operator's log. What failed is said by this module's own
    line (the server's label and the failure's kind), and the SDK's at
    ``--log-level debug``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG:
            if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
                return False
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.exc_info = record.exc_text = None
            record.stack_info = None
        return True


_QUIETED: Final = _TenantText()


def _host_key(url: str) -> tuple[str, str, str] | None:
    """(scheme, host, host:port) of an http(s) URL; ``None`` if it is not one."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    port = port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname.lower(), f"{parts.hostname.lower()}:{port}"


def check_mcp_tools(tools: Sequence[Tool], limits: McpLimits) -> None:
    """Each ``mcp`` tool names a server this server may call. Raises
    :class:`RemoteProtocolError` (nothing accepted): ``connector_id`` or
    ``tunnel_id`` (OpenAI's hosted connectors and tunnels:
    ``unsupported_parameter``), no ``server_url`` (``missing_required_parameter``),
    a URL that is not http(s), a host not allowed (``--mcp-allow-host``), a
    ``server_label`` given twice, or more ``mcp`` tools than
    ``--mcp-max-servers`` (``invalid_value``, ``param`` the first one too many:
    checked before anything is connected to)."""
    labels: set[str] = set()
    for index, tool in enumerate(tools):
        if not isinstance(tool, McpTool):
            continue
        where = f"tools[{index}]"
        if len(labels) == limits.max_servers:
            raise RemoteProtocolError(
                f"Invalid value for '{where}': a request may name at most "
                f"{limits.max_servers} mcp tools (--mcp-max-servers).",
                code=ErrorCode.INVALID_VALUE,
                param=where,
            )
        for field in ("connector_id", "tunnel_id"):
            if isinstance(getattr(tool, field), str):
                raise RemoteProtocolError(
                    f"Unsupported parameter: '{where}.{field}': this server calls MCP "
                    "servers by server_url only (connectors and tunnels are OpenAI's).",
                    code=UNSUPPORTED_PARAMETER,
                    param=f"{where}.{field}",
                )
        if not isinstance(tool.server_url, str):
            raise RemoteProtocolError(
                f"Missing required parameter: '{where}.server_url'.",
                code=ErrorCode.MISSING_REQUIRED_PARAMETER,
                param=f"{where}.server_url",
            )
        key = _host_key(tool.server_url)
        if key is None:
            raise RemoteProtocolError(
                f"Invalid '{where}.server_url': an http or https URL is expected.",
                code=ErrorCode.INVALID_VALUE,
                param=f"{where}.server_url",
            )
        if key[1] not in limits.allowed_hosts and key[2] not in limits.allowed_hosts:
            raise RemoteProtocolError(
                f"Invalid '{where}.server_url': this server may not call MCP servers on "
                f"host {key[2]!r} (the operator allows hosts with --mcp-allow-host).",
                code=ErrorCode.INVALID_VALUE,
                param=f"{where}.server_url",
            )
        if tool.server_label in labels:
            raise RemoteProtocolError(
                f"Invalid '{where}.server_label': {tool.server_label!r} names two mcp tools.",
                code=ErrorCode.INVALID_VALUE,
                param=f"{where}.server_label",
            )
        labels.add(tool.server_label)
        _check_header_fields(tool, where)


#: A header's name: an HTTP token (RFC 9110 §5.1).
_FIELD_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: What no header's value may hold (RFC 9110 §5.5): a line break ends the
#: header and starts another one, of the client's making.
_FIELD_VALUE_FORBIDDEN: Final = re.compile(r"[\r\n\0]")


def _check_header_fields(tool: McpTool, where: str) -> None:
    """The tool's ``authorization`` and ``headers`` are valid HTTP fields.
    Raises :class:`RemoteProtocolError` ``invalid_value``; the message never
    quotes a value (they are secrets)."""
    fields: list[tuple[str, str | None, object]] = [
        (f"{where}.authorization", None, tool.authorization)
    ]
    if isinstance(tool.headers, dict):
        fields += [(f"{where}.headers", name, value) for name, value in tool.headers.items()]
    for param, name, value in fields:
        if name is not None and not _FIELD_NAME.fullmatch(name):
            raise RemoteProtocolError(
                f"Invalid '{param}': a header's name must be an HTTP token.",
                code=ErrorCode.INVALID_VALUE,
                param=param,
            )
        if isinstance(value, str) and _FIELD_VALUE_FORBIDDEN.search(value):
            raise RemoteProtocolError(
                f"Invalid '{param}': a header's value may not hold a line break or NUL.",
                code=ErrorCode.INVALID_VALUE,
                param=param,
            )


def redact_mcp_tools(request: ResponseCreate) -> tuple[ResponseCreate, dict[str, McpTool]]:
    """``request`` without its ``mcp`` tools' ``authorization`` and ``headers``,
    and those tools whole, by ``server_label`` (what :class:`McpServers` sends)."""
    whole: dict[str, McpTool] = {}
    tools: list[Tool] = []
    for tool in request.tools:
        if isinstance(tool, McpTool):
            whole[tool.server_label] = tool
            tool = msgspec.structs.replace(tool, authorization=msgspec.UNSET, headers=msgspec.UNSET)
        tools.append(tool)
    if not whole:
        return request, whole
    return msgspec.structs.replace(request, tools=tools), whole


def _names_filter(value: Any) -> tuple[set[str] | None, bool | None]:
    """A tool filter (``allowed_tools``, ``require_approval.always`` /
    ``.never``): its ``tool_names`` (``None``: any) and ``read_only``."""
    if isinstance(value, list):
        return {str(name) for name in value}, None
    if isinstance(value, dict):
        names = value.get("tool_names")
        read_only = value.get("read_only")
        return (
            {str(name) for name in names} if isinstance(names, list) else None,
            read_only if isinstance(read_only, bool) else None,
        )
    return None, None


def _matches(value: Any, name: str, read_only: bool) -> bool:
    return _passes(_names_filter(value), name, read_only)


def _passes(wanted: tuple[set[str] | None, bool | None], name: str, read_only: bool) -> bool:
    """Whether a tool passes a filter :func:`_names_filter` read."""
    names, wants_read_only = wanted
    if names is not None and name not in names:
        return False
    return wants_read_only is None or wants_read_only == read_only


class McpInFlight:
    """The server's MCP listings and calls running now, in all and by the owner
    of their API key: one per server, shared by every request's
    :class:`McpServers`, so that one key's slow MCP server cannot hold the
    server's connections and tasks (``--mcp-max-in-flight``,
    ``--mcp-max-in-flight-per-key``; the owner ``""``, keys off, is held by
    the limit in all alone)."""

    __slots__ = ("_limits", "by_owner", "running")

    def __init__(self, limits: McpLimits) -> None:
        self._limits = limits
        self.running = 0
        self.by_owner: collections.Counter[str] = collections.Counter()

    @contextlib.contextmanager
    def slot(self, owner: str) -> Iterator[None]:
        """A place for one listing or call of ``owner``'s while it runs. Raises
        :class:`McpFailure` (:data:`LIMIT_EXCEEDED`) beyond either limit; then
        nothing is held."""
        per_key = self._limits.max_in_flight_per_key
        if owner and self.by_owner[owner] >= per_key:
            raise McpFailure(
                f"This API key has {per_key} MCP listings and calls running, the most "
                "allowed (--mcp-max-in-flight-per-key). Retry later.",
                code=LIMIT_EXCEEDED,
            )
        limit = self._limits.max_in_flight
        if self.running >= limit:
            raise McpFailure(
                f"This server runs {limit} MCP listings and calls, the most it runs at "
                "once (--mcp-max-in-flight). Retry later.",
                code=LIMIT_EXCEEDED,
            )
        self.running += 1
        self.by_owner[owner] += 1
        try:
            yield
        finally:
            self.running -= 1
            self.by_owner[owner] -= 1
            if not self.by_owner[owner]:
                del self.by_owner[owner]


class McpServers:
    """The ``mcp`` tools of one request, their secrets with them (the engine's
    ``McpHost``; see the module docstring)."""

    def __init__(
        self,
        tools: dict[str, McpTool],
        limits: McpLimits,
        pool: McpPool,
        *,
        schema_limits: SchemaLimits,
        in_worker: Callable[..., Awaitable[Any]],
        in_flight: McpInFlight,
        owner: str = "",
    ) -> None:
        """``pool``: the server's HTTP pool (``longresponse.hosted.pool``);
        ``in_flight``: the server's listings and calls running, where this
        request's count as ``owner``'s;
        ``schema_limits`` and ``in_worker``: what a listed tool's schema is held
        to, and where it is checked, off the event loop (the server's check
        workers: :func:`listing_refusal`)."""
        self._tools = tools
        self.limits = limits
        self._pool = pool
        self._schema_limits = schema_limits
        self._in_worker = in_worker
        self._in_flight, self._owner = in_flight, owner
        self.calls = 0
        #: The session open with each server for the turn: (its owner, the client).
        self._open: dict[str, tuple[_Session, Any]] = {}

    def labels(self) -> Sequence[str]:
        return list(self._tools)

    def needs_approval(self, server_label: str, name: str, *, read_only: bool = False) -> bool:
        """``require_approval``: ``always`` (the default, as shipped), ``never``, or
        ``{"always": filter, "never": filter}`` (a tool either names is decided
        by it; any other needs approval)."""
        tool = self._tools.get(server_label)
        if tool is None:
            return True
        policy = tool.require_approval
        if policy == "never":
            return False
        if isinstance(policy, dict):
            if "never" in policy and _matches(policy["never"], name, read_only):
                return False
            if "always" in policy and _matches(policy["always"], name, read_only):
                return True
        return True

    def can_call(self) -> bool:
        return self.calls < self.limits.max_calls

    async def list_tools(self, server_label: str) -> list[McpListedTool]:
        tool = self._tools[server_label]
        allowed = _names_filter(tool.allowed_tools)  # none given: every tool
        listed: list[McpListedTool] = []
        size = 0
        too_large = (
            f"MCP server {server_label!r} lists more than {self.limits.max_listing_bytes} "
            "bytes of tools (--mcp-max-listing-bytes)."
        )
        limit = self.limits.max_listing_bytes
        using = self._using(tool, limit, too_large, "listing its tools")
        with self._in_flight.slot(self._owner):
            async with using as client, self._deadline(tool, "listing"):
                cursor: str | None = None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    for entry in page.tools:
                        read_only = bool(entry.annotations and entry.annotations.read_only_hint)
                        if not _passes(allowed, entry.name, read_only):
                            continue
                        item = McpListedTool(
                            name=entry.name,
                            input_schema=entry.input_schema,
                            description=entry.description
                            if entry.description is not None
                            else msgspec.UNSET,
                            annotations=entry.annotations.model_dump(
                                by_alias=True, exclude_none=True
                            )
                            if entry.annotations is not None
                            else msgspec.UNSET,
                        )
                        size += len(msgspec.json.encode(item))
                        if size > self.limits.max_listing_bytes:
                            raise McpFailure(too_large, code=LIMIT_EXCEEDED)
                        listed.append(item)
                    cursor = page.next_cursor
                    if not cursor:
                        break
        refusal = await self._in_worker(listing_refusal, listed, self._schema_limits)
        if refusal is not None:
            raise McpFailure(
                f"MCP server {server_label!r} lists a tool this server cannot offer: {refusal}",
                code=INTERNAL_ERROR,
            )
        return listed

    async def call(self, server_label: str, name: str, arguments: str) -> str:
        tool = self._tools.get(server_label)
        if tool is None:
            raise McpFailure(f"No mcp tool has server_label {server_label!r}.")
        if self.calls >= self.limits.max_calls:
            raise McpFailure(
                f"This Response made {self.calls} MCP calls, the most allowed (--mcp-max-calls).",
                code=LIMIT_EXCEEDED,
            )
        self.calls += 1
        try:
            parsed = msgspec.json.decode(arguments or "{}")
        except msgspec.DecodeError:
            raise McpFailure("The call's arguments are not JSON.", code=-32602) from None
        if not isinstance(parsed, dict):
            raise McpFailure("The call's arguments are not a JSON object.", code=-32602)
        too_large = (
            f"The output of {name!r} is larger than {self.limits.max_output_bytes} bytes "
            "(--mcp-max-output-bytes)."
        )
        limit = self.limits.max_output_bytes
        using = self._using(tool, limit, too_large, "calling a tool")
        with self._in_flight.slot(self._owner):
            async with using as client, self._deadline(tool, "call"):
                result = await client.call_tool(name, parsed)
        texts = [part.text for part in result.content if getattr(part, "type", "") == "text"]
        if texts:
            output = "\n".join(texts)
        elif result.structured_content is not None:
            output = msgspec.json.encode(result.structured_content).decode()
        else:
            output = ""
        if len(output.encode()) > limit:
            raise McpFailure(too_large, code=LIMIT_EXCEEDED)
        if result.is_error:
            raise McpFailure(output, kind="mcp_tool_execution_error")
        return output

    async def aclose(self) -> None:
        """End the MCP sessions kept open for the turn (see the module docstring)."""
        if self._open:
            await self._drop(next(iter(self._open)))

    # --- one MCP session per server for a turn -------------------------------------

    def _deadline(self, tool: McpTool, what: str) -> _Deadline:
        return _Deadline(self.limits.call_timeout, tool.server_label, what)

    @contextlib.asynccontextmanager
    async def _using(
        self, tool: McpTool, limit: int, too_large: str, when: str
    ) -> AsyncIterator[Any]:
        """The session with ``tool``'s server, opened if none is, its answers held
        to ``limit`` (``longresponse.hosted.pool``: one larger fails the operation
        with ``too_large``, :data:`LIMIT_EXCEEDED`); one that failed (or was
        cancelled) is ended, never used again (its failure says ``when``)."""
        label = tool.server_label
        kept = self._open.get(label)
        if kept is None:
            session = _Session(tool, self.limits, self._pool, load_sdk().Answers(limit, too_large))
            kept = self._open[label] = (session, await session.open())
        else:
            kept[0].answers.expect(limit, too_large)
        answers = kept[0].answers
        try:
            yield kept[1]
        except BaseException as exc:
            await self._drop(label)
            if answers.refused is not None and isinstance(exc, Exception):
                raise McpFailure(answers.refused, code=LIMIT_EXCEEDED) from None
            if answers.unreadable is not None and isinstance(exc, Exception):
                raise _unreadable(label, answers.unreadable, when) from None
            if isinstance(exc, Exception) and not isinstance(exc, McpFailure):
                raise _failure(label, exc, when) from None
            raise

    async def _drop(self, label: str) -> None:
        """End ``label``'s session, and first every session opened after it: a
        session's task group and cancel scopes are the turn's task's, nested in
        the order they were opened, and must end last-opened first (ended out
        of order, anyio cancels the turn's task itself). The others are opened
        again by their next operation."""
        if label not in self._open:
            return
        opened = list(self._open)
        for later in reversed(opened[opened.index(label) :]):
            session, _ = self._open.pop(later)
            with contextlib.suppress(Exception):
                await session.close()


def listing_refusal(listed: Sequence[McpListedTool], limits: SchemaLimits) -> str | None:
    """Why a listed tool's ``inputSchema`` could not be a function's ``parameters``
    (``engine.admission.check_parameters``: an object schema, the schema limits,
    the metaschema), for the first that could not; ``None`` if all could. Pure:
    run in a check worker."""
    for tool in listed:
        schema = tool.input_schema
        try:
            if not isinstance(schema, dict):
                raise RemoteProtocolError(
                    f"Invalid schema for function {tool.name!r}: not a JSON object.",
                    code=ErrorCode.INVALID_VALUE,
                )
            check_parameters(tool.name, schema, "inputSchema", limits)
        except RemoteProtocolError as refusal:
            return refusal.message
    return None


class _Deadline:
    """``call_timeout`` around an operation; its end is an ``http_error`` 504."""

    def __init__(self, seconds: float, label: str, what: str) -> None:
        self._timeout = asyncio.timeout(seconds if math.isfinite(seconds) else None)
        self._seconds, self._label, self._what = seconds, label, what

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()

    async def __aexit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        try:
            await self._timeout.__aexit__(kind, exc, tb)
        except TimeoutError:
            raise McpFailure(
                f"MCP server {self._label!r} did not finish the {self._what} within "
                f"{self._seconds:g} s (--mcp-call-timeout).",
                kind="http_error",
                code=GATEWAY_TIMEOUT,
            ) from None
        return False


class _Session:
    """An MCP session with one server for one operation (see the module docstring).

    Failures become :class:`McpFailure` with this module's own message: an HTTP
    status as ``http_error``, a JSON-RPC error as ``mcp_protocol_error`` (its
    code and message are the server's), anything else the server did as
    ``mcp_protocol_error`` -32603.
    """

    def __init__(self, tool: McpTool, limits: McpLimits, pool: McpPool, answers: Answers) -> None:
        self._tool, self._limits, self._pool = tool, limits, pool
        #: What its answers may weigh (each operation says: :meth:`McpServers._using`).
        self.answers = answers
        self._client: Any = None

    def _transport(self) -> Any:

        tool, limits = self._tool, self._limits
        headers = dict(tool.headers) if isinstance(tool.headers, dict) else {}
        if isinstance(tool.authorization, str):
            headers["Authorization"] = f"Bearer {tool.authorization}"
        url = tool.server_url
        assert isinstance(url, str)
        sdk = load_sdk()
        # The transport's own timeouts come after ours (_Deadline, the connect
        # deadline), so a slow server always gets this module's precise error.
        slack = limits.call_timeout + limits.connect_timeout + 1.0
        timeout = sdk.httpx2.Timeout(slack, connect=limits.connect_timeout + 1.0)
        if urlsplit(url).path.rstrip("/").endswith("/sse"):
            # The SDK asks for a client with its own timeouts and no headers: ours
            # go on each request, through the pool (longresponse.hosted.pool).
            pool, answers, ours = self._pool, self.answers, headers

            def session_client(headers: Any = None, timeout: Any = None, auth: Any = None) -> Any:
                return pool.client(ours, answers, timeout)

            return sdk.sse_client(
                url,
                timeout=limits.connect_timeout + 1.0,
                sse_read_timeout=slack,
                httpx_client_factory=session_client,
            )
        client = self._pool.client(headers, self.answers, timeout)
        return sdk.streamable_http_client(
            url, http_client=client, max_sse_event_size=limits.max_output_bytes + 65536
        ), client

    async def open(self) -> Any:
        """Connect and start the session; its MCP client."""
        transport = self._transport()
        self._http = None
        if isinstance(transport, tuple):
            transport, self._http = transport
        self._client = load_sdk().Client(transport, cache=None)
        label, limits = self._tool.server_label, self._limits
        try:
            async with asyncio.timeout(limits.connect_timeout):
                return await self._client.__aenter__()
        except TimeoutError:
            await self._close_http()
            raise McpFailure(
                f"MCP server {label!r} did not connect within {limits.connect_timeout:g} s "
                "(--mcp-connect-timeout).",
                kind="http_error",
                code=GATEWAY_TIMEOUT,
            ) from None
        except McpFailure:
            await self._close_http()
            raise
        except BaseException as exc:
            await self._close_http()
            if isinstance(exc, Exception) and self.answers.refused is not None:
                raise McpFailure(self.answers.refused, code=LIMIT_EXCEEDED) from None
            if isinstance(exc, Exception) and self.answers.unreadable is not None:
                raise _unreadable(label, self.answers.unreadable, "connecting") from None
            if isinstance(exc, Exception):
                raise _failure(label, exc, "connecting") from None
            raise

    async def close(self) -> None:
        """End the session and its HTTP client (what ending it raises is the
        caller's to drop: the operations' failures were reported already)."""
        try:
            await self._client.__aexit__(None, None, None)
        finally:
            await self._close_http()

    async def _close_http(self) -> None:
        if self._http is not None:
            await self._http.aclose()


def _unreadable(label: str, why: str, when: str) -> McpFailure:
    """An answer the pool could not read (``why``: its encoding)."""
    return McpFailure(
        f"MCP server {label!r} sent an answer {why} while {when}.", code=INTERNAL_ERROR
    )


def _failure(label: str, exc: BaseException, when: str) -> McpFailure:
    """Our own account of what went wrong with ``label``'s server (see :class:`_Session`)."""

    found: BaseException | None = exc
    while isinstance(found, BaseExceptionGroup) and found.exceptions:
        found = found.exceptions[0]
    sdk = load_sdk()
    if isinstance(found, sdk.MCPError):
        return McpFailure(
            f"MCP server {label!r} answered error {found.code}: "
            f"{found.message.splitlines()[0][:200] if found.message else ''}",
            code=found.code,
        )
    if isinstance(found, sdk.ValidationError):
        errors = found.errors()
        where = "/".join(str(part) for part in errors[0]["loc"])[:200] if errors else ""
        return McpFailure(
            f"MCP server {label!r} sent an answer that is not MCP while {when} (at {where!r}).",
            code=INTERNAL_ERROR,
        )
    if isinstance(found, sdk.httpx2.HTTPStatusError):
        status = found.response.status_code
        return McpFailure(
            f"MCP server {label!r} answered HTTP {status} while {when}.",
            kind="http_error",
            code=status,
        )
    if isinstance(found, sdk.httpx2.TransportError):
        return McpFailure(
            f"MCP server {label!r} could not be reached while {when}.",
            kind="http_error",
            code=BAD_GATEWAY,
        )
    log.info("MCP server %r failed while %s: %s", label, when, type(found).__name__)
    return McpFailure(
        f"MCP server {label!r} sent an answer that could not be read while {when}.",
        code=INTERNAL_ERROR,
    )
