"""The Rollout driven directly: a scripted sampler, an in-memory sink, no socket.

Each test builds a Rollout with a :class:`Scripted` sampler (a real
:class:`~longresponse.engine.sampling.Sampler`: every sampling plays the next
script) and a :class:`~tests.support.memory_sink.MemorySink` (the protocol
core's server connection), and checks what the turn loop, the hosted-call
loop, the deferred count, the boundaries and steering did: the events sent,
the output items, the context and the counts.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from longresponse.engine.boundary import Boundary
from longresponse.engine.limits import EngineLimits
from longresponse.engine.render import render_text, tokenize_text
from longresponse.engine.rollout import Rollout
from longresponse.engine.sampling import (
    ArgumentsDelta,
    ItemEnd,
    ModelSpec,
    SampleChunk,
    SampleRequest,
    Stop,
    TextDelta,
    ToolCallStart,
    Usage,
)
from longresponse.engine.segment import Segment
from protocol import Mode
from protocol.events import ResponseAppend, ResponseCreate, ResponseDone
from protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    FunctionTool,
    Item,
    McpCall,
    McpListedTool,
    McpListTools,
    McpTool,
    Message,
    item_text,
)
from protocol.response import Response
from tests.support.memory_sink import MemorySink

#: A step of a script: a chunk the model yields, or a call made between two
#: chunks (to act on the rollout at that point of the stream).
Step = SampleChunk | Callable[[], None]

WEATHER = FunctionTool(name="get_weather", parameters={"type": "object", "properties": {}})


class Scripted:
    """A sampler whose n-th sampling plays the n-th script; it keeps every request."""

    def __init__(self, *scripts: Sequence[Step], counts_first: bool = True) -> None:
        self.scripts = list(scripts)
        self.requests: list[SampleRequest] = []
        #: The context each sampling read, as it was then.
        self.contexts: list[list[Item]] = []
        self.counts_first = counts_first

    async def sample(self, request: SampleRequest) -> AsyncGenerator[SampleChunk, None]:
        self.requests.append(request)
        self.contexts.append(list(request.context))
        for step in self.scripts[len(self.requests) - 1]:
            if callable(step):
                step()
            else:
                yield step
            await asyncio.sleep(0)


def answer(text: str) -> list[Step]:
    return [TextDelta(text), ItemEnd(), Stop("stop")]


def rollout_on(
    sampler: Scripted,
    request: ResponseCreate,
    *,
    mode: Mode = Mode.APPEND,
    limits: EngineLimits | None = None,
) -> tuple[Rollout, MemorySink]:
    model = ModelSpec(
        name="scripted",
        context_window=100_000,
        max_output_tokens=4096,
        make_sampler=lambda: sampler,
    )
    input_items = None if mode is Mode.APPEND else []
    rollout = Rollout(
        request=request,
        model=model,
        limits=limits or EngineLimits(pause_timeout=30),
        input_items=input_items,
    )
    return rollout, MemorySink(mode)


def said(items: Sequence[Item]) -> str:
    """What the model's messages among ``items`` say."""
    return "".join(
        item_text(item.content)
        for item in items
        if isinstance(item, Message) and item.role == "assistant"
    )


def dones(sink: MemorySink) -> list[Response]:
    return [event.response for event in sink.events if isinstance(event, ResponseDone)]


def exact_tokens(rollout: Rollout, items: Sequence[Item]) -> int:
    request = rollout.request
    return len(tokenize_text(render_text(request.instructions, request.tools, list(items))))


