"""Starting a turn: the engine's half, the same for every shape.

Theory of operation
-------------------
Whatever the transport, a request that starts model work goes through the
same engine steps, in this order (the order its errors are raised in), in
two calls the serve layer makes one after the other:

:func:`admit_turn`, before anything is accepted:

1. ``context_management`` is checked and the model resolved, reused from the
   parent rollout when the name is the same and the resolution-reuse switch is
   on (:func:`resolve_model`);
2. a warm-up that asks for a compaction turn is refused;
3. admission: validation and classification of the new input (and of the
   history, when nothing was kept from earlier turns) with the owner's
   compactor, so a refusal changes nothing;
4. the rollout: the one given (a continuation in place or a fork), or a new
   one, made but not yet started.

:func:`open_turn`, once the serve layer has seen the admitted rollout (its
inspector wraps the transport's sink): the rollout's Reply (append mode) or
its :class:`~longresponse.engine.segment.Segment` (the shipped shapes) on that
sink, the owner's hooks, and the admission's verdicts and stage times.

The engine calls nothing of the serve layer while a turn starts; while it
runs, it calls back twice: the turn's end (billing and storage:
``on_terminal`` in append mode, ``Segment.run``'s ``on_finish`` in the shipped
shapes) and each finished model turn's timing (``on_timing``). Nothing runs
yet when :func:`open_turn` returns: the caller runs the rollout (append mode)
or the segment. The request's own checks (``background``, the model's own
metadata) stay with the serve layer, each shape making them where its order of
errors puts them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from protocol import ErrorCode, Mode, RemoteProtocolError
from protocol.events import ResponseCreate
from protocol.items import CompactionTrigger, Item
from protocol.response import Response

from .admission import Admission, Pipeline
from .boundary import KnownPrefix
from .checkpoint import Checkpointing, RolloutCheckpoint
from .compaction import Compactor, check_context_management
from .hosted import McpHost
from .limits import EngineLimits
from .reply import Reply
from .rollout import Rollout
from .sampling import ModelSpec
from .segment import Segment
from .stream import EventSink
from .timing import TurnTiming

__all__ = ["Admitted", "Started", "admit_turn", "open_turn", "resolve_model", "restore_turn"]


@dataclasses.dataclass(slots=True)
class Started:
    """A turn ready to run: its rollout and either its Reply or its Segment."""

    rollout: Rollout
    model: ModelSpec
    #: The admitted new input (redacted when the policy says so).
    items: list[Item]
    reply: Reply
    segment: Segment | None = None
    #: How many leading items of the turn's history then input the rollout took
    #: in from a known prefix: they are not delivered again.
    known: int = 0


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


@dataclasses.dataclass(slots=True)
class Admitted:
    """A turn's input admitted and its rollout chosen or made; nothing started yet."""

    rollout: Rollout
    model: ModelSpec
    #: The admitted new input (redacted when the policy says so).
    items: list[Item]
    admission: Admission
    compactor: Compactor | None
    #: Leading items of the history then input the rollout holds already.
    known: int = 0


