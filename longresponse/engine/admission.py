"""The request pipeline: pre-inference stages, each switchable and counted.

Theory of operation
-------------------
The shipped design is fast because it reuses connection-scoped state four
ways. Each reuse is a :class:`Switches` flag, so an ablation can turn any of
them off and the server then does the full work every turn, as a stateless
server would, while the responses stay the same:

``incremental_validation``
    items and tools are checked once, when they arrive; off: the whole
    history is checked again on every request.
``incremental_classification``
    the secrets classifier reads each item once and its verdicts are kept
    with the rollout; off: the whole history is read again on every request.
``token_cache``
    each item is rendered and tokenized once into the rollout's token cache;
    off: the whole context is rendered again every turn.
``resolution_reuse``
    the model is resolved once per rollout and again only when a request
    names another model; off: resolved on every turn.
``overlapped_post_inference``
    usage records and stored responses are written by a background queue
    after the terminal event; off: written before the terminal event is sent.

Admission (a create, an append, a continuation) runs :meth:`Pipeline.admit`:
validation of the tools, the ``text.format`` (``longresponse.engine.structured``)
and the new input, and classification of the new input (or of everything,
with the switch off), before anything is accepted, so a refusal changes nothing. The
turn itself (``Rollout.turn``) renders and checks the context window.
Every stage adds to :class:`Counters` and to the turn's stage times.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final

import jsonschema
import msgspec

from protocol import ErrorCode, RemoteProtocolError, wire_type
from protocol.items import (
    ApplyPatchCallOutput,
    CallOutput,
    ClientCall,
    Compaction,
    CompactionTrigger,
    CustomTool,
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    FunctionTool,
    InputFile,
    InputImage,
    InputText,
    Item,
    LocalShellCallOutput,
    McpTool,
    Message,
    NamespaceTool,
    OutputText,
    Reasoning,
    ReasoningText,
    Refusal,
    ShellCallOutput,
    ShellOutput,
    Tool,
    answered_call_id,
    is_hosted,
    item_text,
    output_text,
)
from protocol.response import FormatJSONSchema, TextFormat

from ..config import SchemaLimits, Switches
from .classifier import Finding, Policy, redact, scan
from .compaction import Compactor, refused
from .structured import check_format, schema_limits

__all__ = [
    "MAX_VERDICTS",
    "PRESCAN_CHARS",
    "PRESCAN_ITEMS",
    "PRESCAN_KEPT_CHARS",
    "TOOL_NAME_PATTERN",
    "Admission",
    "Counters",
    "HostedTools",
    "Pipeline",
    "Switches",
    "check_parameters",
    "name_refusal",
    "parameters_refusal",
    "too_many_tools",
]

log = logging.getLogger(__name__)


class HostedTools(enum.StrEnum):
    """What admission does with a hosted tool (web search, MCP, ...) this server
    cannot run (``--hosted-tools``): accept it (echoed in the Response's
    ``tools``, never offered to the model), or refuse the request."""

    ACCEPT = "accept"
    REFUSE = "refuse"


#: Tool lists and formats whose verdicts one pipeline keeps (16-byte digests).
MAX_VERDICTS: Final = 4096

#: A request's texts are read by the secrets classifier in
#: :meth:`Pipeline.settle` (a worker thread), not on the event loop, when they
#: hold this many characters, or are this many, in all.
PRESCAN_CHARS: Final = 65_536
PRESCAN_ITEMS: Final = 64
#: Characters of texts read ahead and not admitted yet that a pipeline keeps
#: (the oldest go first; a text pushed out is read again when admitted).
PRESCAN_KEPT_CHARS: Final = 64 << 20

#: Function tool names, as the shipped API accepts them.
TOOL_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclasses.dataclass(slots=True)
class Counters:
    """Work done by the pipeline since the server started (for tests and /metrics)."""

    items_validated: int = 0
    tool_schemas_checked: int = 0
    items_classified: int = 0
    secrets_found: int = 0
    tokens_rendered: int = 0
    items_rendered: int = 0
    resolutions: int = 0


@dataclasses.dataclass(slots=True)
class Admission:
    """What admitting new input produced: the items to accept and the stage times."""

    items: list[Item]
    #: The classifier's findings per accepted item (empty tuples for clean ones).
    verdicts: list[tuple[Finding, ...]]
    validate_seconds: float = 0.0
    classify_seconds: float = 0.0


_USER_PARTS: Final = (InputText, InputImage, InputFile)
_ASSISTANT_PARTS: Final = (OutputText, Refusal)


class Pipeline:
    """The pre-inference stages, shared by every transport of one server."""

    def __init__(
        self,
        switches: Switches,
        policy: Policy = Policy.FLAG,
        hosted_tools: HostedTools = HostedTools.ACCEPT,
        *,
        limits: SchemaLimits | None = None,
    ) -> None:
        self.switches = switches
        self.limits = limits or SchemaLimits()
        self.policy = policy
        self.hosted_tools = hosted_tools
        self.counters = Counters()
        #: The verdicts of tool lists and formats checked (None: admitted; else
        #: the refusal), by digest of their encoding; at most MAX_VERDICTS.
        self._verdicts: dict[bytes, RemoteProtocolError | None] = {}
        self._last_tools: tuple[Sequence[Tool], bytes] | None = None
        #: Long texts read ahead by :meth:`settle`, by the ``id`` of what each is
        #: made from (:func:`_text_source`: kept too, its id names it only while
        #: it lives), with the text's length and its findings.
        self._prescanned: dict[int, tuple[object, int, tuple[Finding, ...]]] = {}
        self._prescanned_chars = 0
        self._prescan_lock = threading.Lock()

    def tools_key(self, tools: Sequence[Tool]) -> bytes:
        """A digest of the tool list's encoding (16 bytes, however large the list),
        computed once per request (admission and the prefix check of the turn both
        need it, for the same list object)."""
        last = self._last_tools
        if last is not None and last[0] is tools:
            return last[1]
        key = _digest(b"tools:", msgspec.json.encode(list(tools)))
        self._last_tools = (tools, key)
        return key

    # --- verdicts kept ----------------------------------------------------------

    def settled(
        self, tools: Sequence[Tool], text_format: TextFormat | None, items: Sequence[Item] = ()
    ) -> bool:
        """Whether admitting ``tools``, ``text_format`` and ``items`` runs no check
        whose cost grows with them: their verdicts are kept, or there is nothing
        costly (no tools or format, more tools than allowed: refused at once, no
        texts to read ahead that were not: :meth:`_unread`). With
        incremental validation off, tools and format always count as settled
        (their checks then run in place, every time)."""
        if self._unread(items):
            return False
        if not self.switches.incremental_validation or _offered(tools) > self.limits.max_tools:
            return True
        if tools and self.tools_key(tools) not in self._verdicts:
            return False
        return (
            not isinstance(text_format, FormatJSONSchema)
            or _format_key(text_format) in self._verdicts
        )

    def settle(
        self,
        tools: Sequence[Tool],
        text_format: TextFormat | None,
        items: Sequence[Item] = (),
        read: Callable[[str], Sequence[Finding]] = scan,
    ) -> None:
        """Check ``tools`` and ``text_format`` now and keep both verdicts, a
        refusal included, for :meth:`admit` to find; read the texts of
        ``items`` with the secrets classifier (``read``: :func:`scan`, or the
        same run elsewhere) when there are enough of them, and keep the
        findings for :meth:`classify` until :meth:`forget` (at most
        :data:`PRESCAN_KEPT_CHARS` characters of them). Never raises. Made to
        run in a worker thread, off the event loop: it only adds whole
        entries to what is kept."""
        with contextlib.suppress(RemoteProtocolError):
            self.check_tools(tools)
        with contextlib.suppress(RemoteProtocolError):
            self.check_text_format(text_format)
        for source, text in self._unread(items):
            found = tuple(read(text))
            with self._prescan_lock:
                if id(source) not in self._prescanned:  # else read by another meanwhile
                    self._prescanned[id(source)] = (source, len(text), found)
                    self._prescanned_chars += len(text)
                while self._prescanned_chars > PRESCAN_KEPT_CHARS:
                    _, chars, _ = self._prescanned.pop(next(iter(self._prescanned)))
                    self._prescanned_chars -= chars

    def forget(self, items: Sequence[Item]) -> None:
        """Drop what :meth:`settle` read ahead of ``items`` and admission did not
        take (a request refused before admission): nothing outlives its request."""
        sources = [_text_source(item) for item in items]
        with self._prescan_lock:
            for source in sources:
                kept = self._prescanned.get(id(source))
                if kept is not None and kept[0] is source:
                    del self._prescanned[id(source)]
                    self._prescanned_chars -= kept[1]

    def _unread(self, items: Sequence[Item]) -> list[tuple[object, str]]:
        """The texts of ``items`` not read ahead, with what each is made from
        (:func:`_text_source`), when there is enough to read
        (:data:`PRESCAN_CHARS` characters or :data:`PRESCAN_ITEMS` texts in all);
        else none (they are read in place, at once)."""
        texts = [(_text_source(item), _classified_text(item)) for item in items]
        texts = [(source, text) for source, text in texts if text]
        if len(texts) < PRESCAN_ITEMS and sum(len(text) for _, text in texts) < PRESCAN_CHARS:
            return []
        with self._prescan_lock:
            unread = {id(s): (s, text) for s, text in texts if id(s) not in self._prescanned}
        return list(unread.values())

    def _read_ahead(self, item: Item) -> tuple[Finding, ...] | None:
        """The findings :meth:`settle` kept for ``item``'s text, or None."""
        source = _text_source(item)
        kept = self._prescanned.get(id(source))
        if kept is None or kept[0] is not source:
            return None
        return kept[2]

    def _kept(self, key: bytes) -> bool:
        """True when ``key``'s verdict is kept and admits; raises a copy of a kept refusal."""
        if not self.switches.incremental_validation or key not in self._verdicts:
            return False
        refusal = self._verdicts.get(key)
        if refusal is not None:
            raise refusal.with_()
        return True

    def _keep(self, key: bytes, refusal: RemoteProtocolError | None) -> None:
        if len(self._verdicts) >= MAX_VERDICTS:
            self._verdicts.clear()
        self._verdicts[key] = refusal

    # --- validation -----------------------------------------------------------

    def check_tools(self, tools: Sequence[Tool]) -> None:
        """Tool names (unique among the tools the model is offered, and within a
        namespace), parameter schemas (JSON Schema metaschema, an object schema
        at the root, within ``structured.schema_limits``), at most one of each
        built-in kind, and hosted tools under :attr:`hosted_tools`.

        A tool list whose verdict is kept (with incremental validation on) is
        not checked again: the verdict is the same whoever sends it, on any
        transport. Raises :class:`RemoteProtocolError`.
        """
        offered = _offered(tools)
        if offered > self.limits.max_tools:
            raise too_many_tools(offered, self.limits.max_tools)
        if not tools:
            return
        key = self.tools_key(tools)
        if self._kept(key):
            return
        try:
            self._check_tool_list(tools)
        except RemoteProtocolError as refusal:
            self._keep(key, refusal.with_())
            raise
        self._keep(key, None)

    def _check_tool_list(self, tools: Sequence[Tool]) -> None:
        names: set[str] = set()
        kinds: set[str] = set()
        hosted: list[str] = []
        for index, tool in enumerate(tools):
            where = f"tools[{index}]"
            kind = wire_type(tool)
            if is_hosted(tool):
                if self.hosted_tools is HostedTools.REFUSE:
                    raise RemoteProtocolError(
                        f"Invalid value for '{where}.type': this server cannot run the hosted "
                        f"tool {kind!r} (hosted tools are refused here: --hosted-tools refuse).",
                        code=ErrorCode.INVALID_VALUE,
                        param=f"{where}.type",
                    )
                if not isinstance(tool, McpTool):  # mcp tools are run (``engine/hosted.py``)
                    hosted.append(kind)
            elif isinstance(tool, FunctionTool | CustomTool | NamespaceTool):
                self._check_named(tool, where, names)
                if isinstance(tool, NamespaceTool):
                    inner: set[str] = set()
                    for position, sub in enumerate(tool.tools):
                        self._check_named(sub, f"{where}.tools[{position}]", inner)
            elif kind in kinds:
                raise RemoteProtocolError(
                    f"Invalid value for '{where}.type': the tool {kind!r} is given twice.",
                    code=ErrorCode.INVALID_VALUE,
                    param=f"{where}.type",
                )
            else:
                kinds.add(kind)
        if hosted:
            log.info(
                "hosted tools accepted, echoed and not offered to the model: %s",
                ", ".join(hosted),
            )

    def _check_named(
        self, tool: FunctionTool | CustomTool | NamespaceTool, where: str, names: set[str]
    ) -> None:
        """One named tool: its name's spelling, unique in ``names``, its schema."""
        self.counters.tool_schemas_checked += 1
        if not TOOL_NAME_PATTERN.fullmatch(tool.name):
            raise name_refusal(where)
        if tool.name in names:
            raise RemoteProtocolError(
                f"Duplicate tool name {tool.name!r}.",
                code=ErrorCode.INVALID_VALUE,
                param=f"{where}.name",
            )
        names.add(tool.name)
        if isinstance(tool, FunctionTool) and tool.parameters is not None:
            check_parameters(tool.name, tool.parameters, f"{where}.parameters", self.limits)

    def check_text_format(self, text_format: TextFormat | None) -> None:
        """A ``json_schema`` format's name and schema (strict rules when ``strict``).

        Like the tools, a format whose verdict is kept is not checked again.
        Raises :class:`RemoteProtocolError`.
        """
        if not isinstance(text_format, FormatJSONSchema):
            return
        key = _format_key(text_format)
        if self._kept(key):
            return
        try:
            check_format(text_format, self.limits)
        except RemoteProtocolError as refusal:
            self._keep(key, refusal.with_())
            raise
        self._keep(key, None)

    def validate_items(
        self, items: Sequence[Item], *, offset: int = 0, compactor: Compactor | None = None
    ) -> None:
        """Semantic checks the wire decoder cannot make. ``offset`` numbers the params.

        A compaction item must open with ``compactor`` (none: it cannot).
        Raises :class:`RemoteProtocolError` naming ``input[i]...``.
        """
        self.counters.items_validated += len(items)
        for position, item in enumerate(items, offset):
            where = f"input[{position}]"
            if isinstance(item, Message):
                if isinstance(item.content, str):
                    continue
                allowed = _ASSISTANT_PARTS if item.role == "assistant" else _USER_PARTS
                for index, part in enumerate(item.content):
                    if not isinstance(part, allowed):
                        kind = wire_type(part)
                        raise RemoteProtocolError(
                            f"Invalid value: '{kind}'. A {item.role} message cannot carry it.",
                            code=ErrorCode.INVALID_VALUE,
                            param=f"{where}.content[{index}].type",
                        )
            elif isinstance(item, ClientCall):
                _check_call(item, where)
            elif isinstance(item, CallOutput):
                _check_output(item, where)
            elif isinstance(item, Compaction):
                if compactor is None:
                    raise refused(f"{where}.encrypted_content")
                compactor.check(item, f"{where}.encrypted_content")
            elif isinstance(item, Reasoning):
                for index, part in enumerate(item.content or []):
                    if not isinstance(part, ReasoningText):  # pragma: no cover - decoder
                        raise RemoteProtocolError(
                            "Reasoning content holds reasoning_text parts only.",
                            code=ErrorCode.INVALID_VALUE,
                            param=f"{where}.content[{index}]",
                        )

    # --- classification -------------------------------------------------------

    def classify(self, items: Sequence[Item]) -> list[tuple[Finding, ...]]:
        """The classifier's findings for each item (user messages and tool outputs)."""
        self.counters.items_classified += len(items)
        verdicts: list[tuple[Finding, ...]] = []
        for item in items:
            found = self._read_ahead(item) if self._prescanned else None
            if found is None:
                text = _classified_text(item)
                found = tuple(scan(text)) if text else ()
            self.counters.secrets_found += len(found)
            verdicts.append(found)
        return verdicts

    def apply_policy(
        self, items: Sequence[Item], verdicts: Sequence[tuple[Finding, ...]], *, offset: int = 0
    ) -> list[Item]:
        """Refuse (raise), redact, or keep-and-flag the items with findings."""
        out: list[Item] = []
        for position, (item, found) in enumerate(zip(items, verdicts, strict=True), offset):
            if not found:
                out.append(item)
                continue
            if self.policy is Policy.REFUSE:
                kinds = ", ".join(sorted({f.kind for f in found}))
                raise RemoteProtocolError(
                    f"The input contains what looks like a secret ({kinds}); it was refused. "
                    "Remove it, or ask the operator for the redact policy.",
                    code="secret_detected",
                    param=f"input[{position}]",
                )
            if self.policy is Policy.REDACT:
                item = _redacted(item, found)
            out.append(item)
        return out

    # --- admission -------------------------------------------------------------

    def admit(
        self,
        new_items: Sequence[Item],
        *,
        history: Sequence[Item] = (),
        tools: Sequence[Tool] = (),
        text_format: TextFormat | None = None,
        cached: bool = True,
        compactor: Compactor | None = None,
        known: int = 0,
    ) -> Admission:
        """Validate and classify new input before it is accepted.

        ``cached`` says the checks of ``history`` are kept from earlier turns
        (a rollout in memory); the HTTP path has no such state and passes
        ``False``. With incremental validation or classification off, that
        stage runs over ``history`` again too (the work a stateless server
        repeats). ``known``: how many leading items of ``history`` then
        ``new_items`` are a conversation admitted recently (a known prefix,
        ``longresponse.serve.prefix_reuse``), which the classifier does not
        read again (with incremental classification on); every item is
        validated, which costs little. Compaction items must open with
        ``compactor``; a ``compaction_trigger`` may only end the new input.
        Raises :class:`RemoteProtocolError`; nothing is accepted then.
        """
        started = time.perf_counter()
        self.check_tools(tools)
        self.check_text_format(text_format)
        if not (cached and self.switches.incremental_validation):
            try:
                self.validate_items(history, compactor=compactor)
            except RemoteProtocolError as error:
                if error.code == ErrorCode.INVALID_ENCRYPTED_CONTENT:
                    error.param = "previous_response_id"  # a stored one; the key changed since
                raise
        self.validate_items(new_items, offset=0, compactor=compactor)
        for position, item in enumerate(new_items[:-1]):
            if isinstance(item, CompactionTrigger):
                raise RemoteProtocolError(
                    "A compaction_trigger must be the last input item.",
                    code=ErrorCode.INVALID_VALUE,
                    param=f"input[{position}].type",
                )
        validated = time.perf_counter()
        if not self.switches.incremental_classification:
            known = 0
        if not (cached and self.switches.incremental_classification):
            self.classify(history[known:])
        skipped = min(max(known - len(history), 0), len(new_items))
        no_findings: list[tuple[Finding, ...]] = [()] * skipped
        found = no_findings + self.classify(new_items[skipped:])
        items = self.apply_policy(new_items, found)
        classified = time.perf_counter()
        return Admission(
            items=items,
            verdicts=found,
            validate_seconds=validated - started,
            classify_seconds=classified - validated,
        )

    @staticmethod
    def flagged(verdicts: Sequence[tuple[Finding, ...]]) -> dict[str, str]:
        """Response metadata recording what the classifier flagged (empty when clean)."""
        kinds = sorted({f.kind for found in verdicts for f in found})
        if not kinds:
            return {}
        count = sum(len(found) for found in verdicts)
        return {"secrets_flagged": str(count), "secrets_kinds": ",".join(kinds)[:512]}