async def until(check: Callable[[], bool]) -> None:
    """Give the loop turns until ``check()`` holds (the rollout runs beside the test)."""
    for _ in range(10_000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


# --- append mode: a pause for a client call, and its resume ---------------------------


def test_a_client_call_pauses_the_rollout_and_its_output_resumes_it() -> None:
    call = [
        ToolCallStart(call_id="call_1", name="get_weather"),
        ArgumentsDelta('{"city": "Oslo"}'),
        ItemEnd(),
        Stop("tool_calls"),
    ]
    sampler = Scripted(call, answer("Sunny in Oslo"))
    request = ResponseCreate(model="scripted", input="Weather in Oslo?", tools=[WEATHER])
    rollout, sink = rollout_on(sampler, request)

    async def scenario() -> None:
        rollout.open_reply("resp_loop", sink, mode=Mode.APPEND).announce_created()
        task = asyncio.get_running_loop().create_task(rollout.run())
        await until(lambda: rollout.awaiting_input)
        (paused,) = dones(sink)
        assert paused.status == "requires_action"
        assert paused.required_action is not None
        assert paused.required_action.call_ids == ["call_1"]
        seen = len(rollout.tokens)  # what the model has read and written so far
        output = FunctionCallOutput(call_id="call_1", output="sunny, 21 C")
        sink.receive(ResponseAppend(response_id="resp_loop", input=[output]))
        rollout.deliver([output], received_at=rollout.clock())
        await task
        assert sampler.requests[1].cached_tokens == seen

    asyncio.run(scenario())
    paused, final = dones(sink)
    assert paused.status == "requires_action"
    assert final.status == "completed"
    assert [type(item) for item in rollout.context] == [
        Message,
        FunctionCall,
        FunctionCallOutput,
        Message,
    ]
    assert said(final.output) == "Sunny in Oslo"
    assert [wire for wire in sink.types() if wire == "response.in_progress"] == [
        "response.in_progress",
        "response.in_progress",
    ]  # started, then resumed
    # Both turns counted: the whole context each time, the second mostly cached.
    first_turn, second_turn = rollout.timings
    assert first_turn.input_tokens == exact_tokens(rollout, rollout.context[:1])
    assert second_turn.input_tokens == exact_tokens(rollout, rollout.context[:3])
    assert second_turn.cached_tokens == exact_tokens(rollout, rollout.context[:2])
    assert rollout.counts.input_tokens == first_turn.input_tokens + second_turn.input_tokens
    assert final.usage is not None
    assert final.usage.input_tokens == rollout.counts.input_tokens
    assert final.usage.input_tokens_details.cached_tokens == second_turn.cached_tokens
    assert len(rollout.tokens) == exact_tokens(rollout, rollout.context)


def test_input_appended_while_sampling_is_taken_in_at_the_next_boundary() -> None:
    rollout: Rollout
    sink: MemorySink
    steering = Message(role="user", content="and in Bergen?")

    def steer() -> None:
        sink.receive(ResponseAppend(response_id="resp_steer", input=[steering]))
        rollout.deliver([steering], received_at=rollout.clock())

    sampler = Scripted([TextDelta("Oslo: sunny"), steer, ItemEnd(), Stop("stop")], answer("rain"))
    request = ResponseCreate(model="scripted", input="Weather in Oslo?")
    rollout, sink = rollout_on(sampler, request)

    async def scenario() -> None:
        rollout.open_reply("resp_steer", sink, mode=Mode.APPEND).announce_created()
        await rollout.run()

    asyncio.run(scenario())
    (final,) = dones(sink)
    assert final.status == "completed"
    assert len(sampler.requests) == 2
    assert sampler.contexts[1][-1] == steering  # after the first answer, not inside it
    assert [type(item) for item in rollout.context] == [Message, Message, Message, Message]
    assert said(final.output) == "Oslo: sunnyrain"


def test_a_response_at_its_event_cap_ends_incomplete_with_its_open_item_closed() -> None:
    script = [TextDelta(f"w{n} ") for n in range(50)] + [ItemEnd(), Stop("stop")]
    sampler = Scripted(script)
    limits = EngineLimits(pause_timeout=30, max_events=12)
    rollout, sink = rollout_on(sampler, ResponseCreate(model="scripted", input="hi"), limits=limits)

    async def scenario() -> None:
        rollout.open_reply("resp_cap", sink, mode=Mode.APPEND).announce_created()
        await rollout.run()

    asyncio.run(scenario())
    (final,) = dones(sink)
    assert final.status == "incomplete"
    assert final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_events"
    (message,) = final.output
    assert isinstance(message, Message)
    assert message.status == "incomplete"
    deltas = sink.types().count("response.output_text.delta")
    assert 0 < deltas < 50  # stopped at the cap, not at the model's end
    assert said(final.output) == "".join(f"w{n} " for n in range(deltas))


# --- counting the new input after the first output --------------------------------


def test_a_sampler_that_reads_no_counts_first_gets_a_bound_and_the_count_comes_after() -> None:
    rollout: Rollout
    pending: list[bool] = []
    text = " ".join(f"word{i}" for i in range(300))

    def probe() -> None:
        pending.append(rollout.uncounted)

    sampler = Scripted(
        [probe, TextDelta("ok"), probe, TextDelta("!"), ItemEnd(), Stop("stop")],
        counts_first=False,
    )
    rollout, sink = rollout_on(sampler, ResponseCreate(model="scripted", input=text))

    async def scenario() -> None:
        rollout.open_reply("resp_defer", sink, mode=Mode.APPEND).announce_created()
        await rollout.run()

    asyncio.run(scenario())
    assert pending == [True, False]  # counted once the first output had gone out
    (turn,) = rollout.timings
    exact = exact_tokens(rollout, rollout.context[:1])
    assert turn.input_tokens == exact
    assert sampler.requests[0].uncached_tokens > exact  # the bound, not the count
    assert rollout.counts.input_tokens == exact
    (final,) = dones(sink)
    assert final.usage is not None
    assert final.usage.input_tokens == exact


def test_a_sampler_that_reads_the_counts_first_gets_them_exact() -> None:
    sampler = Scripted(answer("ok"), counts_first=True)
    rollout, sink = rollout_on(sampler, ResponseCreate(model="scripted", input="hello there"))

    async def scenario() -> None:
        rollout.open_reply("resp_exact", sink, mode=Mode.APPEND).announce_created()
        await rollout.run()

    asyncio.run(scenario())
    exact = exact_tokens(rollout, rollout.context[:1])
    assert sampler.requests[0].uncached_tokens == exact
    assert rollout.counts.input_tokens == exact


def test_an_engines_own_usage_replaces_the_estimate() -> None:
    script = [TextDelta("ok"), ItemEnd(), Usage(5000, 1200, 7), Stop("stop")]
    sampler = Scripted(script, counts_first=False)
    rollout, sink = rollout_on(sampler, ResponseCreate(model="scripted", input="hello"))

    async def scenario() -> None:
        rollout.open_reply("resp_usage", sink, mode=Mode.APPEND).announce_created()
        await rollout.run()

    asyncio.run(scenario())
    assert (rollout.counts.input_tokens, rollout.counts.cached_tokens) == (5000, 1200)
    (final,) = dones(sink)
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (5000, 7)


def test_a_turn_cancelled_mid_answer_is_billed_the_engines_last_running_count() -> None:
    """The engine's counts come as it streams (llama.cpp's ``timings``), each
    before what it counts: the cancel bills the last, once, for input and
    output; the o200k count of the message cut short adds nothing to it."""
    rollout: Rollout
    script: list[Step] = [
        Usage(300, 100, 0),
        TextDelta("Once upon a time"),
        Usage(320, 100, 6),  # (the prompt's count grows as the engine reads it)
        TextDelta(" there lived a dragon who"),
        Usage(320, 100, 12),
        lambda: rollout.request_cancel(),
        TextDelta(" never came"),
    ]
    sampler = Scripted(script)
    rollout, sink = rollout_on(sampler, ResponseCreate(model="scripted", input="A story?"))

    async def scenario() -> None:
        rollout.open_reply("resp_cut", sink, mode=Mode.APPEND).announce_created()
        rollout.task = asyncio.get_running_loop().create_task(rollout.run())
        await rollout.task

    asyncio.run(scenario())
    (final,) = dones(sink)
    assert final.status == "cancelled"
    (message,) = final.output
    assert isinstance(message, Message)
    assert message.status == "incomplete"
    assert said([message]) == "Once upon a time there lived a dragon who"
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (320, 12)
    assert final.usage.input_tokens_details.cached_tokens == 100
    assert (rollout.counts.input_tokens, rollout.counts.cached_tokens) == (320, 100)


def test_an_engines_count_of_one_turn_stands_and_a_turn_it_did_not_count_adds_its_own() -> None:
    """Turn one's count comes before its call ends (the item's own o200k count
    is replaced); turn two's engine sent none (the estimate stands for it)."""
    call = [
        Usage(80, 0, 1),
        ToolCallStart(call_id="call_1", name="get_weather"),
        Usage(80, 0, 9),
        ArgumentsDelta('{"city": "Oslo, Norway, Europe"}'),
        ItemEnd(),
        Stop("tool_calls"),
    ]
    sampler = Scripted(call, answer("Sunny"))
    request = ResponseCreate(model="scripted", input="Weather in Oslo?", tools=[WEATHER])
    rollout, sink = rollout_on(sampler, request)

    async def scenario() -> None:
        rollout.open_reply("resp_two", sink, mode=Mode.APPEND).announce_created()
        task = asyncio.get_running_loop().create_task(rollout.run())
        await until(lambda: rollout.awaiting_input)
        (paused,) = dones(sink)
        assert paused.usage is not None
        assert paused.usage.output_tokens == 9  # the engine's, not o200k's
        output = FunctionCallOutput(call_id="call_1", output="sunny")
        sink.receive(ResponseAppend(response_id="resp_two", input=[output]))
        rollout.deliver([output], received_at=rollout.clock())
        await task

    asyncio.run(scenario())
    _, final = dones(sink)
    assert final.usage is not None
    assert final.usage.output_tokens == 9 + len(tokenize_text("Sunny"))
    second = rollout.timings[1]
    assert final.usage.input_tokens == 80 + second.input_tokens


# --- the hosted-call loop -----------------------------------------------------------


class Host:
    """One MCP server, ``docs``, with one tool; it answers every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.closed = 0

    def labels(self) -> Sequence[str]:
        return ["docs"]

    def needs_approval(self, server_label: str, name: str, *, read_only: bool = False) -> bool:
        return False

    def can_call(self) -> bool:
        return True

    async def list_tools(self, server_label: str) -> list[McpListedTool]:
        return [McpListedTool(name="search", input_schema={"type": "object"})]

    async def call(self, server_label: str, name: str, arguments: str) -> str:
        self.calls.append((server_label, name, arguments))
        return "found: the manual"

    async def aclose(self) -> None:
        self.closed += 1


def test_a_hosted_call_runs_mid_turn_and_the_model_samples_again_with_its_output() -> None:
    call = [
        ToolCallStart(call_id="c1", name="search", kind="mcp", namespace="docs"),
        ArgumentsDelta('{"q": "manual"}'),
        ItemEnd(),
        Stop("tool_calls"),
    ]
    sampler = Scripted(call, answer("It is in the manual."))
    tools: list[Any] = [McpTool(server_label="docs", server_url="http://127.0.0.1:1/mcp")]
    request = ResponseCreate(model="scripted", input="Where is it?", tools=tools)
    rollout, sink = rollout_on(sampler, request)
    host = Host()

    async def scenario() -> None:
        rollout.open_reply("resp_mcp", sink, mode=Mode.APPEND).announce_created()
        rollout.attach(compactor=None, mcp=host)
        await rollout.run()

    asyncio.run(scenario())
    (final,) = dones(sink)
    assert final.status == "completed"
    assert host.calls == [("docs", "search", '{"q": "manual"}')]
    assert host.closed == 1  # no MCP session outlives its turn
    listing, mcp_call, message = final.output
    assert isinstance(listing, McpListTools)
    assert [tool.name for tool in listing.tools] == ["search"]
    assert isinstance(mcp_call, McpCall)
    assert mcp_call.output == "found: the manual"
    assert isinstance(message, Message)
    assert len(sampler.requests) == 2  # sampled again, in the same turn
    assert sampler.contexts[1][-1] == mcp_call
    assert len(rollout.timings) == 1  # one turn, one timing
    assert rollout.timings[0].hosted >= 0


# --- the shipped shape: boundaries, a fork, steering ------------------------------------


async def run_segment(
    rollout: Rollout, sink: MemorySink, segment_id: str, text: str
) -> Boundary | None:
    request = ResponseCreate(model="scripted", input=text)
    segment = Segment(
        rollout, segment_id=segment_id, request=request, model=rollout.model, sink=sink
    )
    items: list[Item] = [Message(role="user", content=text)]
    return await segment.run(items, received_at=rollout.clock())


def test_a_fork_at_an_older_boundary_starts_from_its_context_and_reuses_its_prefix() -> None:
    sampler = Scripted(answer("one"), answer("two"), answer("fork"))
    rollout, sink = rollout_on(sampler, ResponseCreate(model="scripted"), mode=Mode.SHIPPED)
    forked: list[Rollout] = []

    async def scenario() -> None:
        first = await run_segment(rollout, sink, "resp_1", "first")
        assert first is not None
        assert await run_segment(rollout, sink, "resp_2", "second") is not None
        child = rollout.fork(first)
        forked.append(child)
        assert await run_segment(child, sink, "resp_3", "instead") is not None

    asyncio.run(scenario())
    (child,) = forked
    first, second = rollout.boundaries
    assert (first.segment_id, second.segment_id) == ("resp_1", "resp_2")
    assert first.items == 2
    assert second.items == 4
    # The fork kept the first segment's conversation, not the second's.
    assert child.context[:2] == rollout.context[:2]
    assert child.context[2] == Message(role="user", content="instead")
    assert said(child.context[2:]) == "fork"
    assert said(rollout.context[2:]) == "two"
    assert [b.segment_id for b in child.boundaries] == ["resp_1", "resp_3"]
    # The model had processed the shared prefix: the fork's first turn reads it as cached.
    assert sampler.requests[2].cached_tokens == first.tokens
    assert (
        child.tokens.tokens.tolist()[: first.tokens]
        == rollout.tokens.tokens.tolist()[: first.tokens]
    )
    assert len(child.tokens) == exact_tokens(child, child.context)
    statuses = [r.status for r in (first.response, second.response)]
    assert statuses == ["completed", "completed"]


def test_steering_stops_a_segment_at_the_next_safe_point() -> None:
    rollout: Rollout
    sampler = Scripted(
        [TextDelta("first"), ItemEnd(), lambda: rollout.steer(), TextDelta("second"), ItemEnd()]
    )
    rollout, sink = rollout_on(sampler, ResponseCreate(model="scripted"), mode=Mode.SHIPPED)
    ended: list[Boundary | None] = []

    async def scenario() -> None:
        ended.append(await run_segment(rollout, sink, "resp_s", "go"))

    asyncio.run(scenario())
    (boundary,) = ended
    assert boundary is not None
    response = boundary.response
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "steered"
    assert said(response.output) == "first"  # the second item never opened
    assert "response.incomplete" in sink.types()
    assert [type(item) for item in rollout.context] == [Message, Message]


# --- no reference cycle ----------------------------------------------------------------


def test_a_finished_rollout_is_freed_without_a_collection() -> None:
    # Its collaborators (the turn loop, a deferred count, the hosted calls) hold
    # no reference back to it that outlives a call: no cycle keeps it alive
    # until the tuned collector's rare full pass (issue 20).
    def finished(counts_first: bool) -> weakref.ref[Rollout]:
        call = [
            ToolCallStart(call_id="c1", name="search", kind="mcp", namespace="docs"),
            ArgumentsDelta("{}"),
            ItemEnd(),
            Stop("tool_calls"),
        ]
        sampler = Scripted(call, answer("done"), counts_first=counts_first)
        tools: list[Any] = [McpTool(server_label="docs", server_url="http://127.0.0.1:1/mcp")]
        request = ResponseCreate(model="scripted", input="hello " * 50, tools=tools)
        rollout, sink = rollout_on(sampler, request)

        async def scenario() -> None:
            rollout.open_reply("resp_free", sink, mode=Mode.APPEND).announce_created()
            rollout.attach(compactor=None, mcp=Host())
            await rollout.run()
            await rollout.close()

        asyncio.run(scenario())
        assert [r.status for r in dones(sink)] == ["completed"]
        return weakref.ref(rollout)

    gc.collect()
    gc.disable()
    try:
        for counts_first in (False, True):
            ref = finished(counts_first)
            assert ref() is None, [type(r).__name__ for r in gc.get_referrers(ref())]
    finally:
        gc.enable()
