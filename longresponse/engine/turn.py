"""Starting a turn: the engine's half, the same for every shape.

Theory of operation
-------------------
Whatever the transport, a request that starts model work goes through the
same engine steps, in :func:`start_turn`, in this order (the order its errors
are raised in):

1. ``context_management`` is checked and the model resolved, reused from the
   parent rollout when the name is the same and the resolution-reuse switch is
   on (:func:`resolve_model`);
2. the owner's compactor is fetched (it seals and opens compaction items), and
   a warm-up that asks for a compaction turn is refused;
3. admission: validation and classification of the new input (and of the
   history, when nothing was kept from earlier turns), before anything is
   accepted, so a refusal changes nothing;
4. the rollout: the one given (a continuation in place or a fork), or a new
   one; the serve layer's ``watch`` sees it and gives the sink to write to and
   the observer of finished turns' timing; then its Reply (append mode) or its
   :class:`~longresponse.engine.segment.Segment` (the shipped shapes), the
   admission's verdicts and stage times, and the owner's hooks.

Nothing runs yet: the caller runs the rollout (append mode) or the segment.
The request's own checks (``background``, ``sim_*`` metadata) stay with the
serve layer, each shape making them where its order of errors puts them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from protocol import ErrorCode, Mode, RemoteProtocolError
from protocol.events import ResponseCreate
from protocol.items import CompactionTrigger, Item
from protocol.response import Response

from ..config import ServerConfig
from .admission import Pipeline
from .compaction import Compactor, check_context_management
from .reply import Reply
from .rollout import Rollout
from .sampling import ModelSpec
from .segment import Segment
from .stream import EventSink
from .timing import TurnTiming

__all__ = ["Started", "Watch", "resolve_model", "start_turn"]

#: The serve layer's look at a turn as it opens on ``rollout``: the sink the turn
#: writes to (the inspector wraps the transport's), and the observer of each
#: finished turn's timing (``None``: nobody observes it).
Watch = Callable[[Rollout], tuple[EventSink, Callable[[TurnTiming], None] | None]]


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


def resolve_model(
    request: ResponseCreate,
    *,
    pipeline: Pipeline,
    resolve: Callable[[str | None], ModelSpec],
    parent: Rollout | None = None,
) -> ModelSpec:
    """The request's model, reused from ``parent`` when the name is unchanged (and the
    resolution-reuse switch is on); otherwise ``resolve``'s (which raises for an
    unknown model)."""
    name = request.model if isinstance(request.model, str) else None
    if (
        parent is not None
        and pipeline.switches.resolution_reuse
        and parent.model.name == (name or "sim")
    ):
        return parent.model
    return resolve(name)


def start_turn(
    request: ResponseCreate,
    *,
    pipeline: Pipeline,
    config: ServerConfig,
    resolve: Callable[[str | None], ModelSpec],
    compactor: Callable[[], Compactor | None],
    watch: Watch,
    response_id: str,
    new_items: list[Item],
    append: bool = False,
    history: Sequence[Item] = (),
    cached: bool = True,
    rollout: Rollout | None = None,
    parent: Rollout | None = None,
    model: ModelSpec | None = None,
    stream_id: str | None = None,
    send_timing: bool = False,
    decode: float = 0.0,
    waits: bool = False,
    on_terminal: Callable[[Response], Awaitable[None]] | None = None,
) -> Started:
    """Model, admission and the rollout of one turn (nothing runs yet; see the module
    docstring for the steps and their order).

    Append mode (``append``) gets a new rollout writing one Reply for all its
    turns, ``on_terminal`` its post-inference work; the shipped shapes get a
    Segment of ``rollout`` (a continuation or a fork), or of a new rollout,
    that ``waits`` in place at client tool calls if asked (multi-agent).
    ``model`` is the model when the caller resolved it already; ``compactor``
    gives the owner's compactor. Raises :class:`RemoteProtocolError` before
    step 4; nothing is accepted or changed then.
    """
    check_context_management(request)
    if model is None:
        model = resolve_model(request, pipeline=pipeline, resolve=resolve, parent=parent)
    owners = compactor()
    if request.warm_up and new_items and isinstance(new_items[-1], CompactionTrigger):
        raise RemoteProtocolError(
            "A warm-up takes its input in without a turn; a compaction_trigger asks for "
            "one. Send it without generate: false (or prompt_cache_options.prewarm).",
            code=ErrorCode.INVALID_VALUE,
            param=f"input[{len(new_items) - 1}].type",
        )
    admission = pipeline.admit(
        new_items,
        history=history,
        tools=request.tools,
        text_format=request.text.format if request.text is not None else None,
        cached=cached,
        compactor=owners,
    )
    if rollout is None:
        rollout = Rollout(
            request=request,
            model=model,
            pause_timeout=config.pause_timeout,
            max_events=config.max_response_events,
            max_output_tokens=config.max_response_output_tokens,
            pipeline=pipeline,
            resolve=resolve,
            input_items=admission.items if append else [],
        )
    sink, on_timing = watch(rollout)
    segment: Segment | None = None
    if append:
        reply = rollout.open_reply(response_id, sink, mode=Mode.APPEND, send_timing=send_timing)
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
    rollout.attach(compactor=owners, on_timing=on_timing, on_terminal=on_terminal)
    rollout.note_admission(
        admission.verdicts,
        decode=decode,
        validate=admission.validate_seconds,
        classify=admission.classify_seconds,
    )
    return Started(rollout, model, admission.items, reply, segment)