def _offered(tools: Sequence[Tool]) -> int:
    """The tools offered to the model: a namespace's count, not the namespace."""
    return len(tools) + sum(len(tool.tools) for tool in tools if isinstance(tool, NamespaceTool))


def _digest(kind: bytes, encoding: bytes) -> bytes:
    return hashlib.blake2b(kind + encoding, digest_size=16).digest()


def _format_key(text_format: FormatJSONSchema) -> bytes:
    return _digest(b"format:", msgspec.json.encode(text_format))


def _check_call(item: ClientCall, where: str) -> None:
    """A client tool call replayed as input: a non-empty ``call_id`` (and name)."""
    if not item.call_id:
        raise RemoteProtocolError(
            f"A {wire_type(item)} needs a non-empty call_id.",
            code=ErrorCode.INVALID_VALUE,
            param=f"{where}.call_id",
        )
    if isinstance(item, FunctionCall | CustomToolCall) and not item.name:
        raise RemoteProtocolError(
            f"A {wire_type(item)} needs a non-empty name.",
            code=ErrorCode.INVALID_VALUE,
            param=f"{where}.name",
        )


def _check_output(item: CallOutput, where: str) -> None:
    """A tool output names the call it answers (``local_shell_call_output``: by
    ``call_id`` or ``id``)."""
    if isinstance(item, LocalShellCallOutput) and not (
        isinstance(item.call_id, str) or isinstance(item.id, str)
    ):
        raise RemoteProtocolError(
            "Missing required parameter: a local_shell_call_output names its call by "
            "'call_id' (or 'id').",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER,
            param=f"{where}.call_id",
        )
    if not answered_call_id(item):
        raise RemoteProtocolError(
            f"A {wire_type(item)} needs a non-empty call_id.",
            code=ErrorCode.INVALID_VALUE,
            param=f"{where}.call_id",
        )


