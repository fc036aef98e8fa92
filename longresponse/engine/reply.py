"""Reply: one Response a rollout is writing, as its client sees it.

Theory of operation
-------------------
A :class:`~longresponse.engine.rollout.Rollout` holds a conversation; the
Responses it produces are Replies. In append mode one Reply spans the whole
rollout (one id, ``sequence_number`` and ``output_index`` counting across
pauses). In the shipped shape every segment is a Reply of its own, with its
own id, its own events from ``sequence_number`` 0, its own output and its own
usage.

A Reply owns a Response's identity (id, ``created_at``, the request fields
the Response object echoes, its lane), its :class:`StreamBuilder` and its
sink. It never sets its own state: it sends lifecycle events through the sink,
whose protocol ``Connection`` applies them to the response's track through
the one transition table, and it reads its state, pending calls and next
sequence number back from that track.

Where a turn ends in client tool calls, the Reply says so in its own shape
(:meth:`Reply.pause`, :meth:`Reply.resume`): append mode announces the pause
(``response.done``, ``requires_action``) and the resume
(``response.in_progress``); a shipped-shape Response that waits in place (the
multi-agent beta) stays ``in_progress`` and sends nothing while it waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec

from protocol import TERMINAL_STATES, Mode, ResponseState, ResponseTrack, Transition
from protocol.events import (
    PromptCacheOptions,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseInProgress,
    ResponseResumed,
    ServerEvent,
    TimingEvent,
)
from protocol.items import ClientCall, is_cut
from protocol.response import (
    ConversationRef,
    FormatText,
    IncompleteDetails,
    InputTokensDetails,
    OutputTokensDetails,
    PromptCacheSettings,
    ReasoningConfig,
    RequiredAction,
    Response,
    ResponseError,
    TextConfig,
    Usage,
)

from .classifier import Finding
from .stream import EventSink, StreamBuilder

__all__ = ["Reply", "TokenCounts"]


class TokenCounts:
    """The input tokens a rollout has processed so far, and of those the cached.

    Only the rollout adds to them; its Replies read them for their usage. (A Reply
    holds this, not the rollout, so a finished rollout is freed as soon as
    nothing names it, without waiting for the cycle collector.)
    """

    __slots__ = ("cached_tokens", "input_tokens")

    def __init__(self, input_tokens: int = 0, cached_tokens: int = 0) -> None:
        self.input_tokens = input_tokens
        self.cached_tokens = cached_tokens


class Reply:
    """One Response: its identity, its events and the protocol's record of its state."""

    def __init__(
        self,
        response_id: str,
        request: ResponseCreate,
        *,
        model: str,
        sink: EventSink,
        counts: TokenCounts,
        mode: Mode,
        stream_id: str | None = None,
        send_timing: bool = False,
    ) -> None:
        self.id = response_id
        self.request = request
        self.model = model
        self.sink = sink
        #: Append mode: ``required_action`` on a pause, ``response_id`` on every
        #: event, usage of the whole rollout. Otherwise the shipped shape.
        self.append = mode is Mode.APPEND
        self.stream_id = stream_id
        #: The client asked for ``responsesapi.websocket_timing`` events.
        self.wants_timing = send_timing
        self.created_at = int(time.time())
        self.builder = StreamBuilder(response_id, tag_response_id=self.append, stream_id=stream_id)
        self.error: ResponseError | None = None
        self.incomplete_reason: str | None = None
        #: What the classifier flagged in this Response's input (its metadata),
        #: from the verdicts on every input delivered to it.
        self.flags: dict[str, str] = {}
        self.verdicts: list[tuple[Finding, ...]] = []
        self._counts = counts
        #: The rollout's (input, cached) tokens when this Response began.
        self._usage_base = (counts.input_tokens, counts.cached_tokens)
        #: A real engine's count of the current sampling's output: (the output
        #: written before the sampling, the engine's count of its own).
        self._engine_output: tuple[int, int] | None = None

    # --- state, read from the protocol's track --------------------------------

    @property
    def track(self) -> ResponseTrack | None:
        return self.builder.track

    @property
    def state(self) -> ResponseState:
        track = self.builder.track
        return track.state if track is not None else ResponseState.IN_PROGRESS

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def calls_made(self) -> int:
        """Client tool calls this Response has made (a call cut short never ran)."""
        output = self.builder.output
        return sum(isinstance(item, ClientCall) and not is_cut(item) for item in output)

    @property
    def next_sequence(self) -> int:
        """The ``sequence_number`` the next event of this Response takes."""
        return self.builder.next_sequence

    @property
    def pending_calls(self) -> dict[str, str]:
        """Client tool calls of this Response still waiting for their outputs."""
        track = self.builder.track
        return track.pending_calls if track is not None else {}

    def restore(self, response: Response, sequence: int, output_tokens: int) -> None:
        """This Response goes on from a checkpoint (``Rollout.restore``): its output,
        its creation time and its usage so far are the checkpoint's, and its next
        event is numbered after ``sequence``, the checkpoint's last."""
        self.created_at = response.created_at
        self.builder.restore(response.output, output_tokens, sequence + 1)
        self._usage_base = (0, 0)  # the counts carried over are this Response's
        flagged = response.metadata or {}
        self.flags = {key: value for key, value in flagged.items() if key.startswith("secrets_")}

    def abandon(self) -> None:
        """Nobody is left to tell (the stream is gone): the response ends cancelled."""
        track = self.builder.track
        if track is not None and not track.terminal:
            track.machine.process(Transition.CANCEL)
            track.forget_calls()

    # --- the Response object --------------------------------------------------

    def snapshot(self, status: ResponseState | None = None) -> Response:
        """The Response object now, or as it will be once ``status`` is sent."""
        state = status or self.state
        req = self.request
        fields: dict[str, Any] = {}
        if state is ResponseState.REQUIRES_ACTION and self.append:
            fields["required_action"] = RequiredAction(call_ids=list(self.pending_calls))
        return Response(
            id=self.id,
            created_at=self.created_at,
            status=state.value,
            background=req.background is True,
            completed_at=int(time.time()) if state in TERMINAL_STATES else None,
            conversation=_conversation(req.conversation),
            error=self.error,
            frequency_penalty=_or(req.frequency_penalty, 0.0),
            incomplete_details=(
                IncompleteDetails(reason=self.incomplete_reason) if self.incomplete_reason else None
            ),
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            max_tool_calls=req.max_tool_calls,
            model=self.model,
            output=list(self.builder.output),
            parallel_tool_calls=req.parallel_tool_calls,
            presence_penalty=_or(req.presence_penalty, 0.0),
            previous_response_id=req.previous_response_id,
            prompt=req.prompt,
            prompt_cache_key=req.prompt_cache_key,
            prompt_cache_options=_prompt_cache(req.prompt_cache_options),
            prompt_cache_retention=req.prompt_cache_retention,
            reasoning=_reasoning(req.reasoning),
            safety_identifier=req.safety_identifier,
            store=req.store,
            temperature=_or(req.temperature, 1.0),
            text=_text(req.text),
            tool_choice=req.tool_choice,
            tools=list(req.tools),
            top_logprobs=_or(req.top_logprobs, 0),
            top_p=_or(req.top_p, 1.0),
            truncation=req.truncation or "disabled",
            usage=self.usage(),
            user=req.user,
            metadata=_with_flags(req.metadata, self.flags),
            **fields,
        )

    def usage(self) -> Usage:
        """This Response's usage: the rollout's counts since it began, its own output.

        Every input token the model reads is either cached (processed by an
        earlier turn) or written to the cache by this one (SPEC §8).
        """
        output = self.output_tokens()
        input_tokens = self._counts.input_tokens - self._usage_base[0]
        cached = self._counts.cached_tokens - self._usage_base[1]
        return Usage(
            input_tokens=input_tokens,
            input_tokens_details=InputTokensDetails(
                cached_tokens=cached, cache_write_tokens=input_tokens - cached
            ),
            output_tokens=output,
            output_tokens_details=OutputTokensDetails(),
            total_tokens=input_tokens + output,
        )

    def output_tokens(self) -> int:
        """The output tokens written so far: the builder's o200k count of each
        item as it ends, but for a sampling a real engine counted, the
        engine's count (:meth:`count_output`)."""
        if self._engine_output is None:
            return self.builder.output_tokens
        before, counted = self._engine_output
        return before + counted

    def count_output(self, before: int, counted: int) -> None:
        """A real engine counted ``counted`` tokens of the output of the sampling
        that began with ``before`` written. The count stands for the whole
        sampling, whatever its items add to the estimate when they end (an item
        cut short ends after the engine's stream did), until the next begins."""
        self._engine_output = (before, counted)

    def begin_output(self) -> int:
        """A sampling begins (the last one's items have all ended): the engine's
        count of the last one, if it gave one, replaces the estimate for good.
        The output tokens written so far."""
        if self._engine_output is not None:
            before, counted = self._engine_output
            self._engine_output = None
            self.builder.output_tokens = before + counted
        return self.builder.output_tokens

    # --- how it ends ------------------------------------------------------------

    def note_verdicts(
        self,
        verdicts: Sequence[tuple[Finding, ...]],
        flagged: Callable[[Sequence[tuple[Finding, ...]]], dict[str, str]],
    ) -> None:
        """Keep the classifier's ``verdicts`` on more of this Response's input; its
        metadata flags become ``flagged`` of all of them."""
        self.verdicts.extend(verdicts)
        self.flags = flagged(self.verdicts)

    def note_incomplete(self, reason: str | None) -> None:
        """Why the Response ends ``incomplete`` (``None``: it does not)."""
        self.incomplete_reason = reason

    def fail(self, error: ResponseError) -> None:
        """The ``error`` the Response reports once it ends ``failed``."""
        self.error = error

    # --- sending ----------------------------------------------------------------

    def push(self, event: ServerEvent) -> None:
        """Push one event now (the caller made room)."""
        self.sink.push(event)
        if self.builder.track is None and isinstance(event, ResponseCreated | ResponseResumed):
            self.builder.track = self.sink.track(self.id)

    def announce_created(self) -> None:
        """Send ``response.created`` now, without waiting (at admission).

        The protocol core learns the response exists in the order of the
        client's messages, so an append or cancel without ``response_id``
        that follows the create targets this response.
        """
        self.push(self.builder.lifecycle(ResponseCreated, self.snapshot()))

    async def announce(
        self, cls: Callable[..., ServerEvent], status: ResponseState | None = None
    ) -> Response:
        """Wait for room, then send a lifecycle event carrying ``status`` (no gap between).

        Returns the Response object the event carried.
        """
        await self.sink.room()
        response = self.snapshot(status)
        self.push(self.builder.lifecycle(cls, response))
        return response

    async def pause(self) -> bool:
        """A turn ended in client tool calls; True if that was announced.

        Append mode sends ``response.done`` with ``requires_action``; the
        shipped shape's Response waits in place, ``in_progress``, silently.
        """
        if not self.append:
            return False
        await self.announce(ResponseDone, ResponseState.REQUIRES_ACTION)
        return True

    async def resume(self) -> None:
        """Every pending call has its output: append mode announces ``in_progress``."""
        if self.append:
            await self.announce(ResponseInProgress, ResponseState.IN_PROGRESS)

    async def send_timing(self, metrics: dict[str, float]) -> None:
        """A ``responsesapi.websocket_timing`` event, if the client asked for them."""
        if not self.wants_timing:
            return
        await self.sink.room()
        self.sink.push(
            TimingEvent(
                timing_metrics=metrics,
                response_id=self.id,
                stream_id=self.stream_id if self.stream_id is not None else msgspec.UNSET,
            )
        )