def admit_turn(
    request: ResponseCreate,
    *,
    pipeline: Pipeline,
    limits: EngineLimits,
    resolve: Callable[[str | None], ModelSpec],
    compactor: Compactor | None,
    new_items: list[Item],
    mode: Mode = Mode.SHIPPED,
    history: Sequence[Item] = (),
    cached: bool = True,
    rollout: Rollout | None = None,
    parent: Rollout | None = None,
    model: ModelSpec | None = None,
    known: KnownPrefix | None = None,
) -> Admitted:
    """Steps 1 to 4 of the module docstring: the model, admission of the new input,
    and the rollout (``rollout``, or a new one: in append mode it takes the input
    in with its first turn). ``model`` is the model when the caller resolved it
    already; compaction items open with ``compactor``. ``known``: the leading
    items of ``history`` then ``new_items`` are a conversation rendered
    recently, whose tokens a new rollout takes in without rendering them
    (``Rollout.seed``; ignored when ``rollout`` is given). Raises
    :class:`RemoteProtocolError`; nothing is accepted or changed then.
    """
    check_context_management(request)
    if model is None:
        model = resolve_model(request, pipeline=pipeline, resolve=resolve, parent=parent)
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
        compactor=compactor,
        known=known.items if known is not None and rollout is None and known.classified else 0,
    )
    taken = 0
    if rollout is None:
        everything = [*history, *admission.items] if known is not None else []
        taken = known.items if known is not None else 0
        rollout = Rollout(
            request=request,
            model=model,
            limits=limits,
            pipeline=pipeline,
            resolve=resolve,
            input_items=admission.items[taken:] if mode is Mode.APPEND else [],
        )
        if known is not None:
            rollout.seed(everything[:taken], known)
    return Admitted(rollout, model, admission.items, admission, compactor, taken)


def open_turn(
    admitted: Admitted,
    request: ResponseCreate,
    *,
    sink: EventSink,
    response_id: str,
    mode: Mode = Mode.SHIPPED,
    on_timing: Callable[[TurnTiming], None] | None = None,
    on_terminal: Callable[[Response], Awaitable[None]] | None = None,
    stream_id: str | None = None,
    send_timing: bool = False,
    decode: float = 0.0,
    waits: bool = False,
    mcp: McpHost | None = None,
    checkpoint: Checkpointing | None = None,
) -> Started:
    """The admitted turn opened on ``sink``: in append mode (``mode``) the rollout's
    Reply for all its turns, with ``on_terminal`` its post-inference work; in the
    shipped shapes a Segment of the rollout that ``waits`` in place at client tool
    calls if asked (multi-agent). Each finished model turn's timing goes to
    ``on_timing``. ``mcp``: the request's MCP servers (its hosted ``mcp`` tools).
    Raises nothing a client caused."""
    rollout, model = admitted.rollout, admitted.model
    segment: Segment | None = None
    if mode is Mode.APPEND:
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
    rollout.attach(
        compactor=admitted.compactor,
        on_timing=on_timing,
        on_terminal=on_terminal,
        mcp=mcp,
        checkpoint=checkpoint if mode is Mode.APPEND else None,
    )
    admission = admitted.admission
    rollout.note_admission(
        admission.verdicts,
        decode=decode,
        validate=admission.validate_seconds,
        classify=admission.classify_seconds,
    )
    return Started(rollout, model, admitted.items, reply, segment, admitted.known)


def restore_turn(
    checkpoint: RolloutCheckpoint,
    *,
    model: ModelSpec,
    pipeline: Pipeline,
    limits: EngineLimits,
    resolve: Callable[[str | None], ModelSpec],
    compactor: Compactor | None,
    sink: EventSink,
    on_timing: Callable[[TurnTiming], None] | None = None,
    on_terminal: Callable[[Response], Awaitable[None]] | None = None,
    send_timing: bool = False,
    hook: Checkpointing | None = None,
) -> Started:
    """An append-mode rollout taken up from ``checkpoint`` (``response.resume``):
    a fresh rollout holding its conversation and counts, its Reply on ``sink``
    with the same id, and the owner's hooks (``hook``: its next checkpoints).
    Its :meth:`~longresponse.engine.rollout.Rollout.run` starts with
    ``response.resumed``. Nothing runs yet."""
    rollout = Rollout(
        request=checkpoint.request,
        model=model,
        limits=limits,
        pipeline=pipeline,
        resolve=resolve,
        input_items=[],
    )
    rollout.restore(checkpoint)
    response_id = checkpoint.response.id
    reply = rollout.open_reply(response_id, sink, mode=Mode.APPEND, send_timing=send_timing)
    rollout.attach(
        compactor=compactor, on_timing=on_timing, on_terminal=on_terminal, checkpoint=hook
    )
    return Started(rollout, model, [], reply)
