"""Starting a turn, the same way for every shape: append, shipped WebSocket, HTTP.

Theory of operation
-------------------
Whatever the transport, a request that starts model work goes through the
same steps. The request's own checks (``background``, the metadata its
model checks: the simulated model's ``sim_*`` keys) are each shape's, made
where its order of errors puts them. The rest is the engine's
(``longresponse.engine.turn``), in two calls that :meth:`Turns.start_turn`
makes one after the other, calling down only:
:func:`~longresponse.engine.turn.admit_turn` (the model, admission, the
rollout) with the server's pipeline, limits and models and the owner's
compactor; then, once the inspector has wrapped the transport's sink for the
admitted rollout, :func:`~longresponse.engine.turn.open_turn` (its Reply or
Segment) with that sink and the timing observer that feeds ``/metrics``
under the transport's label.

Admission's checks whose cost grows with what the client sent (a tool's
``parameters`` and a ``text.format`` schema against the JSON Schema
metaschema: about 0.4 ms a property, in pure Python; the secrets
classifier over a long text: 12 ms a MB of plain text, read in a child
process from 256 Ki characters on, ``scan_process``) run in a worker
thread before the turn starts: :meth:`Turns.settled` hands them to the
check workers (``fair_share.CheckWorkers``: threads and classifier children
shared round-robin between API keys, so one key's long reads do not hold
another key's short ones) and the pipeline keeps their verdicts (a
refusal too), which admission then finds decided. The interpreter hands
itself to a waiting thread every :data:`SWITCH_INTERVAL`, so the event loop,
and every other client, waits about that long at a time, not the whole
check. Every transport shares the kept verdicts.

After the turn, :meth:`Turns.bill` does the post-inference work of a finished
response (the usage ledger, the stored response, the metrics); a segment
that failed is billed and counted too, and never stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Final, TypeVar

from protocol import ErrorCode, RemoteProtocolError, ResponseState
from protocol.events import ResponseCreate
from protocol.items import Item, McpTool, Tool
from protocol.response import Response, ResponseError, TextFormat

from ..backends.registry import ModelRegistry
from ..config import ServerConfig
from ..engine.admission import HostedTools, Pipeline
from ..engine.checkpoint import Checkpointing
from ..engine.compaction import CompactionKey, Compactor
from ..engine.failures import TurnRefused
from ..engine.limits import EngineLimits
from ..engine.rollout import Boundary, Rollout
from ..engine.sampling import ModelSpec
from ..engine.stream import EventSink
from ..engine.timing import TurnTiming
from ..engine.turn import Started, admit_turn, open_turn, resolve_model, restore_turn
from ..hosted import McpInFlight, McpServers, check_mcp_tools, load_sdk, redact_mcp_tools
from ..ids import new_id
from ..storage.persistence import Persistence, StoreWriteFailed, stored_input_items
from ..storage.records import StoreError
from .checkpoints import Checkpoints
from .continuation import Continuation
from .conversations import Conversations, conversation_id_of
from .fair_share import AdmittingTurns, CheckWorkers
from .input_budget import InputBudget
from .inspector.observer import Inspector
from .inspector.records import RolloutRecord
from .metrics import ServerMetrics
from .prefix_reuse import PrefixReuse
from .scan_process import ScanProcess
from .transport import Transport

if TYPE_CHECKING:
    from ..hosted.pool import McpPool

__all__ = ["Caller", "StoreRefused", "Turns"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: The code of a parameter the server knows but cannot honour with the rest
#: of the request (``background: true`` with ``store: false``).
UNSUPPORTED_PARAMETER: Final = "unsupported_parameter"


class StoreRefused(TurnRefused):
    """The store failed a ``store=true`` write: the finished turn is never
    acknowledged as completed (the segment's ``exception``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Caller:
    """Who starts a turn and how it is answered: the transport (its ``/metrics``
    label and protocol mode), the sink its events go to, the key's owner, the
    lane, and the request's timing."""

    transport: Transport
    sink: EventSink
    owner: str = ""
    #: The shipped shape's lane (``stream_id``) the turn runs on.
    stream_id: str | None = None
    #: The client asked for ``responsesapi.websocket_timing`` events.
    send_timing: bool = False
    #: Seconds decoding the request took (the turn's timing).
    decode: float = 0.0
    #: Append mode: the rollout's post-inference work, before its terminal event.
    on_terminal: Callable[[Response], Awaitable[None]] | None = None
    #: Append mode with ``store: true``: the checkpoints of the response whose id
    #: it is given (``serve.checkpoints``).
    checkpoint: Callable[[str], Checkpointing] | None = None


class Turns:
    """The steps every shape shares (see the module docstring); one per server."""

    def __init__(
        self,
        config: ServerConfig,
        models: ModelRegistry,
        pipeline: Pipeline,
        *,
        metrics: ServerMetrics | None = None,
        persistence: Callable[[], Persistence] | None = None,
        compaction_key: Callable[[], CompactionKey] | None = None,
        inspector: Inspector | None = None,
    ) -> None:
        self.config = config
        #: What of ``config`` the engine reads (``longresponse.engine.limits``).
        self.limits = EngineLimits(
            pause_timeout=config.pause_timeout,
            max_events=config.max_response_events,
            max_output_tokens=config.max_response_output_tokens,
            keepalive_interval=config.keepalive_interval,
        )
        #: The inspector's observations (off unless the app gives one).
        self.inspector = inspector or Inspector(enabled=False)
        #: Bytes of input live responses hold, per key (``serve.input_budget``).
        self.input_budget = InputBudget(
            config.max_live_input_bytes, config.max_live_input_bytes_per_key
        )
        self.models = models
        self.pipeline = pipeline
        self.metrics = metrics
        self._persistence = persistence
        self._compaction_key = compaction_key
        #: The conversations rollouts held lately, for fresh rollouts to begin
        #: from (off with ``--no-prefix-reuse`` or the token cache switch).
        self.prefixes = PrefixReuse.configured(config) if pipeline.switches.token_cache else None
        #: Append-mode rollouts' checkpoints, in the same store.
        self.checkpoints = Checkpoints(lambda: self.persistence_or_fail, config.checkpoint_ttl)
        #: The Conversations API's conversations, in the same store.
        self.conversations = Conversations(lambda: self.persistence)
        #: The threads that run admission's costly checks, shared between keys.
        self.checker = CheckWorkers()
        #: Turns on the loop for a create's work before its model runs, per key.
        self.admitting = AdmittingTurns()
        #: Where the workers read very long texts with the secrets classifier.
        self.scanner = ScanProcess()
        #: The HTTP pool (and TLS context) of every MCP session: made now if the
        #: operator allowed an MCP host, not in a turn (``longresponse.hosted.pool``).
        self._mcp_pool: McpPool | None = load_sdk().McpPool() if config.mcp.allowed_hosts else None
        #: The MCP listings and calls running, in all and per key (``--mcp-max-in-flight*``).
        self.mcp_in_flight = McpInFlight(config.mcp)

    def mcp_pool(self) -> McpPool:
        """The pool of the MCP sessions (made now if it was not at start)."""
        if self._mcp_pool is None:
            self._mcp_pool = load_sdk().McpPool()
        return self._mcp_pool

    async def aclose_hosted(self) -> None:
        """Close the MCP sessions' connections (the server is stopping)."""
        if self._mcp_pool is not None:
            await self._mcp_pool.aclose()

    def close(self) -> None:
        """Stop the check workers (a check still waiting for one is dropped)."""
        self.checker.close()
        self.scanner.close()

    async def in_worker(self, work: Callable[..., _T], *args: object, owner: str) -> _T:
        """``work(*args)`` in a check worker, off the event loop, in ``owner``'s
        turn (pure work only: it must touch nothing the loop changes
        meanwhile). Raises what it raises."""
        return await self.checker.run(owner, work, *args)

    def settled(
        self, request: ResponseCreate, items: Sequence[Item] = (), *, owner: str
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """:meth:`settled_checks` for a create's tools and ``text.format``, and the
        ``items`` it will admit (its input, and the history it validates again).
        The tools are those admission checks: the ``mcp`` tools without their
        secrets (:meth:`start_turn`), so that it finds their verdict kept."""
        request, _ = redact_mcp_tools(request)
        text_format = request.text.format if request.text is not None else None
        return self.settled_checks(request.tools, text_format, items, owner=owner)

    @contextlib.asynccontextmanager
    async def settled_checks(
        self,
        tools: Sequence[Tool],
        text_format: TextFormat | None,
        items: Sequence[Item] = (),
        *,
        owner: str,
    ) -> AsyncIterator[None]:
        """Check ``tools`` and ``text_format``, and read the long texts of ``items``
        with the secrets classifier, in a worker thread in the turn of ``owner``
        (the API key's owner; ``""`` with keys off), unless the pipeline
        keeps their verdicts already (``Pipeline.settle``): admission inside
        the block finds them decided and runs nothing costly on the event loop.
        Never raises: a refusal is kept and raised by admission, where each
        transport turns it into its error. What was read ahead of ``items`` and
        not admitted is dropped when the block ends."""
        if not self.pipeline.settled(tools, text_format, items):
            read = functools.partial(self.scanner.scan, key=owner)
            await self.checker.run(owner, self.pipeline.settle, tools, text_format, items, read)
        try:
            yield
        finally:
            self.pipeline.forget(items)

    @property
    def persistence(self) -> Persistence | None:
        return self._persistence() if self._persistence is not None else None

    @property
    def persistence_or_fail(self) -> Persistence:
        """The store's persistence (a server always has one; raises without)."""
        persistence = self.persistence
        if persistence is None:  # pragma: no cover - an app without a store
            raise RuntimeError("this server has no store")
        return persistence

    def compactor(self, owner: str) -> Compactor | None:
        """``owner``'s compactor, once the server's compaction key is loaded."""
        if self._compaction_key is None:
            return None
        return Compactor(self._compaction_key(), owner)

    # --- the steps -------------------------------------------------------------

    def check_background(self, request: ResponseCreate, *, transport: Transport) -> None:
        """``background: true``: refused over WebSocket, as shipped; over HTTP it
        needs ``store=true`` (``unsupported_parameter``, param ``background``).
        Raises :class:`RemoteProtocolError`."""
        if not request.background:
            return
        if transport is not Transport.HTTP:
            raise RemoteProtocolError(
                "background responses are not supported over WebSocket.",
                code=ErrorCode.INVALID_VALUE,
                param="background",
            )
        if not request.store:
            raise RemoteProtocolError(
                "Background responses require store=true: their result is kept for polling.",
                code=UNSUPPORTED_PARAMETER,
                param="background",
            )

    def waits_in_place(self, request: ResponseCreate, *, beta: bool, transport: Transport) -> bool:
        """Whether ``request`` asks for a multi-agent Response (``multi_agent.enabled``),
        which waits in place for ``response.inject`` at client tool calls.

        Raises :class:`RemoteProtocolError` where it cannot be served: over
        HTTP, or on a WebSocket opened without the multi-agent beta (``beta``).
        """
        if request.multi_agent is None or not request.multi_agent.enabled:
            return False
        if transport is Transport.HTTP or not beta:
            where = (
                "over HTTP by this server (it waits for response.inject on a WebSocket)"
                if transport is Transport.HTTP
                else "without the header 'OpenAI-Beta: responses_multi_agent=v1' on the upgrade"
            )
            raise RemoteProtocolError(
                f"multi_agent is not available {where}.",
                code=ErrorCode.INVALID_VALUE,
                param="multi_agent",
            )
        return True

    def check_metadata(self, request: ResponseCreate, model: ModelSpec | None = None) -> None:
        """The request's ``metadata`` as its model checks it (the simulated model's
        ``sim_*`` keys; a real backend's model checks none). ``model`` is the
        model when the caller resolved it already; an unknown model is left to
        resolution to refuse. Raises :class:`RemoteProtocolError`."""
        if model is None:
            model = self.models.get(request.model if isinstance(request.model, str) else None)
        if model is not None and model.check_request is not None:
            model.check_request(request.metadata)

    def resolve(self, request: ResponseCreate, parent: Rollout | None = None) -> ModelSpec:
        """The request's model, reused from ``parent`` when the name is unchanged."""
        return resolve_model(
            request, pipeline=self.pipeline, resolve=self.models.resolve, parent=parent
        )

    def reuse_prefix(
        self, continuation: Continuation, new_items: Sequence[Item], *, owner: str
    ) -> None:
        """A turn that starts a new rollout (whose history, if any, comes from the
        store) takes the longest conversation ``owner``'s rollouts held lately
        that its history then ``new_items`` begin with: it is known
        (``continuation.known``), neither read nor rendered again."""
        if self.prefixes is None or continuation.rollout is not None:
            return
        items = [*continuation.history, *new_items]
        if len(items) > 1:
            continuation.begin_with(self.prefixes.find(owner, items))

    def start_turn(
        self,
        request: ResponseCreate,
        new_items: list[Item],
        caller: Caller,
        continuation: Continuation | None = None,
        *,
        model: ModelSpec | None = None,
        waits: bool = False,
    ) -> Started:
        """The engine's two steps with this server's pipeline, limits, models and
        the caller's owner's compactor, for ``request`` and its ``new_items``: a
        new response on ``continuation``'s rollout (a new one if none; its
        history checked again unless kept), or on a new rollout. Once admitted,
        the turn writes to the caller's sink as the inspector wraps it, and its
        timing goes to ``/metrics`` under the caller's transport. ``model``: the
        request's model when the caller resolved it already; ``waits``: a
        multi-agent segment that waits in place at client tool calls.
        Raises :class:`RemoteProtocolError`; nothing is accepted then.
        """
        found = continuation if continuation is not None else Continuation()
        transport, owner, response_id = caller.transport, caller.owner, new_id("resp")
        mode = transport.mode
        mcp: McpServers | None = None
        if any(isinstance(tool, McpTool) for tool in request.tools):
            if self.pipeline.hosted_tools is HostedTools.ACCEPT:
                check_mcp_tools(request.tools, self.config.mcp)
            # authorization and headers go to the MCP servers only, never further
            request, tools = redact_mcp_tools(request)
            mcp = McpServers(
                tools,
                self.config.mcp,
                self.mcp_pool(),
                schema_limits=self.config.schema_limits,
                in_worker=functools.partial(self.in_worker, owner=owner),
                in_flight=self.mcp_in_flight,
                owner=owner,
            )
        admitted = admit_turn(
            request,
            pipeline=self.pipeline,
            limits=self.limits,
            resolve=self.models.resolve,
            compactor=self.compactor(owner),
            new_items=new_items,
            mode=mode,
            history=found.checked,
            cached=found.cached,
            rollout=found.rollout,
            parent=found.parent,
            model=model,
            known=found.known.known if found.known is not None else None,
        )
        rollout = admitted.rollout
        if admitted.known and found.known is not None and self.prefixes is not None:
            self.prefixes.seeded(rollout, found.known)
        rollout.join_chain(found.chain)
        watched, seen = self.inspector.watch(rollout, request, response_id, caller.sink, owner)
        on_timing = None
        if self.metrics is not None or seen is not None or self.prefixes is not None:
            on_timing = self._timing_hook(transport, response_id, seen, rollout, owner)
        return open_turn(
            admitted,
            request,
            sink=watched,
            response_id=response_id,
            mode=mode,
            on_timing=on_timing,
            on_terminal=caller.on_terminal,
            stream_id=caller.stream_id,
            send_timing=caller.send_timing,
            decode=caller.decode,
            waits=waits,
            mcp=mcp,
            checkpoint=(
                caller.checkpoint(response_id)
                if caller.checkpoint is not None and request.store and mcp is None
                else None
            ),
        )

    async def take_up(self, response_id: str, caller: Caller) -> Started | None:
        """``response.resume``: the caller's owner's append-mode response
        ``response_id`` taken over from its checkpoint, restored on a fresh
        rollout that writes to the caller's sink (nothing runs yet); None when it
        has no checkpoint. Raises :class:`RemoteProtocolError` when its model is
        no longer served."""
        taken = await self.checkpoints.take(response_id, owner=caller.owner)
        if taken is None:
            return None
        checkpoint = taken.checkpoint
        model = self.models.resolve(checkpoint.model)
        started = restore_turn(
            checkpoint,
            model=model,
            pipeline=self.pipeline,
            limits=self.limits,
            resolve=self.models.resolve,
            compactor=self.compactor(caller.owner),
            sink=caller.sink,
            on_terminal=caller.on_terminal,
            send_timing=caller.send_timing,
            hook=taken.writer,
        )
        rollout = started.rollout
        if self.metrics is not None or self.prefixes is not None:
            # (the inspector does not watch a response taken up: it saw its start elsewhere)
            owner, transport = caller.owner, caller.transport
            on_timing = self._timing_hook(transport, response_id, None, rollout, owner)
            rollout.attach(compactor=rollout.compactor, on_timing=on_timing)
        return started

    def _timing_hook(
        self,
        transport: Transport,
        response_id: str,
        seen: RolloutRecord | None,
        rollout: Rollout,
        owner: str,
    ) -> Callable[[TurnTiming], None]:
        """Each finished turn: to ``/metrics``, to the inspector's timeline, and
        the rollout's context to the known prefixes."""
        metrics, prefixes = self.metrics, self.prefixes
        # Weakly: the rollout holds this hook, which must not keep it alive.
        held = weakref.ref(rollout)

        def on_timing(timing: TurnTiming) -> None:
            if metrics is not None:
                metrics.observe_turn(transport, timing)
            if seen is not None:
                seen.turn_ended(timing, response_id)
            rollout = held()
            if prefixes is not None and rollout is not None:
                prefixes.keep(rollout, owner=owner)

        return on_timing

    async def run_segment(
        self,
        started: Started,
        *,
        owner: str,
        transport: Transport,
        history: Sequence[Item] = (),
        received_at: float,
    ) -> Boundary | None:
        """Run a shipped-shape turn and bill it, finished or failed."""
        assert started.segment is not None

        # Where this response's own items begin in the rollout's context (after
        # any history a hydrated rollout drains first); the known prefix the
        # rollout took in already is not delivered again.
        start = len(started.rollout.context) - started.known + len(history)

        async def finished(response: Response) -> None:
            await self.acknowledge(
                started, response, owner=owner, transport=transport, context_from=start
            )

        delivered = [*history, *started.items][started.known :]
        boundary = await started.segment.run(delivered, received_at=received_at, on_finish=finished)
        if boundary is None:  # failed: still billed and counted, never stored
            failed = started.reply.snapshot(ResponseState.FAILED)
            await self.bill(failed, owner=owner, transport=transport)
        return boundary

    # --- post-inference ------------------------------------------------------------

    async def acknowledge(
        self,
        started: Started,
        response: Response,
        *,
        owner: str,
        transport: Transport,
        context_from: int | None = None,
        input_items: Sequence[Item] | None = None,
    ) -> None:
        """Bill a finished shipped-shape response and, with ``store=true``, make it
        durable, before its terminal event is sent.

        ``input_items``: its input as already stored (ids given), for a response
        stored before it ended (a background one); its own items otherwise.

        A response that took input while it ran (``response.inject``) is stored
        with its items in context order, from ``context_from``. A response
        created with ``conversation`` then appends its input and output items
        to that conversation (a conversation deleted meanwhile gets nothing).
        Raises :class:`StoreRefused` when the store fails either write: never
        acknowledged as completed, the response ends failed (the segment's
        ``exception``); the stored response may have been written then.
        """
        request = started.reply.request
        context = None
        rollout = started.rollout
        if (
            request.store
            and context_from is not None
            and started.segment is not None
            and started.segment.waits
            and context_from <= len(rollout.context)
        ):
            context = rollout.context[context_from:]
        conversation_id = conversation_id_of(request.conversation)
        # Ids given once, so the stored response and the conversation agree.
        new_items = (
            stored_input_items(started.items if input_items is None else input_items)
            if request.store or conversation_id is not None
            else started.items
        )
        try:
            await self.bill(
                response,
                owner=owner,
                transport=transport,
                store_input=new_items if request.store else None,
                previous_response_id=request.previous_response_id,
                store_context=context,
            )
            if conversation_id is not None:
                await self._extend_conversation(
                    conversation_id, owner, [*new_items, *response.output]
                )
        except (StoreWriteFailed, StoreError) as exc:
            raise StoreRefused(
                ResponseError(
                    code="server_error",
                    message="The response could not be stored (store=true), so it did "
                    "not complete; retry when the store is back.",
                )
            ) from exc

    async def _extend_conversation(
        self, conversation_id: str, owner: str, items: Sequence[Item]
    ) -> None:
        try:
            await self.conversations.append(conversation_id, owner, items)
        except RemoteProtocolError as gone:  # deleted while the response ran
            log.info("conversation %s not extended: %s", conversation_id, gone)

    async def bill(
        self,
        response: Response,
        *,
        owner: str,
        transport: Transport,
        store_input: Sequence[Item] | None = None,
        previous_response_id: str | None = None,
        store_context: Sequence[Item] | None = None,
    ) -> None:
        """A finished response's post-inference work: metrics, usage ledger, store."""
        if self.metrics is not None:
            self.metrics.response_finished(transport, response.status)
        persistence = self.persistence
        if persistence is not None:
            await persistence.post_inference(
                response,
                owner=owner,
                transport=transport,
                store_input=store_input,
                previous_response_id=previous_response_id,
                store_context=store_context,
            )

    def bill_nowait(self, response: Response, *, owner: str, transport: Transport) -> None:
        """The usage record of a rollout cut off by a disconnect (nothing may wait)."""
        persistence = self.persistence
        if persistence is not None:
            persistence.usage_nowait(response, owner=owner, transport=transport)
