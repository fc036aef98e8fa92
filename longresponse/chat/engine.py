"""One chat completion: its prompt rendered and hashed, its sampler's chunks as chat chunks.

Theory of operation
-------------------
A chat completion is stateless: the request carries the whole conversation.
:func:`render_prompt` (pure; the server runs it in a worker thread) renders
the conversation's items with the same template and tokenizer as every
rollout (``longresponse.engine.render``: the tools' system segment, then one
segment per item) and hashes the prompt's full blocks for the prefix cache
(``longresponse.chat.prefix_cache``), in the API key owner's own chain.

:class:`ChatTurn` then runs the model's sampler over the items and turns its
chunks into ``chat.completion.chunk`` objects as they come, so a stream is
as fast as the model decodes:

- the first chunk's delta carries ``role: "assistant"`` (with the first
  text, or the first call);
- text becomes ``content`` deltas;
- a call is an index-based ``tool_calls`` delta: its first carries
  ``index``, ``id``, ``type`` and ``function.name`` with ``arguments: ""``,
  the later ones the same ``index`` and a piece of ``function.arguments``;
  parallel calls count ``index`` up from 0;
- the last chunk has an empty delta and ``finish_reason`` (``stop``,
  ``tool_calls``, or ``length`` when ``max_tokens`` cut the answer; calls
  forced by a named ``tool_choice`` end with ``stop``, as OpenAI's and
  vLLM's do), then,
  when ``stream_options.include_usage`` asked for it, one chunk with
  ``choices: []`` and ``usage`` (every chunk before it has ``usage: null``).
  Every chunk has ``system_fingerprint: null``, as the completion does.

A real engine's sampler (``longresponse.backends``) also gives its own
``Usage``, which the answer's ``usage`` reports instead of the estimate,
and its reasoning (``ReasoningDone``), sent as a ``reasoning_content``
delta and kept as the completion message's ``reasoning_content``, as vLLM
writes them.

The same turn, read to its end, is also the non-streaming answer
(:meth:`ChatTurn.completion`). Output tokens are counted as the Responses
path counts them (text as :class:`~longresponse.engine.stream.ItemText`,
each call's arguments encoded), so ``max_tokens`` and ``usage`` agree.
:meth:`ChatTurn.answer_items` are the items the next request will render
for this answer, which the server adds to the prefix cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Final, Literal

import msgspec

from protocol.items import FunctionCall, FunctionTool, Item, Message, OutputText, ToolChoiceFunction

from ..engine.render import encode, render_item, render_prefix
from ..engine.sampling import (
    ArgumentsDelta,
    ItemEnd,
    ReasoningDone,
    Sampler,
    SampleRequest,
    Stop,
    TextDelta,
    ToolCallStart,
    Usage,
)
from ..engine.stream import ItemText
from .prefix_cache import block_digests, cache_seed
from .wire import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatUsage,
    ChunkChoice,
    ChunkDelta,
    CompletionTokensDetails,
    FunctionCallDelta,
    PromptTokensDetails,
    ReplyFunction,
    ReplyMessage,
    ReplyToolCall,
    ToolCallDelta,
)

__all__ = ["ChatPrompt", "ChatTurn", "FinishReason", "render_prompt", "render_tokens"]

FinishReason = Literal["stop", "length", "tool_calls"]
_FINISH: Final[dict[str, FinishReason]] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "max_output_tokens": "length",
    "context_length_exceeded": "length",
}


@dataclasses.dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A conversation rendered: its tokens, the digests of their full blocks,
    and the seed of those digests (``cache_seed``: whose cache, which model)."""

    tokens: list[int]
    digests: list[bytes]
    seed: str


def render_tokens(items: Sequence[Item], tools: Sequence[FunctionTool]) -> list[int]:
    """A conversation's tokens as the simulated engine reads them (pure)."""
    tokens = render_prefix(None, tools)
    for item in items:
        tokens.extend(render_item(item))
    return tokens


def render_prompt(
    model: str, items: Sequence[Item], tools: Sequence[FunctionTool], *, owner: str = ""
) -> ChatPrompt:
    """Render and hash a conversation for ``owner`` (the API key's; pure: safe
    in a worker thread)."""
    tokens = render_tokens(items, tools)
    seed = cache_seed(owner, model)
    return ChatPrompt(tokens, block_digests(seed, tokens), seed)


