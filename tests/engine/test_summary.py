"""The default compaction summary is the engine's, and every model compacts with it."""

from __future__ import annotations

from typing import Any

from longresponse.backends.registry import ModelRegistry, serve_backends
from longresponse.config import BackendConfig
from longresponse.engine import summary
from longresponse.engine.sampling import ModelSpec, Sampler
from protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    Message,
    Reasoning,
)


def _context() -> list[Any]:
    return [
        Message(role="developer", content="be brief"),
        Message(role="user", content="what is in the file?"),
        Reasoning(id="rs_1", summary=[]),
        FunctionCall(call_id="call_1", name="read", arguments="{}"),
        FunctionCallOutput(call_id="call_1", output="x" * 100),
        Message(role="assistant", content="it holds x"),
    ]


def test_the_summary_keeps_the_request_the_calls_and_the_outputs_heads() -> None:
    context = _context()
    kept = summary.summarize(context)
    assert kept[:3] == [context[0], context[1], context[3]]
    assert len(kept) == 4
    assert isinstance(kept[3], FunctionCallOutput)
    assert kept[3].output == "x" * summary.SUMMARY_HEAD_CHARS


class _Backend:
    def __init__(self) -> None:
        self.config = BackendConfig(name="real", kind="chat", base_url="http://127.0.0.1:1/v1")

    def make_sampler(self) -> Sampler:  # pragma: no cover - never sampled
        raise AssertionError

    async def aclose(self) -> None:  # pragma: no cover - never opened
        pass


def test_every_model_compacts_with_the_engines_summary() -> None:
    registry = ModelRegistry()
    serve_backends(registry, [_Backend()])
    plain = ModelSpec(name="plain", context_window=10, max_output_tokens=1, make_sampler=object)
    for spec in (registry.resolve("sim"), registry.resolve("real"), plain):
        assert spec.summarize is summary.summarize
