"""TurnTiming: where one sampling turn's server time went, phase by phase.

A rollout records one :class:`TurnTiming` per model turn (the samplings of
a turn whose model called hosted tools in one, :meth:`TurnTiming.absorb`). The serve layer
exports them on ``/metrics`` (histograms by phase and transport), in the HTTP
``Server-Timing`` header, and as ``responsesapi.websocket_timing`` events to
clients that asked for them.
"""

from __future__ import annotations

import dataclasses

__all__ = ["TurnTiming"]


@dataclasses.dataclass(slots=True)
class TurnTiming:
    """Server-side times of one sampling turn, in seconds."""

    turn: int
    #: From the decoded append that completed the outputs (or the create) to
    #: the sampler being called: validation, render, tokenize, resolution.
    resume: float = 0.0
    #: Decoding the client event that started this turn.
    decode: float = 0.0
    #: Pre-inference, all stages, and each stage: validation and
    #: classification (at admission), resolution, render + tokenize.
    pre_inference: float = 0.0
    validate: float = 0.0
    classify: float = 0.0
    resolve: float = 0.0
    render: float = 0.0
    #: Rendering and tokenizing the new input after the first output, when its
    #: count could wait (``longresponse.engine.counting``; then ``render`` is ~0).
    count: float = 0.0
    time_to_first_token: float = 0.0
    inference: float = 0.0
    #: Encoding and queueing this turn's events for the transport.
    encode: float = 0.0
    #: Hosted tools the server ran in the turn (MCP listings and calls): a
    #: phase of its own, out of pre-inference and inference.
    hosted: float = 0.0
    #: Post-inference work done before the terminal event (the ledger and
    #: store writes when overlapped post-inference is off; else ~0).
    post_inference: float = 0.0
    new_tokens: int = 0
    cached_tokens: int = 0
    #: Input tokens the model read this turn (cached + uncached; the inspector's total).
    input_tokens: int = 0

    def absorb(self, later: TurnTiming) -> None:
        """Count a later sampling of the same turn in this one (a model that
        called a hosted tool samples again at once: one turn, one row). Its
        phases add up; of the tokens, the new ones add up and the last
        sampling's cached and total stand."""
        for field in (
            "pre_inference",
            "resolve",
            "render",
            "count",
            "inference",
            "encode",
            "hosted",
            "post_inference",
        ):
            setattr(self, field, getattr(self, field) + getattr(later, field))
        self.new_tokens += later.new_tokens
        self.cached_tokens, self.input_tokens = later.cached_tokens, later.input_tokens

    def before_sampling(self, started: float, resolved: float, rendered: float, now: float) -> None:
        """The pre-inference phases, from the clock readings of a turn up to sampling."""
        self.resolve = resolved - started
        self.render = rendered - resolved
        self.pre_inference = now - started + self.decode + self.validate + self.classify

    def as_metrics(self) -> dict[str, float]:
        return {
            "turn": self.turn,
            "resume_ms": self.resume * 1000,
            "decode_ms": self.decode * 1000,
            "pre_inference_ms": self.pre_inference * 1000,
            "validate_ms": self.validate * 1000,
            "classify_ms": self.classify * 1000,
            "resolve_ms": self.resolve * 1000,
            "render_ms": self.render * 1000,
            "count_ms": self.count * 1000,
            "time_to_first_token_ms": self.time_to_first_token * 1000,
            "inference_ms": self.inference * 1000,
            "encode_ms": self.encode * 1000,
            "hosted_ms": self.hosted * 1000,
            "post_inference_ms": self.post_inference * 1000,
            "new_tokens": self.new_tokens,
            "cached_tokens": self.cached_tokens,
        }

    #: The phases exported on /metrics and in Server-Timing.
    PHASES = (
        "decode",
        "validate",
        "classify",
        "resolve",
        "render",
        "count",
        "pre_inference",
        "time_to_first_token",
        "inference",
        "encode",
        "hosted",
        "post_inference",
    )