class ChatTurn:
    """One completion on ``sampler`` (see the module docstring)."""

    def __init__(
        self,
        *,
        completion_id: str,
        created: int,
        model: str,
        sampler: Sampler,
        request: SampleRequest,
        include_usage: bool = False,
        prefilled: Callable[[], None] | None = None,
    ) -> None:
        self.completion_id = completion_id
        self.created = created
        self.model = model
        self._sampler = sampler
        self._request = request
        self._include_usage = include_usage
        self._prefilled = prefilled
        self._text = ItemText()
        self._has_text = False
        self._answer: str | None = None  # the whole text, once finished
        self._calls: list[ReplyToolCall] = []
        self._arguments: list[list[str]] = []  # each call's pieces, joined at the end
        self._reasoning: list[str] = []
        #: A real engine's own counts (a backend's ``Usage``), which ``usage`` reports.
        self._upstream: Usage | None = None
        self.completion_tokens = 0
        self.finish_reason: FinishReason | None = None

    @property
    def sample_request(self) -> SampleRequest:
        """What the sampler is asked: the context, and how much of it is cached."""
        return self._request

    @property
    def prompt_tokens(self) -> int:
        return self._request.cached_tokens + self._request.uncached_tokens

    def _chunk(self, delta: ChunkDelta, finish: FinishReason | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.completion_id,
            created=self.created,
            model=self.model,
            choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish)],
            usage=None if self._include_usage else msgspec.UNSET,
            system_fingerprint=None,
        )

    async def chunks(self) -> AsyncIterator[ChatCompletionChunk]:
        """The stream's chunks, as the sampler produces them; read it to the end
        before :meth:`completion`. Closing it early stops the sampler."""
        first = True
        samples = self._sampler.sample(self._request)
        try:
            async for sample in samples:
                if isinstance(sample, Usage):
                    self._upstream = sample
                    continue
                if first and self._prefilled is not None:
                    self._prefilled()
                role: Literal["assistant"] | None = "assistant" if first else None
                first = False
                if isinstance(sample, ReasoningDone):
                    self._reasoning.append(sample.text)
                    yield self._chunk(_delta(role, reasoning_content=sample.text))
                elif isinstance(sample, TextDelta):
                    self._text.add(sample.text)
                    self._has_text = True
                    yield self._chunk(_delta(role, content=sample.text))
                elif isinstance(sample, ToolCallStart):
                    index = len(self._calls)
                    self._calls.append(
                        ReplyToolCall(
                            id=sample.call_id,
                            function=ReplyFunction(name=sample.name, arguments=""),
                        )
                    )
                    self._arguments.append([])
                    start = ToolCallDelta(
                        index=index,
                        id=sample.call_id,
                        type="function",
                        function=FunctionCallDelta(name=sample.name, arguments=""),
                    )
                    yield self._chunk(_delta(role, tool_calls=[start]))
                elif isinstance(sample, ArgumentsDelta):
                    index = len(self._calls) - 1
                    self._arguments[index].append(sample.delta)
                    piece = ToolCallDelta(
                        index=index, function=FunctionCallDelta(arguments=sample.delta)
                    )
                    yield self._chunk(_delta(role, tool_calls=[piece]))
                elif isinstance(sample, ItemEnd):
                    if role is not None:  # an answer with nothing in it
                        yield self._chunk(_delta(role, content=""))
                elif isinstance(sample, Stop):
                    if role is not None:
                        yield self._chunk(_delta(role, content=""))
                    self._finish(self._reason(sample.reason))
                    yield self._chunk(ChunkDelta(), self.finish_reason)
                    if self._include_usage:
                        yield ChatCompletionChunk(
                            id=self.completion_id,
                            created=self.created,
                            model=self.model,
                            choices=[],
                            usage=self.usage(),
                            system_fingerprint=None,
                        )
                    return
        finally:
            await samples.aclose()

    def _reason(self, stop: str) -> FinishReason:
        """The chat ``finish_reason``: a call forced by a named ``tool_choice``
        ends with ``stop`` (as OpenAI and vLLM report it), other calls with
        ``tool_calls``."""
        reason = _FINISH[stop]
        if reason == "tool_calls" and isinstance(self._request.tool_choice, ToolChoiceFunction):
            return "stop"
        return reason

    def _finish(self, reason: FinishReason) -> None:
        if self._has_text:
            self._answer, text_tokens = self._text.finish()
        else:
            text_tokens = 0
        arguments = ["".join(pieces) for pieces in self._arguments]
        self.completion_tokens = text_tokens + sum(len(encode(a)) for a in arguments)
        self._calls = [
            ReplyToolCall(id=call.id, function=ReplyFunction(name=call.function.name, arguments=a))
            for call, a in zip(self._calls, arguments, strict=True)
        ]
        self.finish_reason = reason

    def usage(self) -> ChatUsage:
        if (upstream := self._upstream) is not None:  # the engine's own counts
            return ChatUsage(
                prompt_tokens=upstream.input_tokens,
                completion_tokens=upstream.output_tokens,
                total_tokens=upstream.input_tokens + upstream.output_tokens,
                prompt_tokens_details=PromptTokensDetails(cached_tokens=upstream.cached_tokens),
                completion_tokens_details=CompletionTokensDetails(
                    reasoning_tokens=upstream.reasoning_tokens
                ),
            )
        cached = self._request.cached_tokens
        return ChatUsage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
            completion_tokens_details=CompletionTokensDetails(reasoning_tokens=0),
        )

    def completion(self) -> ChatCompletion:
        """The whole answer, once :meth:`chunks` has been read to its end."""
        assert self.finish_reason is not None, "the turn has not finished"
        message = ReplyMessage(content=self._answer)
        if self._calls:
            message = ReplyMessage(content=message.content, tool_calls=list(self._calls))
        if self._reasoning:
            message = msgspec.structs.replace(message, reasoning_content="".join(self._reasoning))
        return ChatCompletion(
            id=self.completion_id,
            created=self.created,
            model=self.model,
            choices=[ChatChoice(index=0, message=message, finish_reason=self.finish_reason)],
            usage=self.usage(),
        )

    def answer_items(self) -> list[Item]:
        """The answer as the items a follow-up request renders for it."""
        items: list[Item] = []
        text = self._answer
        if text:
            items.append(Message(role="assistant", content=[OutputText(text=text)]))
        items.extend(
            FunctionCall(
                call_id=call.id, name=call.function.name, arguments=call.function.arguments
            )
            for call in self._calls
        )
        return items


def _delta(
    role: Literal["assistant"] | None,
    *,
    content: str | None = None,
    reasoning_content: str | None = None,
    tool_calls: list[ToolCallDelta] | None = None,
) -> ChunkDelta:
    fields: dict[str, object] = {}
    if role is not None:
        fields["role"] = role
    if content is not None:
        fields["content"] = content
    if reasoning_content is not None:
        fields["reasoning_content"] = reasoning_content
    if tool_calls is not None:
        fields["tool_calls"] = tool_calls
    return ChunkDelta(**fields)  # type: ignore[arg-type]
