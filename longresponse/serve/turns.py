"""Starting a turn, the same way for every shape: append, shipped WebSocket, HTTP.

Theory of operation
-------------------
Whatever the transport, a request that starts model work goes through the
same steps, in :meth:`Turns.start_turn`:

1. the request's own checks (``background``, the simulated model's
   ``sim_*`` metadata), which each shape makes where its order of errors puts
   them;
2. model resolution, reused from the parent rollout when the name is the
   same and the resolution-reuse switch is on;
3. admission: validation and classification of the new input (and of the
   history, when nothing was kept from earlier turns), before anything is
   accepted, so a refusal changes nothing;
4. the rollout: the one given (a continuation in place or a fork), or a new
   one; its Reply (append mode) or its :class:`Segment` (the shipped shape),
   the admission's verdicts and stage times, and the timing observer that
   feeds ``/metrics`` under the transport's label.

After the turn, :meth:`Turns.bill` does the post-inference work of a finished
response (the usage ledger, the stored response, the metrics); a segment
that failed is billed and counted too, and never stored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Final

from protocol import ErrorCode, RemoteProtocolError, ResponseState
from protocol.events import ResponseCreate
from protocol.items import CompactionTrigger, Item
from protocol.response import Response, ResponseError

from ..backends.registry import ModelRegistry
from ..backends.sim.sampler import check_sim_metadata
from ..config import ServerConfig
from ..engine.admission import Pipeline
from ..engine.compaction import CompactionKey, Compactor, check_context_management
from ..engine.failures import TurnRefused
from ..engine.reply import Reply
from ..engine.rollout import Boundary, Rollout
from ..engine.sampling import ModelSpec
from ..engine.segment import Segment
from ..engine.stream import EventSink
from ..engine.timing import TurnTiming
from ..storage.persistence import Persistence, StoreWriteFailed
from .inspector.observer import Inspector
from .inspector.records import RolloutRecord
from .metrics import ServerMetrics

__all__ = ["TRANSPORTS", "Started", "Turns"]

#: The transports, as labelled on ``/metrics`` and in the usage ledger.
TRANSPORTS: Final = ("append", "ws", "http")
#: The code of a parameter the server knows but cannot honour with the rest
#: of the request (``background: true`` with ``store: false``).
UNSUPPORTED_PARAMETER: Final = "unsupported_parameter"


@dataclasses.dataclass(slots=True)
class Started:
    """A turn ready to run: its rollout and either its Reply or its Segment."""

    rollout: Rollout
    model: ModelSpec
    #: The admitted new input (redacted when the policy says so).
    items: list[Item]
    reply: Reply
    segment: Segment | None = None
    #: Why post-inference refused the finished turn (``"store_unavailable"``), if it did.
    refused: str | None = None


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
        #: The inspector's observations (off unless the app gives one).
        self.inspector = inspector or Inspector(enabled=False)
        self.models = models
        self.pipeline = pipeline
        self.metrics = metrics
        self._persistence = persistence
        self._compaction_key = compaction_key

    @property
    def persistence(self) -> Persistence | None:
        return self._persistence() if self._persistence is not None else None

    def compactor(self, owner: str) -> Compactor | None:
        """``owner``'s compactor, once the server's compaction key is loaded."""
        if self._compaction_key is None:
            return None
        return Compactor(self._compaction_key(), owner)

    # --- the steps -------------------------------------------------------------

    def check_background(self, request: ResponseCreate, *, transport: str) -> None:
        """``background: true``: refused over WebSocket, as shipped; over HTTP it
        needs ``store=true`` (``unsupported_parameter``, param ``background``).
        Raises :class:`RemoteProtocolError`."""
        if not request.background:
            return
        if transport != "http":
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

    def waits_in_place(self, request: ResponseCreate, *, beta: bool, transport: str) -> bool:
        """Whether ``request`` asks for a multi-agent Response (``multi_agent.enabled``),
        which waits in place for ``response.inject`` at client tool calls.

        Raises :class:`RemoteProtocolError` where it cannot be served: over
        HTTP, or on a WebSocket opened without the multi-agent beta (``beta``).
        """
        if request.multi_agent is None or not request.multi_agent.enabled:
            return False
        if transport == "http" or not beta:
            where = (
                "over HTTP by this server (it waits for response.inject on a WebSocket)"
                if transport == "http"
                else "without the header 'OpenAI-Beta: responses_multi_agent=v1' on the upgrade"
            )
            raise RemoteProtocolError(
                f"multi_agent is not available {where}.",
                code=ErrorCode.INVALID_VALUE,
                param="multi_agent",
            )
        return True

    def check_metadata(self, request: ResponseCreate) -> None:
        """The simulated model's ``sim_*`` metadata. Raises :class:`RemoteProtocolError`."""
        check_sim_metadata(request.metadata)

    def resolve(self, request: ResponseCreate, parent: Rollout | None = None) -> ModelSpec:
        """The request's model, reused from ``parent`` when the name is unchanged."""
        name = request.model if isinstance(request.model, str) else None
        if (
            parent is not None
            and self.pipeline.switches.resolution_reuse
            and parent.model.name == (name or "sim")
        ):
            return parent.model
        return self.models.resolve(name)

    def start_turn(
        self,
        request: ResponseCreate,
        *,
        transport: str,
        response_id: str,
        sink: EventSink,
        new_items: list[Item],
        history: Sequence[Item] = (),
        cached: bool = True,
        rollout: Rollout | None = None,
        parent: Rollout | None = None,
        model: ModelSpec | None = None,
        stream_id: str | None = None,
        send_timing: bool = False,
        decode: float = 0.0,
        owner: str = "",
        waits: bool = False,
    ) -> Started:
        """Model, admission and the rollout of one turn (nothing runs yet).

        The request's own checks (:meth:`check_background`,
        :meth:`check_metadata`) are the caller's, each shape at the point of
        its order of errors.

        Append mode (``transport="append"``) gets a new rollout writing one
        Reply for all its turns; the shipped shapes get a :class:`Segment` of
        ``rollout`` (a continuation or a fork), or of a new rollout, that
        ``waits`` in place at client tool calls if asked (multi-agent). ``model``
        is the model when the caller resolved it already; compaction items
        are sealed and opened for ``owner``. Raises
        :class:`RemoteProtocolError`; nothing is accepted then.
        """
        check_context_management(request)
        if model is None:
            model = self.resolve(request, parent)
        compactor = self.compactor(owner)
        if request.warm_up and new_items and isinstance(new_items[-1], CompactionTrigger):
            raise RemoteProtocolError(
                "A warm-up takes its input in without a turn; a compaction_trigger asks for "
                "one. Send it without generate: false (or prompt_cache_options.prewarm).",
                code=ErrorCode.INVALID_VALUE,
                param=f"input[{len(new_items) - 1}].type",
            )
        admission = self.pipeline.admit(
            new_items,
            history=history,
            tools=request.tools,
            text_format=request.text.format if request.text is not None else None,
            cached=cached,
            compactor=compactor,
        )
        append = transport == "append"
        if rollout is None:
            rollout = self.new_rollout(request, model, admission.items if append else [])
        sink, seen = self.inspector.watch(rollout, request, response_id, sink)
        segment: Segment | None = None
        if append:
            reply = rollout.open_reply(response_id, sink, append=True, send_timing=send_timing)
        else:
            segment = Segment(
                rollout,
                segment_id=response_id,
                request=request,
                model=model,
                sink=sink,
                stream_id=stream_id,
                send_timing=send_timing,
                waits=waits,
            )
            reply = segment.reply
        rollout.compactor = compactor
        rollout.note_admission(
            admission.verdicts,
            decode=decode,
            validate=admission.validate_seconds,
            classify=admission.classify_seconds,
        )
        if self.metrics is not None or seen is not None:
            rollout.on_timing = self._timing_hook(transport, response_id, seen)
        return Started(rollout, model, admission.items, reply, segment)

    def _timing_hook(
        self, transport: str, response_id: str, seen: RolloutRecord | None
    ) -> Callable[[TurnTiming], None]:
        """Each finished turn: to ``/metrics`` and to the inspector's timeline."""
        metrics = self.metrics

        def on_timing(timing: TurnTiming) -> None:
            if metrics is not None:
                metrics.observe_turn(transport, timing)
            if seen is not None:
                seen.turn_ended(timing, response_id)

        return on_timing

    def new_rollout(
        self, request: ResponseCreate, model: ModelSpec, input_items: list[Item] | None = None
    ) -> Rollout:
        """A fresh rollout for ``request`` (``input_items``: what its first turn takes in)."""
        return Rollout(
            request=request,
            model=model,
            pause_timeout=self.config.pause_timeout,
            max_events=self.config.max_response_events,
            max_output_tokens=self.config.max_response_output_tokens,
            pipeline=self.pipeline,
            resolve=self.models.resolve,
            input_items=input_items if input_items is not None else [],
        )

    async def run_segment(
        self,
        started: Started,
        *,
        owner: str,
        transport: str,
        history: Sequence[Item] = (),
        received_at: float,
    ) -> Boundary | None:
        """Run a shipped-shape turn and bill it, finished or failed."""
        assert started.segment is not None

        # Where this response's own items begin in the rollout's context (after
        # any history a hydrated rollout takes in first).
        start = len(started.rollout.context) + len(history)

        async def finished(response: Response) -> None:
            await self.acknowledge(
                started, response, owner=owner, transport=transport, context_from=start
            )

        boundary = await started.segment.run(
            [*history, *started.items], received_at=received_at, on_finish=finished
        )
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
        transport: str,
        context_from: int | None = None,
    ) -> None:
        """Bill a finished shipped-shape response and, with ``store=true``, make it
        durable, before its terminal event is sent.

        A response that took input while it ran (``response.inject``) is stored
        with its items in context order, from ``context_from``. Raises
        :class:`TurnRefused` when the store fails the write: never acknowledged
        as completed, the response ends failed (``started.refused`` says why).
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
        try:
            await self.bill(
                response,
                owner=owner,
                transport=transport,
                store_input=started.items if request.store else None,
                previous_response_id=request.previous_response_id,
                store_context=context,
            )
        except StoreWriteFailed as exc:
            started.refused = "store_unavailable"
            raise TurnRefused(
                ResponseError(
                    code="server_error",
                    message="The response could not be stored (store=true), so it did "
                    "not complete; retry when the store is back.",
                )
            ) from exc

    async def bill(
        self,
        response: Response,
        *,
        owner: str,
        transport: str,
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

    def bill_nowait(self, response: Response, *, owner: str, transport: str) -> None:
        """The usage record of a rollout cut off by a disconnect (nothing may wait)."""
        persistence = self.persistence
        if persistence is not None:
            persistence.usage_nowait(response, owner=owner, transport=transport)
