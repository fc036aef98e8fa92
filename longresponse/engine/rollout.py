"""Rollout: one whole agent rollout, its conversation and the methods that change it.

Theory of operation
-------------------
A Rollout owns the conversation: its config in effect (model, tools,
instructions, sampling params), its context (append-only items), its
rendered-token cache (append-only), its sampler (reusable across pauses), its
inbox, the counts of tokens processed, its turns' timings and where its
segments ended. It writes to one :class:`~longresponse.engine.reply.Reply` at
a time, the Response the client is reading; the Reply's state lives in the
protocol core.

Each of its other jobs has a home of its own, a collaborator that asks the
rollout to change the conversation through its methods:

- the model turns: :class:`~longresponse.engine.turn_loop.TurnLoop`
  (``engine/turn_loop.py``) runs :meth:`Rollout.turn` and
  :meth:`Rollout.run_turns`; at each sampling the rollout takes the new input
  in (:meth:`Rollout.begin_sampling`: pre-inference on the NEW items only,
  render + tokenize into the cache, the window and compaction) and the
  model's output (:meth:`Rollout.take_output`), and it pauses
  (:meth:`Rollout.pause`);
- the hosted-call loop: :class:`~longresponse.engine.hosted.HostedCalls`,
  made from the MCP host its owner gives each turn (:meth:`Rollout.attach`);
- the new input's count when it waits for the first output:
  :class:`~longresponse.engine.counting.DeferredCount`;
- where segments ended, and what a fork starts from:
  :class:`~longresponse.engine.boundary.Boundaries` (:meth:`Rollout.mark_boundary`,
  :meth:`Rollout.fork`).

Two drivers run turns:

- :meth:`Rollout.run`, the append-mode loop (an asyncio task owned by the
  session) around :meth:`Rollout.run_turns`: turn; if the model ended in client
  tool calls still unanswered, pause — send ``response.done`` with ``status:
  requires_action`` and await the inbox (with a pause timeout) — and when
  every pending call has its output, drain the inbox and turn again; with
  nothing new, complete. It always ends with exactly one terminal
  ``response.done`` unless the connection is gone (nobody is left to tell).
- :class:`~longresponse.engine.segment.Segment`, the shipped shape: one turn
  under a Reply of its own, ending at the first pause (or, multi-agent,
  ``run_turns`` under it: the Reply waits in place without a word).

One owner per piece of state: everything that changes a rollout's context,
tokens, counts, inbox, boundaries or sampler is a method of :class:`Rollout`,
in this module (``tests/test_layers.py`` checks that nothing else assigns
them, the collaborators above included). Input is **delivered** into the
inbox (:meth:`Rollout.deliver`, :meth:`Rollout.deliver_segment_input`) and
**drained** from it into the context by the turn that reads it. The helpers
it calls (``longresponse.engine.counting``, ``compaction``, ``failures``,
``boundary``) return values the rollout applies. The sampler is the
rollout's: it is made here and released here (:meth:`Rollout.close`,
:meth:`Rollout.release_replaced`). Its limits are an
:class:`~longresponse.engine.limits.EngineLimits`.

Invariant: ``tokens(history + new) == tokens(history) + tokens(render(new))``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from protocol import Mode, ResponseState
from protocol.events import (
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseInProgress,
    ResponseResumed,
)
from protocol.items import Item, as_items
from protocol.response import Response, ResponseError

from ..config import Switches
from .admission import Pipeline
from .boundary import Boundaries, Boundary, ForkStart, KnownPrefix
from .checkpoint import Checkpointing, RolloutCheckpoint, TakenOver
from .classifier import Verdict
from .compaction import (
    Compactor,
    Drained,
    ModelSummary,
    compact,
    compact_threshold,
    drain,
    instruction_tokens,
    model_summary,
    summarizes,
    summary_request,
    threshold_or_default,
)
from .counting import DeferredCount, may_defer
from .failures import (
    cut_to_window,
    failure,
    upstream_error_event,
)
from .hosted import HostedCalls, McpHost
from .limits import EngineLimits
from .render import TokenCache, render_prefix
from .reply import Reply, TokenCounts
from .sampling import (
    ItemEnd,
    ModelSpec,
    ReasoningDone,
    SampleChunk,
    Sampler,
    SampleRequest,
    TextDelta,
    ToolCallStart,
    UpstreamError,
    Usage,
    release,
)
from .stream import EventSink, StreamClosed
from .summary import SummaryBudget, budget
from .timing import TurnTiming
from .turn_loop import INCOMPLETE_STOPS, Keepalive, TurnInput, TurnLoop

__all__ = ["Boundary", "HeldInput", "Rollout"]


class HeldInput(Protocol):
    """What the owner of delivered input holds for it until the model takes it
    in (the serve layer's byte budget: ``longresponse.serve.input_budget``)."""

    def release(self) -> None:
        """The input is consumed, or never will be; called once or more."""


class Rollout:
    """One conversation and every change to it; it writes to one Reply at a time."""

    def __init__(
        self,
        *,
        request: ResponseCreate,
        model: ModelSpec,
        limits: EngineLimits,
        pipeline: Pipeline | None = None,
        resolve: Callable[[str], ModelSpec] | None = None,
        input_items: list[Item] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.pipeline = pipeline or Pipeline(Switches())
        #: Resolves a model name again every turn when resolution reuse is off.
        self.resolve_model = resolve
        #: The config in effect: the create's, or the latest segment's.
        self.request = request
        self.model = model
        self.sampler: Sampler = model.make_sampler()
        #: Samplers of models this rollout switched away from, not released yet.
        self._replaced: list[Sampler] = []
        #: The pause timeout, the per-Response caps and the keepalive interval.
        self.limits = limits
        self.clock = clock
        #: The Response being written now (set by :meth:`open_reply`).
        self.reply: Reply | None = None
        #: Classifier findings of every input item delivered, in arrival order
        #: (kept so later turns need not read those items again).
        self.verdicts: list[Verdict] = []
        #: Post-inference work of a finished append-mode rollout (usage ledger),
        #: run before its terminal event is sent; the serve layer gives it (:meth:`attach`).
        self.on_terminal: Callable[[Response], Awaitable[None]] | None = None
        #: Called with each finished turn's timing (the server's metrics).
        self.on_timing: Callable[[TurnTiming], None] | None = None
        #: Append mode with ``store: true``: makes each pause durable before the
        #: client hears of it (``longresponse.engine.checkpoint``).
        self.on_checkpoint: Checkpointing | None = None
        #: The checkpoint this rollout was taken up from (:meth:`restore`).
        self._resumed: RolloutCheckpoint | None = None
        #: Stage times measured at admission, for the next turn's timing.
        self._admission: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self.context: list[Item] = []
        self.tokens = TokenCache(render_prefix(request.instructions, request.tools))
        #: What the token cache's prefix was rendered from (instructions, tools).
        self._prefix_key: tuple[str | None, bytes] = (
            request.instructions,
            self.pipeline.tools_key(request.tools),
        )
        self._inbox: list[Item] = (
            list(input_items) if input_items is not None else as_items(request.input)
        )
        #: What is held for the input waiting in the inbox, released as it drains.
        self._inbox_holds: list[HeldInput] = []
        self._wakeup = asyncio.Event()
        self._resume_mark: float | None = clock()
        self._cancel_requested = False
        self._started = False
        #: The task running :meth:`run`; its owner, the session, hands it over (:meth:`adopt`).
        self.task: asyncio.Task[None] | None = None
        #: Input tokens processed so far, and of those the cached (shared with
        #: the Replies, which report usage from them).
        self.counts = TokenCounts()
        #: The append-mode Response is ending (post-inference under way): a
        #: cancel comes too late, and it no longer counts as live.
        self._finishing = False
        #: Tokens the model has already processed (its reusable prefix): what
        #: the next turn counts as ``cached_tokens``. Nothing on the first turn.
        self.model_seen = 0
        self.timings: list[TurnTiming] = []
        self._timed = 0  # timings already reported
        #: Where each finished shipped-shape segment ended (to continue or fork).
        self.boundaries = Boundaries()
        self.truncated = False
        self.rendered_seen = 0  # token cache counters already added to the pipeline's
        self.items_seen = 0
        #: A segment is running (the shipped shape); a second one must fork.
        self.busy = False
        #: A segment failed half-way; the context may hold a partial turn.
        self.broken = False
        #: Steering input waits for the running segment's successor: its turn
        #: stops at the next safe point (:meth:`steer`).
        self._steered = False
        #: Seals and opens compaction items for the rollout's owner (given by :meth:`attach`).
        self.compactor: Compactor | None = None
        self._waiting = False  # paused: awaiting the outputs of client calls
        #: This turn's new input: where it starts in the token cache, and its count,
        #: which may wait for the first output (``longresponse.engine.counting``).
        self.input_from = 0
        self._held: DeferredCount | None = None
        #: A real engine's own count of the context (its prompt and output) at the
        #: end of its last turn, with ours then; ``None`` since the context was
        #: last replaced. Compaction's threshold is checked against the larger
        #: count (:meth:`model_count`).
        self._model_mark: tuple[int, int] | None = None
        #: The engine's count of the turn being sampled (0: none yet).
        self._engine_turn = 0
        self._tokens_behind = False
        #: The hosted-call loop over the turn's ``mcp`` tools' servers
        #: (``engine/hosted.py``), made from the host the owner gives with its
        #: hooks (:meth:`attach`); ``None``: no mcp tool.
        self.hosted: HostedCalls | None = None
        #: The id of the conversation's first response: its affinity key's source
        #: (``longresponse.engine.sampling.affinity_key``), kept by forks and set
        #: by the serve layer for a chain hydrated from the store (:meth:`join_chain`).
        self.chain = ""

    def open_reply(
        self,
        response_id: str,
        sink: EventSink,
        *,
        mode: Mode,
        stream_id: str | None = None,
        send_timing: bool = False,
    ) -> Reply:
        """Start writing a new Response; the rollout's counts so far are not its usage."""
        if not self.chain:  # the conversation's first response
            self.chain = response_id
        self.reply = Reply(
            response_id,
            self.request,
            model=self.model.name,
            sink=sink,
            counts=self.counts,
            mode=mode,
            stream_id=stream_id,
            send_timing=send_timing,
        )
        return self.reply

    def join_chain(self, root: str) -> None:
        """This rollout continues the stored chain whose first response is ``root``
        (hydrated from the store): its turns keep that chain's affinity key."""
        if root:
            self.chain = root

    def attach(
        self,
        *,
        compactor: Compactor | None,
        on_timing: Callable[[TurnTiming], None] | None = None,
        on_terminal: Callable[[Response], Awaitable[None]] | None = None,
        mcp: McpHost | None = None,
        checkpoint: Checkpointing | None = None,
    ) -> None:
        """Take the owner's hooks for the turn about to start: its ``compactor``, the
        observer of finished turns' timing, (append mode) the post-inference work
        of the finished rollout and the checkpoint of each pause, and the
        request's MCP servers (``mcp``; replaced every turn: each request names
        its own). A hook given as ``None`` keeps the one in place."""
        self.compactor = compactor
        self.hosted = HostedCalls(mcp, self.clock) if mcp is not None else None
        if on_timing is not None:
            self.on_timing = on_timing
        if on_terminal is not None:
            self.on_terminal = on_terminal
        if checkpoint is not None:
            self.on_checkpoint = checkpoint

    def adopt(self, task: asyncio.Task[None]) -> None:
        """``task`` runs :meth:`run` (the session owns it); a cancel reaches it.

        Forgotten once done: a cancelled task keeps its ``CancelledError``,
        whose traceback holds the frames that ran this rollout, a cycle that
        only a full collection would free, with the rollout's input."""
        self.task = task
        task.add_done_callback(self._forget_task)

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        if self.task is task:
            self.task = None

    def _current(self) -> Reply:
        if self.reply is None:  # pragma: no cover - a serve-layer bug
            raise RuntimeError("the rollout has no Reply to write to")
        return self.reply

    # --- called by the serve layer (already checked by the protocol core) ----

    def deliver(self, items: list[Item], received_at: float, held: HeldInput | None = None) -> None:
        """Deliver appended items into the inbox; resume the loop if no call is
        pending any more. ``held`` is released when the items are drained (or the
        rollout is closed)."""
        self._inbox.extend(items)
        if held is not None:
            self._inbox_holds.append(held)
        if not self._current().pending_calls:
            paused = self._waiting or self.state is ResponseState.REQUIRES_ACTION
            if paused and self._resume_mark is None:
                self._resume_mark = received_at
            self._wakeup.set()

    def note_admission(
        self, verdicts: list[Verdict], *, decode: float, validate: float, classify: float
    ) -> None:
        """Keep an admission's verdicts and stage times (for the next turn).

        The Response's flags cover its own input: every admission of an
        append-mode rollout, or this segment's alone in the shipped shape.
        """
        self.verdicts.extend(verdicts)
        self._current().note_verdicts(verdicts, Pipeline.flagged)
        d, v, c = self._admission
        self._admission = (d + decode, v + validate, c + classify)

    def history(self) -> list[Item]:
        """Everything delivered so far: the context and what waits in the inbox."""
        return [*self.context, *self._inbox]

    def request_cancel(self) -> None:
        """End the rollout ``cancelled`` now, wherever its loop is waiting."""
        if self.terminal or self._cancel_requested:
            return
        self._cancel_requested = True
        # A task cancelled before its first step never runs a line of run();
        # one that has not started yet sees the flag there instead.
        if self.task is not None and self._started:
            self.task.cancel()

    @property
    def state(self) -> ResponseState:
        return self._current().state

    @property
    def terminal(self) -> bool:
        """Ended, or ending (its terminal event is on its way)."""
        return self._finishing or self._current().terminal

    @property
    def awaiting_input(self) -> bool:
        """Paused, waiting for client tool outputs or an append: no turn is running."""
        return self._waiting

    @property
    def reply_terminal(self) -> bool:
        """The current Response's terminal event has gone out."""
        return self._current().terminal

    @property
    def error(self) -> ResponseError | None:
        """Why the current Response failed, once it has."""
        return self._current().error

    def snapshot(self) -> Response:
        return self._current().snapshot()

    @property
    def nbytes(self) -> int:
        """Approximate memory held: tokens, the items (about as large again), and
        the boundaries (their prefixes, each distinct one once, and their Responses)."""
        return 2 * self.tokens.nbytes + 64 * len(self.context) + self.boundaries.nbytes

    # --- config --------------------------------------------------------------

    def configure(self, request: ResponseCreate, model: ModelSpec) -> bool:
        """Take a new request's config (a shipped-shape continuation); True if the
        token prefix changed, so nothing the model processed is a cache prefix."""
        self.request = request
        if model is not self.model:
            # Another model: nothing it could reuse, but the tokens are the
            # same (one tokenizer for every model here).
            self._switch_model(model)
            self.model_seen = 0
        # Clients resend instructions and tools every turn: compare their
        # encoding first, and render the prefix only when it changed.
        key = (request.instructions, self.pipeline.tools_key(request.tools))
        if key == self._prefix_key:
            return False
        self._prefix_key = key
        prefix = render_prefix(request.instructions, request.tools)
        if self.tokens.tokens[: self.tokens.prefix_length].tolist() == prefix:
            return False
        # The prefix is re-rendered and the items' tokens reused.
        self.tokens = self.tokens.rebase(prefix)
        self.model_seen = 0
        self._model_mark = None
        return True

    def _switch_model(self, model: ModelSpec) -> None:
        """Write with ``model`` from now on; the old sampler waits to be released."""
        self._replaced.append(self.sampler)
        self.model, self.sampler = model, model.make_sampler()

    def deliver_segment_input(self, items: list[Item], received_at: float) -> None:
        """Deliver the next Response's new input (a segment's), drained by its turn."""
        self._inbox = list(items)
        self._release_inbox()  # what waited there before is dropped
        self._resume_mark = received_at

    # --- the sampler's lifetime ------------------------------------------------

    async def release_replaced(self) -> None:
        """Release the samplers of models this rollout switched away from."""
        await self._release(current=False)

    async def close(self) -> None:
        """The rollout's owner is done with it: its sampler (and any it replaced)
        lets go of what it holds (an upstream socket). A sampler used again later
        reopens it. What is held for input still in the inbox is released."""
        self._release_inbox()
        await self._release(current=True)

    async def _release(self, *, current: bool) -> None:
        """The one place a sampler is released (``longresponse.engine.sampling.release``)."""
        samplers, self._replaced = self._replaced, []
        if current:
            samplers.append(self.sampler)
        for sampler in samplers:
            await release(sampler)

    # --- the shipped shape: segments, boundaries, forks --------------------------

    def enter_segment(self) -> None:
        """A segment starts running on this rollout (a second one must fork)."""
        self.busy = True
        self._steered = False

    def steer(self) -> None:
        """Steering input waits for the running segment's successor (the shipped
        ``response.steer``): the turn stops at its next safe point, before an
        output item opens or right after one ends, while no client call of the
        segment is pending; it returns the stop ``steered``. Append mode's
        steering needs no stop: its input is delivered (:meth:`deliver`) and
        taken in at the next boundary."""
        self._steered = True

    def steer_now(self, reply: Reply, chunk: SampleChunk | None) -> bool:
        """At a safe point with steering input waiting: before ``chunk`` opens an
        item (``None``: right after one ended), with no call pending."""
        if not self._steered or reply.builder.item_open or reply.pending_calls:
            return False
        return chunk is None or isinstance(chunk, TextDelta | ToolCallStart | ReasoningDone)

    def leave_segment(self, *, failed: bool) -> None:
        """The running segment is over; ``failed``: it broke off half-way, and the
        context may hold a partial turn (no continuation in place any more)."""
        if failed:
            self.broken = True
        self.busy = False

    def mark_boundary(
        self,
        segment_id: str,
        *,
        pending: dict[str, str],
        response: Response,
        stream_id: str | None,
    ) -> Boundary:
        """Record where the segment ``segment_id`` ends now: its :class:`Boundary`."""
        return self.boundaries.mark(
            segment_id,
            items=len(self.context),
            tokens=self.tokens,
            pending=pending,
            response=response,
            stream_id=stream_id,
        )

    def fork(self, boundary: Boundary) -> Rollout:
        """A new Rollout holding this one's context up to ``boundary`` (shared prefix)."""
        start = self.boundaries.fork_at(
            boundary, context=self.context, tokens=self.tokens, model_seen=self.model_seen
        )
        child = Rollout(
            request=self.request,
            model=self.model,
            limits=self.limits,
            pipeline=self.pipeline,
            resolve=self.resolve_model,
            input_items=[],
            clock=self.clock,
        )
        child._start_from(start, chain=self.chain, counts=self.counts)
        return child

    def _start_from(self, start: ForkStart, *, chain: str, counts: TokenCounts) -> None:
        """A fresh fork takes its parent's conversation up to a boundary (``start``),
        its chain and a copy of its counts so far."""
        self.context = start.context
        self.chain = chain
        self.tokens = start.tokens
        self._prefix_key = (None, b"")  # unknown: the next segment compares the tokens
        self.boundaries = start.boundaries
        self.counts = TokenCounts(counts.input_tokens, counts.cached_tokens)
        self.model_seen = start.model_seen
        self._model_mark = None

    def seed(self, items: Sequence[Item], known: KnownPrefix) -> bool:
        """A fresh rollout starts from a conversation whose tokens are known
        (``longresponse.serve.prefix_reuse``): ``items`` are its context, the
        first ``known.items`` of the turn's input, and ``known.tokens`` their
        tokens, nothing rendered again. When the model and the token prefix
        they were read under are this rollout's, what the model processed of
        them counts as cached on the next turn (True), as a WebSocket chain's
        would; otherwise nothing does (False). Its turns keep the
        conversation's affinity key."""
        self.context = list(items)
        self.tokens.extend_tokens(known.tokens)
        self.join_chain(known.chain)
        prefix = self.tokens.tokens[: self.tokens.prefix_length]
        if known.model != self.model.name or prefix != known.prefix:
            return False
        self.model_seen = self.tokens.prefix_length + min(known.seen, len(known.tokens))
        return True

    def prefill(self, *, prefix_changed: bool) -> None:
        """A warm-up: render, tokenize and prefill the inbox without sampling; the
        next turn reads it all as cached. Raises :class:`ContextLengthExceeded`."""
        new_items = self._drain_inbox().items
        self.context.extend(new_items)
        cached = 0 if prefix_changed else min(self.model_seen, len(self.tokens))
        self.tokens.extend(new_items)
        if self._fit_window():
            cached = 0
        self.counts.input_tokens += len(self.tokens)
        self.counts.cached_tokens += cached
        self.model_seen = len(self.tokens)

    def note_post_inference(self, seconds: float) -> None:
        """Post-inference work took ``seconds`` after the last turn (its timing says so)."""
        if self.timings:
            self.timings[-1].post_inference += seconds

    # --- the loop ------------------------------------------------------------

    async def run(self) -> None:
        """The append-mode loop. Cancelled from outside only when the connection is gone."""
        self._started = True
        reply = self._current()
        try:
            if self._cancel_requested:
                await self.finish(ResponseState.CANCELLED)
                return
            if self._resumed is not None:
                if not await self._take_up(reply, self._resumed):
                    reply.note_incomplete("pause_timeout")
                    await self.finish(ResponseState.INCOMPLETE)
                    return
            else:
                if reply.track is None:
                    await reply.announce(ResponseCreated)
                # Taken up from here, the first turn runs again (a rollout cut
                # off before its first pause is not lost with its connection).
                await self._checkpoint(reply, ResponseState.IN_PROGRESS)
                await reply.announce(ResponseInProgress)
            stop = await self.run_turns()
            reply.note_incomplete(stop if stop in INCOMPLETE_STOPS else None)
            await self.finish(
                ResponseState.INCOMPLETE if reply.incomplete_reason else ResponseState.COMPLETED
            )
        except asyncio.CancelledError:
            # No local names the task: a cancelled task keeps its error, whose
            # traceback holds this frame, and the frame would hold the task.
            if self._cancel_requested and _uncancelled():
                # Our own client asked (response.cancel): what the turn streamed
                # stays in the Response, its open item cut short, and is billed.
                await self.cut_short(reply, None)
                await self.finish(ResponseState.CANCELLED)
                return
            reply.abandon()  # the connection is gone
            raise
        except StreamClosed:
            reply.abandon()  # nobody is left to tell
            raise
        except TakenOver:
            reply.abandon()  # another connection holds it now: not a word more here
        except Exception as exc:
            reply.fail(failure(exc, reply.id))
            with contextlib.suppress(Exception):
                await self.finish(ResponseState.FAILED)

    async def run_turns(self, *, prefix_changed: bool = False) -> str:
        """Turns, pausing in place for client tool outputs, until the model stops
        with nothing pending: the last stop reason, or ``pause_timeout``
        (:meth:`TurnLoop.run_turns <longresponse.engine.turn_loop.TurnLoop.run_turns>`)."""
        return await TurnLoop(self).run_turns(self._current(), prefix_changed=prefix_changed)

    async def turn(self, *, prefix_changed: bool = False) -> str:
        """One run of the model over the context plus whatever is in the inbox, its
        events to the current Reply; the sampler's stop reason. With
        ``prefix_changed`` nothing counts as cached (:meth:`TurnLoop.turn
        <longresponse.engine.turn_loop.TurnLoop.turn>`)."""
        return await TurnLoop(self).turn(self._current(), prefix_changed=prefix_changed)

    # --- one sampling's steps, as the turn loop takes them ------------------------

    @property
    def has_input(self) -> bool:
        """Input waits in the inbox for the next turn."""
        return bool(self._inbox)

    async def begin_sampling(self, reply: Reply, *, prefix_changed: bool) -> TurnInput | None:
        """Pre-inference before one sampling: the model resolved again if asked, the
        inbox drained into the context (with the hosted listings and approved calls,
        whose events go to ``reply``), and the new input held, then counted now or
        after the first output. ``None``: it asked for a compaction, which was the
        turn's output (its timing is kept). Raises :class:`ContextLengthExceeded`."""
        timing = self._start_timing()
        started = self.clock()
        self._resolve_again()
        resolved = self.clock()
        taken, new_items, hosting = await self._take_input(reply, timing)
        started, resolved = started + hosting, resolved + hosting
        cached = 0 if prefix_changed else min(self.model_seen, len(self.tokens))
        threshold = compact_threshold(self.request, self.model.context_window)
        held = self._hold_input(
            new_items, trigger=taken.trigger, threshold=threshold, timing=timing, cached=cached
        )
        if held.pending:  # counted after the first output (it cannot reach the window)
            rendered = self.clock()
            uncached = held.bound - cached
        else:  # tokenizing first: queued events go out before it (untimed)
            waited = self.clock()
            await asyncio.sleep(0)
            waited = self.clock() - waited
            started, resolved = started + waited, resolved + waited
            added = await self.tokenize_input_stepwise()
            rendered = self.clock()
            self.note_rendering()
            counted = await self._count_now(reply, timing, taken, threshold, cached, added)
            if counted is None:
                return None
            cached, uncached = counted
        resumed_at, self._resume_mark = self._resume_mark, None
        return TurnInput(timing, held, cached, uncached, started, resolved, rendered, resumed_at)

    async def _take_input(
        self, reply: Reply, timing: TurnTiming
    ) -> tuple[Drained, list[Item], float]:
        """Drain the inbox into the context, then what the hosted tools add before the
        model samples (listings, approved calls: new input too, their events to
        ``reply``): the drained input, the turn's new items, and the seconds the
        hosted calls took (a phase of their own, not pre-inference)."""
        taken = self._drain_inbox()
        self.context.extend(taken.items)
        # Their tokens join the cache once the hosted calls are done (:meth:`_hold_input`).
        self._tokens_behind = True
        if self.hosted is None:
            return taken, taken.items, 0.0
        hosting = self.clock()
        hosted = await self.hosted.before_sampling(reply, self.context, taken.items)
        self.context.extend(hosted)
        hosting = self.clock() - hosting
        timing.hosted += hosting
        return taken, [*taken.items, *hosted], hosting

    async def _count_now(
        self,
        reply: Reply,
        timing: TurnTiming,
        taken: Drained,
        threshold: int | None,
        cached: int,
        added: int,
    ) -> tuple[int, int] | None:
        """The tokenized input (``added`` tokens new) against the compaction threshold
        and the window, then counted: the turn's cached and uncached tokens. ``None``:
        a compaction turn, its compaction item its output (its timing kept)."""
        if taken.trigger or (threshold is not None and self._over_threshold(threshold)):
            await self._compact(reply, cached)
            cached = 0  # the model reads the new window afresh
            if taken.trigger:  # a compaction turn: the compaction item is its output
                self.timings.append(timing)
                return None
        if self._fit_window():
            cached = 0
        return cached, self.count_input(timing, cached, added)

    def _start_timing(self) -> TurnTiming:
        """A new sampling's timing, with the stage times admission measured for it."""
        timing = TurnTiming(turn=len(self.timings) + 1)
        timing.decode, timing.validate, timing.classify = self._admission
        self._admission = (0.0, 0.0, 0.0)
        return timing

    def _resolve_again(self) -> None:
        """Without resolution reuse: the model resolved again, the work a stateless
        server repeats every turn."""
        if not self.pipeline.switches.resolution_reuse and self.resolve_model is not None:
            model = self.resolve_model(self.model.name)
            if model is not self.model:  # pragma: no cover - the registry is stable
                self._switch_model(model)

    def take_output(self, produced: list[Item], timing: TurnTiming) -> None:
        """The model's own output joins the context and the token cache; it is not
        new input next turn (a real model already holds it). ``timing`` is kept,
        and the engine's count of the context, if it sent one."""
        self.context.extend(produced)
        self.tokens.extend(produced)
        self.rendered_seen = self.tokens.tokens_rendered
        self.items_seen = self.tokens.items_rendered
        self.model_seen = len(self.tokens)
        self.timings.append(timing)
        if self._engine_turn:
            self._model_mark = (len(self.tokens), self._engine_turn)
            self._engine_turn = 0

    def merge_timings(self, first: int) -> None:
        """The samplings since timing ``first`` are one turn's (a hosted call's
        sampling again): one timing."""
        if len(self.timings) > first + 1:
            self.timings[first].absorb(self.timings.pop())

    def _drain_inbox(self) -> Drained:
        """Drain the inbox as it joins the context; a compaction item in it replaces
        the context."""
        taken, self._inbox = drain(self._inbox, self.compactor), []
        self._release_inbox()
        if taken.replaces:
            self._start_window()
        return taken

    def _release_inbox(self) -> None:
        """The input held for the inbox is taken in (or dropped): release its holds."""
        holds, self._inbox_holds = self._inbox_holds, []
        for held in holds:
            held.release()

    # --- counting a turn's new input (``longresponse.engine.counting``) ----------

    def _hold_input(
        self,
        items: list[Item],
        *,
        trigger: bool,
        threshold: int | None,
        timing: TurnTiming,
        cached: int,
    ) -> DeferredCount:
        """Hold the turn's new ``items`` in the token cache and decide whether their count
        can wait: the count, pending if it does, and its bound, the context's tokens at
        most (0 without the token cache, whose ablation renders everything again:
        :meth:`_rerender`). ``timing`` and ``cached`` are the turn's."""
        bound, pending = 0, False
        if self.pipeline.switches.token_cache:
            self.input_from = len(self.tokens)
            bound = self.input_from + self.tokens.defer(items)
            pending = not trigger and may_defer(
                self.sampler, self.model_count(bound), self.model.context_window, threshold
            )
        self._held = DeferredCount(
            bound=bound, pending=pending, timing=timing, cached=cached, clock=self.clock
        )
        self._tokens_behind = False
        return self._held

    @property
    def tokens_match_context(self) -> bool:
        """The token cache holds every item of the context (not so while a turn's
        input has joined the context and waits for the hosted calls before its
        tokens join the cache, or when that wait was cut short)."""
        return not self._tokens_behind

    @property
    def uncounted(self) -> bool:
        """The turn's new input waits in the token cache, not counted yet."""
        return self._held is not None and self._held.pending

    def tokenize_input(self) -> int:
        """Tokenize the input :meth:`_hold_input` held (without the token cache: the
        whole context, :meth:`_rerender`); the tokens it added, counted from the cache's
        length (so a reader that tokenized the cache first changes nothing)."""
        if not self.pipeline.switches.token_cache:
            return self._rerender()
        self.tokens.tokenize_deferred()
        return len(self.tokens) - self.input_from

    async def tokenize_input_stepwise(self) -> int:
        """:meth:`tokenize_input`, giving the event loop a turn after every piece
        of the text (about 2 ms of tokenizing): a 15 MB input held every other
        client about 0.5 s at once."""
        if not self.pipeline.switches.token_cache:
            return self._rerender()
        for _ in self.tokens.tokenizing():
            await asyncio.sleep(0)
        return len(self.tokens) - self.input_from

    def count_input(self, timing: TurnTiming, cached: int, added: int) -> int:
        """Count the turn's input (``added`` tokens of it new); its uncached tokens."""
        total = len(self.tokens)
        self.counts.input_tokens += total
        self.counts.cached_tokens += cached
        timing.new_tokens, timing.cached_tokens, timing.input_tokens = added, cached, total
        return total - cached

    def _rerender(self) -> int:
        """Without the token cache (the ablation): the whole context rendered and
        tokenized again, as a stateless server must; the tokens added."""
        before = len(self.tokens)
        prefix = render_prefix(self.request.instructions, self.request.tools)
        self.tokens = self.tokens.rerendered(prefix, self.context)
        return len(self.tokens) - before

    def note_rendering(self) -> None:
        """Add the token cache's new rendering work to the pipeline's counters."""
        counters, tokens = self.pipeline.counters, self.tokens
        counters.tokens_rendered += tokens.tokens_rendered - self.rendered_seen
        counters.items_rendered += tokens.items_rendered - self.items_seen
        self.rendered_seen, self.items_seen = tokens.tokens_rendered, tokens.items_rendered

    def bill_upstream(self, counted: Usage, billed: tuple[int, int]) -> None:
        """Replace the (input, cached) tokens ``billed`` for this turn so far (the
        estimate, or the engine's earlier count) with the engine's own (a real
        backend's :class:`~longresponse.engine.sampling.Usage`), which is also
        its count of the context so far (:meth:`model_count`)."""
        input_tokens, cached = billed
        self.counts.input_tokens += counted.input_tokens - input_tokens
        self.counts.cached_tokens += counted.cached_tokens - cached
        self._engine_turn = counted.input_tokens + counted.output_tokens

    def _model_scale(self) -> float:
        """How many tokens the engine counted for each of ours in the context at the
        end of its last turn (its template, its tokenizer), at least 1; 1 without a
        count."""
        if self._model_mark is None:
            return 1.0
        ours, engines = self._model_mark
        return max(1.0, engines / ours) if ours else 1.0

    def model_count(self, tokens: int | None = None) -> int:
        """The context's tokens (or ``tokens`` of ours) as the model counts them:
        ours, scaled by what the engine counted for each of ours at its last turn
        (a real engine's template and tokenizer, which count more); ours alone
        for a model that sends no count (the simulated ones) or before its first
        count since the context was replaced. Compaction's threshold is checked
        against it (SPEC §11.4)."""
        ours = len(self.tokens) if tokens is None else tokens
        return math.ceil(ours * self._model_scale())

    # --- the window: truncation and compaction ---------------------------------------

    def _fit_window(self) -> bool:
        """History + new tokens against the model's window (shipped ``truncation``
        rules, :func:`~longresponse.engine.failures.cut_to_window`): True if the
        oldest items were dropped (the rest is rendered again; the model has to
        prefill it all). Raises :class:`ContextLengthExceeded`, changing nothing."""
        cut = cut_to_window(self.model, self.request, len(self.tokens), self.context)
        if cut is None:
            return False
        prefix, dropped = cut
        del self.context[:dropped]
        self.tokens = self.tokens.rerendered(prefix, self.context)
        self.model_seen = 0
        self._model_mark = None
        self.truncated = True
        return True

    def _start_window(self) -> None:
        """Forget the context (a compaction's window replaces it): the model has read
        none of what follows, and no segment ends inside it any more."""
        self.context = []
        prefix = render_prefix(self.request.instructions, self.request.tools)
        self.tokens = self.tokens.rerendered(prefix, [])
        self.model_seen = 0
        self._model_mark = None
        self.boundaries.clear()

    def _over_threshold(self, threshold: int) -> bool:
        """The context, as the model counts it (:meth:`model_count`), passes
        ``threshold``: with the instruction of the summary turn that reads it
        after the context, for a model that writes its own summary, so that no
        prompt its engine gets passes the threshold by more than one turn."""
        count = self.model_count()
        if summarizes(self.sampler):
            count += self.model_count(instruction_tokens(self.summary_budget()))
        return count > threshold

    def summary_budget(self) -> SummaryBudget:
        """What a compaction of this rollout may keep (``engine/summary.py``): drawn
        from its threshold (the request's, else 90% of the model's window), its
        prefix, and how many tokens its engine counts for each of ours."""
        threshold = threshold_or_default(self.request, self.model.context_window)
        return budget(threshold, self.tokens.prefix_length, self._model_scale())

    async def _compact(self, reply: Reply, cached: int) -> None:
        """Server-side compaction in a turn (SPEC §11): the model reads the whole
        context (``cached`` of it already processed) and writes the compaction
        item, within the window's budget (a real engine writes the summary's
        text in a summary turn first); its window becomes the context. The
        item's events go to ``reply``."""
        assert self.compactor is not None, "the serve layer gives every rollout a compactor"
        limit = self.summary_budget()
        written = await self._summary_turn(reply, limit, cached)
        await reply.sink.room()
        text = written.text if written is not None else None
        item, window = compact(self.context, self.compactor, self.model.summarize, limit, text)
        if written is not None and written.usage is not None:  # the engine's own count
            self.counts.input_tokens += written.usage.input_tokens
            self.counts.cached_tokens += written.usage.cached_tokens
        else:
            self.counts.input_tokens += len(self.tokens)
            self.counts.cached_tokens += cached
        self._start_window()
        self.tokens.extend(window)
        self.context.extend(window)
        for event in reply.builder.compaction(item):  # no await: all, or none
            reply.sink.push(event)

    async def _summary_turn(
        self, reply: Reply, limit: SummaryBudget, cached: int
    ) -> ModelSummary | None:
        """The model's own summary of the context within ``limit``, if its sampler
        writes one (``compaction.model_summary``); the client hears keepalives
        meanwhile, as in any turn."""
        turn = SampleRequest.for_turn(
            self.request,
            self.context,
            cached_tokens=cached,
            uncached_tokens=len(self.tokens) - cached,
            cap=self.limits.max_output_tokens,
            spent=reply.output_tokens(),
            chain=self.chain,
        )
        keepalive = Keepalive.start(reply, self.limits.keepalive_interval)
        try:
            return await model_summary(
                self.sampler,
                summary_request(turn, limit),
                model=self.model.name,
                response_id=reply.id,
            )
        finally:
            if keepalive is not None:
                keepalive.stop()

    async def cut_short(self, reply: Reply, unbilled: tuple[int, int] | None) -> None:
        """A turn the engine broke off, or the client cancelled: the item being
        written (if any) ends ``incomplete``, with the tokens it streamed counted.

        ``unbilled``: the turn's (input, cached) estimate, taken back when the
        engine produced nothing (a refused or unreachable request reads no tokens).
        """
        if unbilled is not None:
            self.counts.input_tokens -= unbilled[0]
            self.counts.cached_tokens -= unbilled[1]
        await reply.sink.room()
        for event in reply.builder.feed(ItemEnd(incomplete=True)):
            reply.sink.push(event)

    async def pause(self, failed: UpstreamError | None = None) -> bool:
        """Block until every pending call has its output (after an upstream failure with
        none pending, until an append comes, or not at all if one came meanwhile).
        False if the pause timed out."""
        reply = self._current()
        self._wakeup.clear()
        if failed is not None:
            await reply.sink.room()
            reply.push(upstream_error_event(failed, reply.id))
        elif reply.pending_calls:
            await self._checkpoint(reply, ResponseState.REQUIRES_ACTION)
        if await reply.pause():
            await self.report_timing()
        return await self._await_outputs(reply, failed)

    async def _await_outputs(self, reply: Reply, failed: UpstreamError | None = None) -> bool:
        """Block until every pending call has its output (see :meth:`pause`), then
        make that durable and announce the resume. False if the wait timed out."""
        self._waiting = True
        try:
            async with asyncio.timeout(self.limits.pause_timeout):
                if failed is not None and not reply.pending_calls and not self._inbox:
                    await self._wakeup.wait()
                while reply.pending_calls:
                    await self._wakeup.wait()
                    self._wakeup.clear()
        except TimeoutError:
            return False
        finally:
            self._waiting = False
        await self._checkpoint(reply, ResponseState.IN_PROGRESS)
        await reply.resume()
        await asyncio.sleep(0)  # the writer's turn: when many resume at once, each
        return True  # rollout's response.in_progress leaves before any turn runs

    # --- checkpoints (``longresponse.engine.checkpoint``) ---------------------------

    async def _checkpoint(self, reply: Reply, state: ResponseState) -> None:
        """Hand the owner's hook this rollout as the client is about to see it
        (``state``'s lifecycle event next); raises :class:`TakenOver` when the
        response was taken up elsewhere meanwhile."""
        if self.on_checkpoint is None or not reply.append:
            return
        await reply.sink.room()
        checkpoint = RolloutCheckpoint(
            response=reply.snapshot(state),
            sequence=reply.next_sequence,
            request=self.request,
            model=self.model.name,
            items=[*self.context, *self._inbox],
            context=len(self.context),
            input_tokens=self.counts.input_tokens,
            cached_tokens=self.counts.cached_tokens,
            output_tokens=reply.builder.output_tokens,
            model_seen=self.model_seen >= len(self.tokens),
            chain=self.chain,
        )
        if not await self.on_checkpoint(checkpoint):
            raise TakenOver(reply.id)

    def restore(self, checkpoint: RolloutCheckpoint) -> None:
        """A fresh rollout takes up ``checkpoint`` (its Reply is opened next, with
        the same id): the context rendered again, the input still waiting in the
        inbox, the counts so far. :meth:`run` then starts with ``response.resumed``."""
        self.context = list(checkpoint.items[: checkpoint.context])
        self._inbox = list(checkpoint.items[checkpoint.context :])
        self.tokens.extend(self.context)
        self.counts = TokenCounts(checkpoint.input_tokens, checkpoint.cached_tokens)
        self.model_seen = len(self.tokens) if checkpoint.model_seen else 0
        self.chain = checkpoint.chain
        self._resumed = checkpoint

    async def _take_up(self, reply: Reply, checkpoint: RolloutCheckpoint) -> bool:
        """A restored rollout's start: ``response.resumed``, then, where calls still
        wait, their outputs (False if that wait timed out)."""
        reply.restore(checkpoint.response, checkpoint.sequence, checkpoint.output_tokens)
        await reply.sink.room()
        # The checkpoint's own Response: its required_action names the calls
        # that wait (the protocol's record of them opens with this event).
        reply.push(reply.builder.lifecycle(ResponseResumed, checkpoint.response))
        if checkpoint.response.status == ResponseState.REQUIRES_ACTION.value:
            return await self._await_outputs(reply)
        return True

    async def finish(self, state: ResponseState) -> None:
        """End the append-mode Response with ``state``: post-inference, then ``response.done``."""
        reply = self._current()
        self._finishing = True
        await reply.sink.room()
        response = reply.snapshot(state)
        if self.on_terminal is not None:
            started = self.clock()
            await self.on_terminal(response)
            self.note_post_inference(self.clock() - started)
            await reply.sink.room()
        reply.push(reply.builder.lifecycle(ResponseDone, response))
        await self.report_timing()

    async def report_timing(self) -> None:
        """Report the finished turn: to the metrics, and as an event if asked for."""
        if not self.timings or self._timed >= len(self.timings):
            return
        self._timed = len(self.timings)
        if self.on_timing is not None:
            self.on_timing(self.timings[-1])
        await self._current().send_timing(self.timings[-1].as_metrics())


def _uncancelled() -> bool:
    """Whether the current task, asked to stop by its own rollout, has no
    other cancellation pending once that one is taken back."""
    task = asyncio.current_task()
    return task is not None and task.uncancel() == 0
