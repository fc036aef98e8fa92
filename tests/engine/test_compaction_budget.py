"""Compaction within a budget: the window stays below the threshold however long
the rollout runs, and a model that writes its own summary is asked for it.

The rollouts here are driven in memory (a Rollout, a
:class:`~tests.support.memory_sink.MemorySink`, no socket): the simulated model
for the deterministic summary, a scripted engine for a summary turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import pytest

from longresponse.backends.sim.sampler import sim_spec
from longresponse.config import SimConfig
from longresponse.engine import summary
from longresponse.engine.compaction import CompactionKey, Compactor
from longresponse.engine.limits import EngineLimits
from longresponse.engine.render import render_item
from longresponse.engine.rollout import Rollout
from longresponse.engine.sampling import (
    ItemEnd,
    ModelSpec,
    SampleChunk,
    Sampler,
    SampleRequest,
    Stop,
    TextDelta,
    ToolCallStart,
    UpstreamError,
    Usage,
)
from protocol import Mode
from protocol.events import ContextManagement, ResponseAppend, ResponseCreate, ResponseDone
from protocol.items import (
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    FunctionTool,
    Item,
    Message,
    item_text,
)
from protocol.response import Response
from tests.support.memory_sink import MemorySink

READ = FunctionTool(
    name="read_file", parameters={"type": "object", "properties": {"path": {"type": "string"}}}
)
REQUEST = "Find the bug in fizz_buzz() and explain why it happens."
THRESHOLD = 1000


def tool_output(number: int) -> str:
    """About 170 tokens, unique within the 40 characters a summary keeps."""
    return f"output {number:03d} of read_file, line by line: " + "fizz buzz " * 80


def tokens(items: Sequence[Item]) -> int:
    return sum(len(render_item(item)) for item in items)


# --- the budget and the deterministic summary -----------------------------------------


def test_the_budget_is_half_the_threshold_less_the_prefix_in_the_models_tokens() -> None:
    compaction = len(render_item(Compaction(encrypted_content="")))
    plain = summary.budget(1000, prefix=40)
    assert plain.items == 500 - 40 - compaction
    assert plain.text == plain.items // 2
    # An engine that counts 2 tokens for each of ours: half the window, in ours.
    assert summary.budget(1000, prefix=40, scale=2.0).items == 250 - 40 - compaction
    assert summary.budget(1000, prefix=600).items == 0  # nothing left: no summary items


def conversation(calls: int) -> list[Item]:
    items: list[Item] = [
        Message(role="developer", content="be brief"),
        Message(role="user", content=REQUEST),
    ]
    for n in range(calls):
        call_id = f"call_{n:024d}"
        items.append(FunctionCall(call_id=call_id, name="read_file", arguments='{"path":"a"}'))
        items.append(FunctionCallOutput(call_id=call_id, output=tool_output(n)))
    return items


def test_what_fits_the_budget_is_kept_as_it_always_was() -> None:
    context = conversation(3)
    assert summary.summarize(context, summary.budget(THRESHOLD, 40)) == summary.summarize(context)


@pytest.mark.parametrize("calls", [20, 200, 2000])
def test_past_the_budget_the_summary_folds_the_oldest_and_stays_within_it(calls: int) -> None:
    limit = summary.budget(THRESHOLD, 40)
    kept = summary.summarize(conversation(calls), limit)
    assert tokens(kept) <= limit.items
    developer, request, note, *tail = kept
    assert (developer, request) == tuple(conversation(0))
    assert isinstance(note, Message)
    assert note.role == "user"
    text = item_text(note.content)
    assert text.startswith(summary.SUMMARY_INTRO)
    assert tokens([note]) <= limit.text
    # The count covers every output folded; the newest of them are quoted.
    tail_outputs = [item for item in tail if isinstance(item, FunctionCallOutput)]
    assert f"I read {calls - len(tail_outputs)} tool outputs: " in text
    assert f"«{tool_output(calls - len(tail_outputs) - 1)[:40]}»" in text
    assert "cut to its first 40 characters" in text
    # The tail: the newest calls and outputs, never an output without its call.
    assert tail_outputs
    assert isinstance(tail[0], FunctionCall)
    assert item_text(tail_outputs[-1].output) == tool_output(calls - 1)[:40]


def test_a_folded_summary_folded_again_keeps_its_count() -> None:
    limit = summary.budget(THRESHOLD, 40)
    once = summary.summarize(conversation(30), limit)
    more: list[Item] = [*once]
    for n in range(30, 60):
        call_id = f"call_{n:024d}"
        more += [
            FunctionCall(call_id=call_id, name="read_file", arguments='{"path":"a"}'),
            FunctionCallOutput(call_id=call_id, output=tool_output(n)),
        ]
    twice = summary.summarize(more, limit)
    tail_outputs = [item for item in twice if isinstance(item, FunctionCallOutput)]
    assert f"I read {60 - len(tail_outputs)} tool outputs: " in item_text(twice[2].content)  # type: ignore[union-attr]
    assert tokens(twice) <= limit.items


def test_the_models_text_is_cut_to_its_budget_and_the_request_kept() -> None:
    limit = summary.budget(THRESHOLD, 40)
    text = "The model's own words. " * 400
    kept = summary.summarize(conversation(3), limit, text)
    _, request, note, *tail = kept
    assert request == conversation(0)[1]
    body = item_text(note.content)  # type: ignore[union-attr]
    assert body.startswith(summary.SUMMARY_INTRO + "\nThe model's own words.")
    assert tokens([note]) <= limit.text
    assert tokens(kept) <= limit.items
    assert tail  # the newest call and output, after it


# --- a long rollout of the simulated model -------------------------------------------


class Recorded:
    """A sampler that hands each sampling to ``inner`` and keeps its request
    (counted first, so its token counts are exact)."""

    counts_first = True

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner
        self.requests: list[SampleRequest] = []

    def sample(self, request: SampleRequest) -> AsyncGenerator[SampleChunk, None]:
        self.requests.append(request)
        return self.inner.sample(request)


def rollout_of(model: ModelSpec, request: ResponseCreate) -> tuple[Rollout, MemorySink]:
    rollout = Rollout(request=request, model=model, limits=EngineLimits(pause_timeout=30))
    rollout.attach(compactor=Compactor(CompactionKey(os.urandom(32)), "owner"))
    return rollout, MemorySink(Mode.APPEND)


async def until(check: Any) -> None:
    for _ in range(100_000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


async def run_rollout(rollout: Rollout, sink: MemorySink, output: Any) -> Response:
    """Run an append-mode rollout to its end, answering each call with ``output(n)``."""
    reply = rollout.open_reply("resp_long", sink, mode=Mode.APPEND)
    reply.announce_created()
    task = asyncio.get_running_loop().create_task(rollout.run())
    answered = 0
    while True:
        await until(lambda: rollout.awaiting_input or task.done())
        if task.done():
            break
        outputs = []
        for call_id in reply.pending_calls:
            outputs.append(FunctionCallOutput(call_id=call_id, output=output(answered)))
            answered += 1
        sink.receive(ResponseAppend(response_id=reply.id, input=outputs))
        rollout.deliver(outputs, received_at=rollout.clock())
        await until(lambda: not rollout.awaiting_input or task.done())
    await task
    done = [event for event in sink.events if isinstance(event, ResponseDone)]
    return done[-1].response


def test_a_long_sim_rollout_stays_below_its_threshold_after_every_compaction() -> None:
    """100 calls of ~170-token outputs (about 19,000 tokens read) under a threshold of
    1,000: every window the model reads after a compaction is within half the
    threshold, every prompt within the threshold, and the answer still counts
    every output and quotes the request and the newest outputs."""
    calls = 100
    spec = sim_spec("sim", SimConfig())
    recorded = Recorded(spec.make_sampler())
    model = dataclasses.replace(spec, make_sampler=lambda: recorded)
    request = ResponseCreate(
        model="sim",
        input=REQUEST,
        tools=[READ],
        metadata={"sim_tool_calls": str(calls)},
        context_management=[ContextManagement(type="compaction", compact_threshold=THRESHOLD)],
    )
    rollout, sink = rollout_of(model, request)
    final = asyncio.run(run_rollout(rollout, sink, tool_output))

    assert final.status == "completed", final.error
    prompts = [r.cached_tokens + r.uncached_tokens for r in recorded.requests]
    windows = [
        p
        for p, r in zip(prompts, recorded.requests, strict=True)
        if isinstance(r.context[0], Compaction)
        and not any(isinstance(i, Compaction) for i in r.context[1:])
        and r.cached_tokens == 0
    ]
    compactions = [item for item in final.output if isinstance(item, Compaction)]
    assert len(compactions) >= 15
    assert len(windows) == len(compactions)
    assert max(windows) <= THRESHOLD * summary.WINDOW_SHARE
    assert max(prompts) <= THRESHOLD
    answer = final.output[-1]
    assert isinstance(answer, Message)
    text = item_text(answer.content)
    assert f"«{REQUEST[:40]}»" in text
    assert f"I read {calls} tool outputs: " in text
    for n in range(calls - 8, calls):
        assert f"«{tool_output(n)[:40]}»" in text


# --- a model that writes its own summary ----------------------------------------------


class Engine:
    """A scripted real engine: it calls a tool whenever it may, writes
    ``summary_text`` when asked for a summary, and counts 3 tokens for each 2 of
    ours plus 150 for its template, as llama.cpp's would."""

    summarizes = True
    counts_first = True

    def __init__(self, summary_text: str | None = "SUMMARY BY THE ENGINE") -> None:
        self.summary_text = summary_text
        self.requests: list[SampleRequest] = []

    def count(self, request: SampleRequest) -> int:
        return (request.cached_tokens + request.uncached_tokens) * 3 // 2 + 150

    async def sample(self, request: SampleRequest) -> AsyncGenerator[SampleChunk, None]:
        self.requests.append(request)
        prompt = self.count(request)
        if asks_summary(request):
            if self.summary_text is None:
                raise UpstreamError("The upstream engine at 127.0.0.1:1 broke off the stream.")
            yield Usage(input_tokens=prompt, cached_tokens=prompt - 40, output_tokens=9)
            yield TextDelta(self.summary_text)
            yield ItemEnd()
            yield Stop("stop")
            return
        yield Usage(input_tokens=prompt, cached_tokens=0, output_tokens=12)
        if request.tool_choice != "none":
            yield ToolCallStart(call_id=f"call_{len(self.requests):024d}", name="read_file")
            yield ItemEnd()
            yield Stop("tool_calls")
            return
        yield TextDelta("done")
        yield ItemEnd()
        yield Stop("stop")


