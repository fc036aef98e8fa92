"""The deterministic simulated model ``sim``: the mock backend.

A :class:`~longresponse.engine.sampling.Sampler` turns a context into an async
stream of chunks: text deltas, tool-call starts, argument deltas, item ends and one stop. One
sampler instance lives as long as its rollout, so it may keep reusable state
across pauses (a real model would keep its KV cache there).

``sim`` is the embedded default. It is deterministic: what it says depends
only on its context and request (its call ids are random, unique per call,
and always the same number of tokens: :func:`_call_id`). When function tools are offered and allowed
it calls them (arguments generated from each tool's JSON schema) until it has
made ``sim_tool_calls`` calls since the last user message, ``sim_parallel_calls``
per turn (under ``tool_choice: "required"`` or a named tool, at least one
call every turn, as the shipped API forces one); then it answers with a
message quoting the first 40 characters of every user message and every
tool output in its context, so a test can prove the model saw its whole
context. Asked for JSON (``text.format``), it writes that answer as JSON
instead (:mod:`.structured`).
``max_output_tokens`` is the Response's budget in tokens: a call whose
arguments would not fit is not started, and the answer stops at the last word
(or JSON slice) that fits, so ``usage.output_tokens`` never exceeds it. Its
speed (time to first token, decode tokens/s, prefill tokens/s over uncached
tokens) comes from the server flags, overridable per request by ``metadata``:

``sim_tool_calls``        calls before the final answer (default: the flag, 1; 0 to 1,024)
``sim_parallel_calls``    calls per turn (default 1; 0 to 128, 0 counts as 1)
``sim_output_tokens``     pad the final answer to about this many words (0 to 2,000,000)
``sim_tokens_per_second`` decode speed for this request (0 = unthrottled, else 1 to 10^6)
``sim_ttft_ms``           time to first token for this request (0 to 600,000)

A client that cannot set ``metadata`` (Codex) is served by the server's
flags: ``--sim-tool-calls`` is the default of ``sim_tool_calls``, and
``--sim-call NAME=JSON`` (repeatable) scripts the calls: the k-th call since
the last user message is the k-th scripted call (cycling) among those whose
tool is offered, with the script's arguments (so a test can have Codex run a
harmless command). With no scripted tool offered, the calls are as without a
script.

Arguments made from a schema are charged to a budget of work, the
Response's output budget (``max_output_tokens``, else
:data:`~.structured.DEFAULT_ANSWER_TOKENS`) shared by the turn's calls: a
value costs one, a string one more per
:data:`~.structured.CHARS_PER_TOKEN` characters, an array of ``minItems``
its item's cost times the count, charged before the array exists. A call
whose arguments would cost more is not started and the Response stops
(``max_output_tokens``): nested ``minItems``, each within its cap, can
multiply to 10^8 elements, and were built and encoded on the event loop.

A value outside its range (or not finite) is refused up front with
``invalid_value`` (:func:`check_sim_metadata`, the ``check_request`` of the
sim's :class:`~longresponse.engine.sampling.ModelSpec`, run only for a
request the sim serves), so no request can make the model sleep forever or
plan a million calls. A compaction keeps what the answer quotes (the
engine's summary, ``longresponse.engine.summary``).

The answer is generated lazily: the quoted summary is built (it is as long as
the context's user messages and outputs, at most 40 characters each), then
the padding is produced one word at a time as the stream is read, its token
count known word by word; the whole padded text never exists before it is
sent. Generation gives the event loop a turn at least every
:data:`SIM_YIELD_SECONDS`, throttled or not, so one long answer cannot stall
the other connections. (An answer in JSON is built whole, off the loop in a
worker thread, and no longer than the Response's output budget.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Final

import msgspec

from protocol import ErrorCode, RemoteProtocolError
from protocol.items import (
    ApplyPatchTool,
    CallOutput,
    ClientCall,
    ComputerTool,
    ComputerUsePreviewTool,
    CustomGrammarFormat,
    CustomTool,
    FunctionTool,
    Item,
    LocalShellTool,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    Message,
    NamespaceTool,
    ShellTool,
    Tool,
    ToolChoice,
    ToolChoiceAllowed,
    ToolChoiceApplyPatch,
    ToolChoiceComputer,
    ToolChoiceComputerUse,
    ToolChoiceComputerUsePreview,
    ToolChoiceCustom,
    ToolChoiceFunction,
    ToolChoiceMcp,
    ToolChoiceShell,
    answered_call_id,
    item_text,
    output_text,
)
from protocol.response import FormatText

from ...config import RANGES, SimConfig
from ...engine.sampling import (
    HANDED_BACK,
    READ_OUTPUTS,
    SUMMARY_HEAD_CHARS,
    ArgumentsDelta,
    CallKind,
    ItemEnd,
    ModelSpec,
    SampleChunk,
    SampleRequest,
    Stop,
    TextDelta,
    ToolCallStart,
    carried_quotes,
    encode,
    latest_listings,
    quote,
)
from .patterns import pattern_example
from .structured import CHARS_PER_TOKEN, DEFAULT_ANSWER_TOKENS, answer_in_format

__all__ = [
    "MAX_SIM_OUTPUT_TOKENS",
    "MAX_SIM_PARALLEL_CALLS",
    "MAX_SIM_TOKENS_PER_SECOND",
    "MAX_SIM_TOOL_CALLS",
    "MAX_SIM_TTFT_MS",
    "QUOTE_CHARS",
    "SIM_YIELD_SECONDS",
    "OutOfBudget",
    "SimSampler",
    "check_sim_metadata",
    "example_for_schema",
    "sim_spec",
]

#: How much of each user message and tool output the sim's answer quotes: what the
#: engine's compaction summary keeps of a tool output.
QUOTE_CHARS: Final = SUMMARY_HEAD_CHARS
#: The sim's answer lists the tool outputs it read after these words
#: (:meth:`SimSampler._summary`); a user message carrying them hands back a
#: summary the sim wrote, or one a compaction folded (see :func:`calls_made`).
_READ_OUTPUTS: Final = READ_OUTPUTS
_HANDED_BACK: Final = HANDED_BACK
#: The ranges of the ``sim_*`` metadata keys (inclusive; the smallest is 0).
MAX_SIM_TOOL_CALLS: Final = 1024
MAX_SIM_PARALLEL_CALLS: Final = 128
MAX_SIM_OUTPUT_TOKENS: Final = 2_000_000
#: Decode speed: 0 (unthrottled), or from 1 token/s up to this (as the flag).
MAX_SIM_TOKENS_PER_SECOND: Final = RANGES["sim_tokens_per_second"].high
#: Time to first token, milliseconds: ten minutes (as the flag).
MAX_SIM_TTFT_MS: Final = RANGES["sim_ttft_ms"].high
#: Generation that has not waited for this long gives the event loop a turn.
SIM_YIELD_SECONDS: Final = 0.0005
#: The random decimal digits of a call id (:func:`_call_id`).
_CALL_ID_DIGITS: Final = 24


# --- the simulated model ----------------------------------------------------
def _out_of_range(key: str, value: str, what: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"metadata.{key} must be {what}, written as a string, not {value!r}.",
        code=ErrorCode.INVALID_VALUE,
        param=f"metadata.{key}",
    )


#: key -> largest value (the smallest is 0).
_INT_RANGES: Final[Mapping[str, int]] = {
    "sim_tool_calls": MAX_SIM_TOOL_CALLS,
    "sim_parallel_calls": MAX_SIM_PARALLEL_CALLS,
    "sim_output_tokens": MAX_SIM_OUTPUT_TOKENS,
}
#: key -> (smallest non-zero value, largest value); 0 is always accepted.
_FLOAT_RANGES: Final[Mapping[str, tuple[float, float]]] = {
    "sim_tokens_per_second": (1.0, MAX_SIM_TOKENS_PER_SECOND),
    "sim_ttft_ms": (0.0, MAX_SIM_TTFT_MS),
}


def _int_meta(metadata: Mapping[str, str], key: str, default: int) -> int:
    """``metadata[key]`` as an integer in its range (raises ``invalid_value``)."""
    value = metadata.get(key)
    if value is None:
        return default
    high = _INT_RANGES[key]
    what = f"an integer from 0 to {high}"
    try:
        number = int(value)
    except ValueError:
        raise _out_of_range(key, value, what) from None
    if not 0 <= number <= high:
        raise _out_of_range(key, value, what)
    return number


def _float_meta(metadata: Mapping[str, str], key: str, default: float) -> float:
    """``metadata[key]`` as a finite number in its range, or 0 (raises ``invalid_value``)."""
    value = metadata.get(key)
    if value is None:
        return default
    low, high = _FLOAT_RANGES[key]
    what = f"a number from {low:g} to {high:g}" + (", or 0" if low > 0 else "")
    try:
        number = float(value)
    except ValueError:
        raise _out_of_range(key, value, what) from None
    if not (number == 0 or (math.isfinite(number) and low <= number <= high)):
        raise _out_of_range(key, value, what)
    return number


def check_sim_metadata(metadata: Mapping[str, str]) -> None:
    """Validate the ``sim_*`` metadata keys up front: each an integer or a finite
    number within its range. Raises :class:`RemoteProtocolError` ``invalid_value``
    with ``param`` ``metadata.<key>``; nothing else happens then."""
    for key in _INT_RANGES:
        _int_meta(metadata, key, 0)
    for key in _FLOAT_RANGES:
        _float_meta(metadata, key, 0.0)


def calls_made(context: Sequence[Item]) -> int:
    """The calls already made for the request the sim is answering: those since the
    last user message. A compaction window keeps the calls it summarized after the
    request they answer (the engine's summary), so they count. A client that
    compacts by itself (Codex with a provider other than OpenAI's) asks the model
    for a summary and sends the sim's answer back as the last user message: that
    message is no new request, and the tool outputs it lists count as made."""
    made = 0
    for item in reversed(context):
        if isinstance(item, Message) and item.role == "user":
            handed = _HANDED_BACK.search(item_text(item.content))
            return made + (int(handed.group(1)) if handed else 0)
        if isinstance(item, ClientCall | McpApprovalRequest):
            made += 1
        elif isinstance(item, McpCall) and not isinstance(item.approval_request_id, str):
            made += 1  # an approved call was counted as its approval request
    return made


def sim_spec(name: str, config: SimConfig) -> ModelSpec:
    """The simulated model served as ``name``: its window, its ``sim_*`` checks
    (:func:`check_sim_metadata`), and a :class:`SimSampler` for each rollout
    (it compacts with the engine's summary, as every model here does)."""
    return ModelSpec(
        name=name,
        context_window=config.context_window,
        max_output_tokens=128_000,
        make_sampler=lambda: SimSampler(config),
        check_request=check_sim_metadata,
    )


#: What a string field gets when its name says what it holds (a real agent
#: parses these: a command is run, a path is opened).
_PLAUSIBLE: Final[Mapping[str, str]] = {
    "cmd": "echo hello",
    "command": "echo hello",
    "commands": "echo hello",
    "script": "echo hello",
    "path": "README.md",
    "file": "README.md",
    "file_path": "README.md",
    "filename": "README.md",
    "dir": ".",
    "directory": ".",
    "workdir": ".",
    "cwd": ".",
    "root": ".",
    "url": "https://example.com/",
    "query": "hello",
    "pattern": "hello",
    "email": "user@example.com",
}


def _whole_number(schema: Mapping[str, Any], seed: int) -> int:
    """A whole number within the schema's bounds (a ``number`` field gets one too:
    parsers that read it as an unsigned integer accept it)."""
    low = schema.get("minimum", 0)
    if isinstance(schema.get("exclusiveMinimum"), int | float):
        low = max(low, math.floor(schema["exclusiveMinimum"]) + 1)
    value = max(0, math.ceil(low)) + seed
    step = schema.get("multipleOf")
    if isinstance(step, int) and step > 0:
        value = -(-value // step) * step
    high = schema.get("maximum")
    if isinstance(schema.get("exclusiveMaximum"), int | float):
        high = math.ceil(schema["exclusiveMaximum"]) - 1
    if isinstance(high, int | float) and value > high:
        value = max(math.ceil(low), math.floor(high))
    return int(value)


def _plausible_string(schema: Mapping[str, Any], seed: int, name: str) -> str:
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and (example := pattern_example(pattern)) is not None:
        return example
    text = _PLAUSIBLE.get(name.lower(), f"{name}-{seed}")
    low, high = schema.get("minLength"), schema.get("maxLength")
    if isinstance(low, int) and len(text) < low:
        text = text.ljust(low, "x")
    if isinstance(high, int) and len(text) > high:
        text = text[:high]
    return text


class OutOfBudget(Exception):
    """The value a schema asks for costs more than the budget it was given."""


def example_for_schema(
    schema: Any, seed: int, name: str = "value", budget: int = DEFAULT_ANSWER_TOKENS
) -> Any:
    """A deterministic value that satisfies a (simple) JSON schema: every
    property given (required or not), enums respected, a whole number where a
    number is asked for, strings that look like what their field holds.

    The value costs at most ``budget`` (:class:`_Example` says how it is
    counted); one that would cost more raises :class:`OutOfBudget` before it
    is built, having built nothing larger than the budget."""
    return _Example(budget).value(schema, seed, name)


class _Example:
    """Builds :func:`example_for_schema`'s value, charging it to a budget of work.

    Every value costs one (an array or object too), a string one more per
    :data:`CHARS_PER_TOKEN` characters: about the tokens the value takes at
    least, so the budget is the Response's output budget. An array of
    ``minItems`` repeats one item: its cost is the item's times the count,
    charged (and refused) before the list exists, so nested ``minItems``
    multiply within the budget, never past it."""

    __slots__ = ("left",)

    def __init__(self, budget: int) -> None:
        self.left = budget

    def _afford(self, cost: int) -> None:
        if cost > self.left:
            raise OutOfBudget(f"the value costs more than the {self.left} left")

    def _charge(self, cost: int) -> None:
        self._afford(cost)
        self.left -= cost

    def value(self, schema: Any, seed: int, name: str) -> Any:
        self._charge(1)
        return self._value(schema, seed, name)

    def _value(self, schema: Any, seed: int, name: str) -> Any:
        if not isinstance(schema, dict):
            return self._string(f"{name}-{seed}")
        if schema.get("enum"):
            return schema["enum"][seed % len(schema["enum"])]
        if "const" in schema:
            return schema["const"]
        for key in ("anyOf", "oneOf"):
            if schema.get(key):  # the first branch is the value, charged once
                return self._value(schema[key][0], seed, name)
        kind = schema.get("type", "object" if "properties" in schema else "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind == "object":
            props = schema.get("properties") or {}
            return {key: self.value(sub, seed, key) for key, sub in props.items()}
        if kind == "array":
            return self._array(schema, seed, name)
        if kind in ("integer", "number"):
            return _whole_number(schema, seed)
        if kind == "boolean":
            return seed % 2 == 0
        if kind == "null":
            return None
        low = schema.get("minLength")
        if isinstance(low, int):  # padded to it: refused before the padding is made
            self._afford(low // CHARS_PER_TOKEN)
        return self._string(_plausible_string(schema, seed, name))

    def _array(self, schema: Mapping[str, Any], seed: int, name: str) -> list[Any]:
        low = schema.get("minItems")
        count = low if isinstance(low, int) and low > 1 else 1
        before = self.left
        value = self.value(schema.get("items", {}), seed, name)
        self._charge((before - self.left) * (count - 1))  # the other copies
        return [value] * count

    def _string(self, text: str) -> str:
        self._charge(len(text) // CHARS_PER_TOKEN)
        return text


@dataclasses.dataclass(frozen=True, slots=True)
class _Offer:
    """One tool the model may call: a function or custom tool (perhaps in a
    namespace), or a built-in client kind."""

    kind: CallKind
    name: str
    namespace: str | None = None
    tool: FunctionTool | CustomTool | None = None
    #: An MCP tool's input schema, from its server's listing.
    schema: Any = None


def _offers(tools: Sequence[Tool], context: Sequence[Item] = ()) -> list[_Offer]:
    """The client-executed tools, flattened (a namespace's tools each on their
    own), then the tools of every ``mcp`` server listed in ``context`` (its
    latest listing); the other hosted tools are never offered."""
    offers: list[_Offer] = []
    for label, listing in latest_listings(tools, context).items():
        for listed in listing.tools:
            offers.append(_Offer("mcp", listed.name, label, schema=listed.input_schema))
    for tool in tools:
        if isinstance(tool, FunctionTool):
            offers.append(_Offer("function", tool.name, tool=tool))
        elif isinstance(tool, CustomTool):
            offers.append(_Offer("custom", tool.name, tool=tool))
        elif isinstance(tool, NamespaceTool):
            for sub in tool.tools:
                kind: CallKind = "function" if isinstance(sub, FunctionTool) else "custom"
                offers.append(_Offer(kind, sub.name, tool.name, sub))
        elif isinstance(tool, LocalShellTool):
            offers.append(_Offer("local_shell", "local_shell"))
        elif isinstance(tool, ShellTool):
            offers.append(_Offer("shell", "shell"))
        elif isinstance(tool, ApplyPatchTool):
            offers.append(_Offer("apply_patch", "apply_patch"))
        elif isinstance(tool, ComputerTool | ComputerUsePreviewTool):
            offers.append(_Offer("computer", "computer"))
    return offers


def _chosen(offers: list[_Offer], choice: ToolChoice) -> tuple[list[_Offer], bool]:
    """The offers ``tool_choice`` leaves, and whether a call is forced. A choice
    naming a tool this model cannot call (a hosted one) leaves none."""
    if isinstance(choice, str):
        return offers, choice == "required"
    if isinstance(choice, ToolChoiceAllowed):
        allowed = [
            offer for offer in offers if any(_matches(offer, entry) for entry in choice.tools)
        ]
        return allowed, choice.mode == "required"
    if isinstance(choice, ToolChoiceMcp):  # a listed tool of that server (or that one)
        named = [
            o
            for o in offers
            if o.kind == "mcp"
            and o.namespace == choice.server_label
            and choice.name in (None, msgspec.UNSET, o.name)
        ]
        return named, True
    if isinstance(choice, ToolChoiceFunction | ToolChoiceCustom):
        kind = "function" if isinstance(choice, ToolChoiceFunction) else "custom"
        named = [o for o in offers if o.kind == kind and choice.name in (o.name, _full(o))]
        return named, True
    kinds = {
        ToolChoiceShell: "shell",
        ToolChoiceApplyPatch: "apply_patch",
        ToolChoiceComputer: "computer",
        ToolChoiceComputerUse: "computer",
        ToolChoiceComputerUsePreview: "computer",
    }
    wanted = kinds.get(type(choice))
    return [o for o in offers if o.kind == wanted], True


def _full(offer: _Offer) -> str:
    return f"{offer.namespace}.{offer.name}" if offer.namespace else offer.name


def _matches(offer: _Offer, entry: Mapping[str, Any]) -> bool:
    kind = entry.get("type")
    if kind in ("function", "custom"):
        return offer.kind == kind and entry.get("name") in (None, offer.name, _full(offer))
    if kind in ("computer", "computer_use_preview", "computer_use"):
        return offer.kind == "computer"
    if kind == "mcp":
        label, name = entry.get("server_label"), entry.get("name")
        return (
            offer.kind == "mcp" and label in (None, offer.namespace) and name in (None, offer.name)
        )
    if kind == "namespace":
        return (
            offer.kind != "mcp"
            and offer.namespace is not None
            and entry.get("name") in (None, offer.namespace)
        )
    return offer.kind == kind


def _call_input(offer: _Offer, seed: int, work: _Example) -> str:
    """What the model writes for a call of ``offer``: a function's JSON
    arguments, a custom tool's text (a regex grammar's example when one can be
    made), a harmless command, a small new file, a screenshot.

    Arguments made from a schema are charged to ``work``, the turn's budget
    for all its calls; raises :class:`OutOfBudget` when they would cost more
    than is left (nothing larger than what is left is built)."""
    tool = offer.tool
    if offer.kind == "mcp":
        schema = offer.schema if isinstance(offer.schema, dict) else {"type": "object"}
        return msgspec.json.encode(work.value(schema, seed, "value")).decode()
    if isinstance(tool, FunctionTool):
        schema = tool.parameters or {"type": "object"}
        return msgspec.json.encode(work.value(schema, seed, "value")).decode()
    if isinstance(tool, CustomTool):
        grammar = tool.format
        if isinstance(grammar, CustomGrammarFormat) and grammar.syntax == "regex":
            example = pattern_example(grammar.definition)
            if example is not None:
                return example
        return "hello"
    payload: dict[str, Any]
    if offer.kind == "local_shell":
        payload = {"type": "exec", "command": ["echo", "hello"], "env": {}}
    elif offer.kind == "shell":
        payload = {"commands": ["echo hello"]}
    elif offer.kind == "apply_patch":
        payload = {"type": "create_file", "path": f"hello-{seed}.txt", "diff": "+hello\n"}
    else:
        payload = {"type": "screenshot"}
    return msgspec.json.encode(payload).decode()


_FILLER: Final = (
    "The rollout kept its whole context in memory between tool calls, so each "
    "continuation cost only the new input. "
).split()


def _quote(text: str) -> str:
    return quote(text)


class SimSampler:
    """The deterministic simulated model (see the module docstring)."""

    def __init__(self, config: SimConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self.turns = 0
        #: Only a prefill rate reads the token counts before the first chunk
        #: (``longresponse.engine.counting``).
        self.counts_first = config.prefill_tokens_per_second > 0

    def _plan_calls(self, request: SampleRequest) -> list[tuple[_Offer, str | None]]:
        """The calls of this turn: each offered tool, and its scripted input (the
        server's ``--sim-call``; ``None``: made from the tool's schema or kind)."""
        if request.tool_choice == "none":
            return []
        tools, forced = _chosen(_offers(request.tools, request.context), request.tool_choice)
        if not tools:
            return []
        made = calls_made(request.context)
        wanted = _int_meta(request.metadata, "sim_tool_calls", self.config.tool_calls)
        remaining = wanted - made
        if forced:
            remaining = max(remaining, 1)  # forced: a call every turn, results or not
        if remaining <= 0:
            return []
        per_turn = _int_meta(request.metadata, "sim_parallel_calls", 1) or 1
        if not request.parallel_tool_calls:
            per_turn = 1
        count = min(per_turn, remaining)
        offered = {offer.name: offer for offer in tools}
        script = [(offered[name], args) for name, args in self.config.calls if name in offered]
        if script:
            return [script[(made + i) % len(script)] for i in range(count)]
        return [(tools[(made + i) % len(tools)], None) for i in range(count)]

    def _summary(self, request: SampleRequest) -> str:
        """The answer before its padding: every user message and tool output, quoted.
        A summary handed back (:func:`calls_made`) counts the outputs it lists: the
        count covers what the conversation read before it was compacted (by the
        client, or by the server past its budget), and its quotes are carried on."""
        asked: list[str] = []
        outputs: list[str] = []
        read = 0
        for item in request.context:
            if isinstance(item, Message) and item.role == "user":
                text = item_text(item.content)
                asked.append(_quote(text))
                if handed := _HANDED_BACK.search(text):  # its count covers what came before
                    read = int(handed.group(1))
                    outputs = carried_quotes(text)
            elif isinstance(item, CallOutput):
                read += 1
                text = output_text(item)
                outputs.append(f"[{answered_call_id(item)}] «{_quote(text)}»")
            elif isinstance(item, McpCall):
                read += 1
                text = item.output if isinstance(item.output, str) else "error"
                outputs.append(f"[{item.server_label}.{item.name}] «{_quote(text)}»")
            elif isinstance(item, McpApprovalResponse) and not item.approve:
                read += 1
                outputs.append(f"[{item.approval_request_id}] «not approved»")
        parts = ["You asked: " + " | ".join(f"«{a}»" for a in asked) + "."]
        if read:
            parts.append(_READ_OUTPUTS.format(count=read) + " ".join(outputs) + ".")
        return " ".join(parts)

    async def sample(self, request: SampleRequest) -> AsyncGenerator[SampleChunk, None]:
        self.turns += 1
        meta = request.metadata
        tps = _float_meta(meta, "sim_tokens_per_second", self.config.tokens_per_second)
        ttft = _float_meta(meta, "sim_ttft_ms", self.config.time_to_first_token * 1000) / 1000
        delay = ttft
        if self.config.prefill_tokens_per_second > 0:
            delay += request.uncached_tokens / self.config.prefill_tokens_per_second
        if delay > 0:
            await asyncio.sleep(delay)
        pacer = _Pacer(tps, self._clock)
        calls = self._plan_calls(request)
        budget = request.max_output_tokens
        if calls:
            seed = sum(isinstance(item, ClientCall) for item in request.context)
            work = _Example(DEFAULT_ANSWER_TOKENS if budget is None else budget)
            for offset, (offer, scripted) in enumerate(calls):
                try:
                    arguments = scripted or _call_input(offer, seed + offset, work)
                except OutOfBudget:  # the call would not fit: it is not started
                    yield Stop("max_output_tokens")
                    return
                if budget is not None:
                    budget -= len(encode(arguments))
                    if budget < 0:  # the call would not fit: it is not started
                        yield Stop("max_output_tokens")
                        return
                yield ToolCallStart(
                    call_id=_call_id(),
                    name=offer.name,
                    kind=offer.kind,
                    namespace=offer.namespace,
                )
                for start in range(0, len(arguments), 8):
                    await pacer.tick()
                    yield ArgumentsDelta(arguments[start : start + 8])
                yield ItemEnd()
            yield Stop("tool_calls")
            return
        if request.text_format is None or isinstance(request.text_format, FormatText):
            async for chunk in self._stream_text(request, pacer, budget):
                yield chunk
            return
        # JSON: built whole off the loop (never longer than the budget), then sliced.
        pieces, fits = await asyncio.to_thread(self._json_pieces, request, budget)
        for piece in pieces[:fits]:
            await pacer.tick()
            yield TextDelta(piece)
        yield ItemEnd(incomplete=fits < len(pieces))
        yield Stop("stop" if fits == len(pieces) else "max_output_tokens")

    async def _stream_text(
        self, request: SampleRequest, pacer: _Pacer, budget: int | None
    ) -> AsyncIterator[SampleChunk]:
        """The plain-text answer, word by word: the summary, then the padding made
        as it is read. Every word after the first starts with a space after a
        non-space, where the o200k pre-tokenizer starts a new piece, so the
        answer's tokens are the sum of its words' (the budget is exact)."""
        words = self._summary(request).split(" ")
        head = [words[0], *(" " + word for word in words[1:])]
        fits = len(head) if budget is None else _fit(head, budget)
        for piece in head[:fits]:
            await pacer.tick()
            yield TextDelta(piece)
        if fits < len(head):
            yield ItemEnd(incomplete=True)
            yield Stop("max_output_tokens")
            return
        left = None if budget is None else budget - len(encode("".join(head)))
        padding = _int_meta(request.metadata, "sim_output_tokens", 0) - len(head)
        for piece, tokens in _padding(padding):
            if left is not None:
                left -= tokens
                if left < 0:
                    yield ItemEnd(incomplete=True)
                    yield Stop("max_output_tokens")
                    return
            await pacer.tick()
            yield TextDelta(piece)
        yield ItemEnd()
        yield Stop("stop")

    def _json_pieces(self, request: SampleRequest, budget: int | None) -> tuple[list[str], int]:
        """The answer in JSON in 8-character slices, and how many of them fit the
        budget (run in a worker thread).

        Padding past the budget could never be sent (a word is a token at
        least), so the text is no longer than the budget allows; nor is the
        value (``answer_in_format`` charges it to the budget as it builds it).
        """
        text = self._summary(request)
        padding = _int_meta(request.metadata, "sim_output_tokens", 0) - len(text.split(" "))
        if budget is not None:
            padding = min(padding, budget)
        text = "".join([text, *(piece for piece, _ in _padding(padding))])
        encoded, whole = answer_in_format(request.text_format, text, budget)
        pieces = [encoded[start : start + 8] for start in range(0, len(encoded), 8)]
        fits = len(pieces) if budget is None else _fit(pieces, budget)
        if not whole:  # the budget ran out inside the value: never sent as complete
            fits = min(fits, len(pieces) - 1)
        return pieces, fits


@functools.cache
def _filler_pieces() -> tuple[tuple[str, int], ...]:
    """The padding's words, each with a space before it, and its token count."""
    return tuple((" " + word, len(encode(" " + word))) for word in _FILLER)


def _padding(count: int) -> Iterator[tuple[str, int]]:
    """``count`` filler words (made one at a time), each with its token count."""
    pieces = _filler_pieces()
    for index in range(max(0, count)):
        yield pieces[index % len(pieces)]


def _fit(pieces: list[str], budget: int) -> int:
    """How many of ``pieces``, from the start, encode to at most ``budget`` tokens."""
    if len(encode("".join(pieces))) <= budget:
        return len(pieces)
    fits, too_many = 0, len(pieces)
    while too_many - fits > 1:
        middle = (fits + too_many) // 2
        if len(encode("".join(pieces[:middle]))) <= budget:
            fits = middle
        else:
            too_many = middle
    return fits


def _call_id() -> str:
    """A fresh call id: ``call_`` and 24 random decimal digits (about 80 bits), so
    two responses never share one, even for the same context. Digits, not hex:
    o200k reads them three at a time, one token each, so every call id is the
    same number of tokens and the usage of a conversation that quotes them
    stays deterministic (hex ids would cost 13 to 28 tokens at random)."""
    return f"call_{secrets.randbelow(10**_CALL_ID_DIGITS):0{_CALL_ID_DIGITS}d}"


class _Pacer:
    """Spaces tokens ``1/tps`` apart without a sleep per token, and gives the
    event loop a turn at least every :data:`SIM_YIELD_SECONDS` even when
    unthrottled (or running behind), so a long answer never holds the loop."""

    __slots__ = ("_clock", "_interval", "_next", "_yielded")

    def __init__(self, tokens_per_second: float, clock: Callable[[], float]) -> None:
        self._interval = 1.0 / tokens_per_second if tokens_per_second > 0 else 0.0
        self._clock = clock
        self._next = clock()
        self._yielded = time.monotonic()

    async def tick(self) -> None:
        if self._interval:
            self._next += self._interval
            ahead = self._next - self._clock()
            if ahead > 0.001:
                await asyncio.sleep(ahead)
                self._yielded = time.monotonic()
                return
        now = time.monotonic()
        if now - self._yielded >= SIM_YIELD_SECONDS:
            await asyncio.sleep(0)
            self._yielded = time.monotonic()