def _text_source(item: Item) -> object:
    """What ``item``'s classified text is made from, an object that lives as
    long as the request's items: a text of several parts is joined anew at
    every call, so read-ahead findings are kept by this object's identity."""
    source = item.content if isinstance(item, Message) else getattr(item, "output", None)
    return source if isinstance(source, str | list) else item


def _classified_text(item: Item) -> str:
    if isinstance(item, Message) and item.role != "assistant":
        return item_text(item.content)
    if isinstance(item, CallOutput):
        return output_text(item)
    return ""


def _redacted(item: Item, found: Sequence[Finding]) -> Item:
    if isinstance(item, Message):
        return msgspec.structs.replace(item, content=redact(item_text(item.content), found))
    if isinstance(item, FunctionCallOutput | CustomToolCallOutput):
        return msgspec.structs.replace(item, output=redact(item_text(item.output), found))
    if isinstance(item, LocalShellCallOutput | ApplyPatchCallOutput):
        return msgspec.structs.replace(item, output=redact(output_text(item), found))
    if isinstance(item, ShellCallOutput):
        # The findings are positions in the parts' joined text: kept as one part.
        outcome = item.output[0].outcome
        part = ShellOutput(stdout=redact(output_text(item), found), stderr="", outcome=outcome)
        return msgspec.structs.replace(item, output=[part])
    return item  # pragma: no cover - a screenshot has no text to classify