def asks_summary(request: SampleRequest) -> bool:
    last = request.context[-1]
    return (
        isinstance(last, Message)
        and last.role == "user"
        and item_text(last.content).startswith("Stop here and write a summary")
    )


def engine_rollout(engine: Engine, turns: int) -> tuple[Rollout, MemorySink, ResponseCreate]:
    model = ModelSpec(
        name="engine", context_window=4096, max_output_tokens=4096, make_sampler=lambda: engine
    )
    request = ResponseCreate(
        model="engine",
        input=REQUEST,
        tools=[READ],
        max_tool_calls=turns,
        context_management=[ContextManagement(type="compaction", compact_threshold=THRESHOLD)],
    )
    rollout, sink = rollout_of(model, request)
    return rollout, sink, request


def test_an_engine_that_summarizes_writes_the_windows_summary_within_its_count() -> None:
    engine = Engine()
    rollout, sink, _ = engine_rollout(engine, 40)
    final = asyncio.run(run_rollout(rollout, sink, lambda n: f"result {n}: " + "x " * 60))
    assert final.status == "completed", final.error
    asked = [r for r in engine.requests if asks_summary(r)]
    compactions = [item for item in final.output if isinstance(item, Compaction)]
    assert compactions
    assert len(asked) == len(compactions)  # one summary turn per compaction
    for summary_turn in asked:  # no tool call, its output limited to the text's budget
        assert summary_turn.tool_choice == "none"
        assert summary_turn.max_output_tokens is not None
        assert 0 < summary_turn.max_output_tokens <= THRESHOLD * summary.WINDOW_SHARE / 1.5
    # Every turn's prompt, as the engine counts it, stays within the threshold
    # (compaction is decided on the engine's count, not only on ours), and a
    # summary turn's (the context, then the instruction) within one turn more.
    turns = [r for r in engine.requests if r not in asked]
    assert max(engine.count(r) for r in turns) <= THRESHOLD
    growth = max(
        engine.count(later) - engine.count(earlier)
        for earlier, later in itertools.pairwise(turns)
        if not isinstance(later.context[0], Compaction)
        or isinstance(earlier.context[0], Compaction)
    )
    assert max(engine.count(r) for r in asked) <= THRESHOLD + growth
    # The window the model read after each compaction holds the engine's text.
    after = [r for r in turns if isinstance(r.context[0], Compaction)]
    assert after
    for request in after:
        said = " ".join(
            item_text(item.content) for item in request.context if isinstance(item, Message)
        )
        assert summary.SUMMARY_INTRO + "\nSUMMARY BY THE ENGINE" in said


def test_a_summary_turn_that_fails_leaves_the_deterministic_summary(caplog: Any) -> None:
    engine = Engine(summary_text=None)
    rollout, sink, _ = engine_rollout(engine, 30)
    final = asyncio.run(run_rollout(rollout, sink, lambda n: f"result {n}: " + "x " * 60))
    assert final.status == "completed", final.error
    assert [item for item in final.output if isinstance(item, Compaction)]
    assert "the summary turn failed (upstream_unavailable" in caplog.text
    after = [r for r in engine.requests if isinstance(r.context[0], Compaction)]
    said = " ".join(
        item_text(item.content) for item in after[-1].context if isinstance(item, Message)
    )
    assert "tool outputs: " in said