_T = TypeVar("_T")


def _or(value: _T | None, default: _T) -> _T:
    return default if value is None else value


_PLAIN_TEXT = TextConfig(format=FormatText())


def _text(text: TextConfig | None) -> TextConfig:
    """The ``text`` a Response echoes: a format always, a verbosity when asked for."""
    if text is None:
        return _PLAIN_TEXT
    if text.format is not None and text.verbosity is not None:
        return text
    return TextConfig(
        format=text.format or FormatText(),
        verbosity=text.verbosity if text.verbosity is not None else msgspec.UNSET,
    )


def _reasoning(reasoning: ReasoningConfig | None) -> ReasoningConfig | None:
    """The ``reasoning`` a Response echoes: ``effort`` and ``summary`` (older spelling folded)."""
    if reasoning is None:
        return None
    summary = reasoning.summary
    if summary is None and isinstance(reasoning.generate_summary, str):
        summary = reasoning.generate_summary
    return ReasoningConfig(effort=reasoning.effort, summary=summary)


def _conversation(conversation: str | ConversationRef | None) -> ConversationRef | None:
    """The ``conversation`` a Response echoes: always ``{"id": …}``."""
    if isinstance(conversation, str):
        return ConversationRef(id=conversation)
    return conversation


def _prompt_cache(options: PromptCacheOptions | None) -> PromptCacheSettings | None:
    """The ``prompt_cache_options`` a Response echoes: mode and ttl in effect."""
    if options is None:
        return None
    return PromptCacheSettings(
        mode=options.mode or "implicit",
        ttl=options.ttl or "30m",
        comparison_response_id=options.comparison_response_id,
    )


#: Most ``metadata`` pairs a Response carries, as published.
MAX_METADATA_PAIRS = 16


def _with_flags(metadata: dict[str, str], flags: dict[str, str]) -> dict[str, str]:
    """The request's metadata plus the classifier's flags that fit in the published
    16 pairs (a flag replaces a client key of its name; one that does not fit is
    left out)."""
    merged = dict(metadata)
    for key, value in flags.items():
        if key in merged or len(merged) < MAX_METADATA_PAIRS:
            merged[key] = value
    return merged