def name_refusal(where: str) -> RemoteProtocolError:
    """The refusal of the tool at ``where`` (``tools[0]``) whose name is outside
    :data:`TOOL_NAME_PATTERN`."""
    return RemoteProtocolError(
        f"Invalid '{where}.name': use 1-64 characters from [A-Za-z0-9_-].",
        code=ErrorCode.INVALID_VALUE,
        param=f"{where}.name",
    )


def too_many_tools(offered: int, limit: int) -> RemoteProtocolError:
    """The refusal of a request that offers the model more than ``limit`` tools
    (``--max-tools``; a namespace's tools are counted, not the namespace)."""
    return RemoteProtocolError(
        f"Invalid 'tools': {offered} tools offered; the limit is {limit} (--max-tools).",
        code=ErrorCode.INVALID_VALUE,
        param="tools",
    )


def parameters_refusal(name: str, why: str, param: str) -> RemoteProtocolError:
    """The refusal of function ``name``, whose ``parameters`` are refused for
    ``why`` (at ``param``: the parameters, or the place in them a limit names)."""
    return RemoteProtocolError(
        f"Invalid schema for function '{name}': {why}.",
        code=ErrorCode.INVALID_VALUE,
        param=param,
    )


def check_parameters(
    name: str, schema: dict[str, object], param: str, limits: SchemaLimits
) -> None:
    """A function's ``parameters`` (or an MCP server's listed ``inputSchema``):
    an object schema (as the shipped API requires), within the size limits (a
    cheap walk, first), valid under the metaschema. Raises
    :class:`RemoteProtocolError` (:func:`parameters_refusal`); nothing changes."""
    fault = schema_limits(schema, limits)
    if fault is not None:
        raise parameters_refusal(name, fault.message, fault.param(param))
    why = None
    kind = schema.get("type", "object")
    if kind != "object":
        got = msgspec.json.encode(kind).decode()
        why = f"""schema must be a JSON Schema of 'type: "object"', got 'type: {got}'"""
    else:
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            why = exc.message
        except RecursionError:
            why = "nested too deeply to check"
    if why is not None:
        raise parameters_refusal(name, why, param)
