"""Counting a turn's new input after the first output (``longresponse.engine.counting``).

The token cache's bound must never be below the real count (else a context
over the window could start sampling), deferring must give the same tokens
and the same usage as counting first, near the window the count must come
first, and a turn cut off before its first output must still count it.
"""

from __future__ import annotations

import asyncio
import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from longresponse.backends.registry import ModelRegistry
from longresponse.config import SimConfig
from longresponse.engine.limits import EngineLimits
from longresponse.engine.render import TokenCache, render_prefix, render_text, tokenize_text
from longresponse.engine.rollout import Rollout
from protocol import Mode
from protocol.events import ResponseCreate, ResponseDone
from protocol.items import FunctionCallOutput, Item, Message
from tests.engine.test_engine import done_events
from tests.support.memory_sink import MemorySink

_texts = st.text(st.characters(codec="utf-8"), max_size=400)
_items = st.lists(
    st.one_of(
        st.builds(lambda t: Message(role="user", content=t), _texts),
        st.builds(
            lambda t, c: FunctionCallOutput(call_id="call_" + c, output=t),
            _texts,
            st.text("abc0123", min_size=1, max_size=8),
        ),
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(history=_items, new=_items)
def test_the_bound_is_never_below_the_count_and_the_tokens_are_the_same(
    history: list[Item], new: list[Item]
) -> None:
    deferred = TokenCache(render_prefix("be brief", []))
    deferred.extend(history)
    before = len(deferred)
    bound = deferred.defer(new)
    added = deferred.tokenize_deferred()
    assert added <= bound
    assert len(deferred) == before + added
    counted = TokenCache(render_prefix("be brief", []))
    counted.extend(history)
    counted.extend(new)
    assert deferred.snapshot() == counted.snapshot()
    assert deferred.snapshot() == tokenize_text(render_text("be brief", [], [*history, *new]))
    assert (deferred.items_rendered, deferred.tokens_rendered) == (
        counted.items_rendered,
        counted.tokens_rendered,
    )


def test_reading_the_cache_tokenizes_what_it_holds() -> None:
    cache = TokenCache(render_prefix(None, []))
    cache.defer([Message(role="user", content="first")])
    forked = cache.fork(len(cache))  # len() tokenizes what is held
    cache.defer([Message(role="user", content="second")])
    assert cache.tokens.tolist()[: len(forked)] == forked.snapshot()
    assert cache.snapshot() == tokenize_text(
        render_text(None, [], [Message(role="user", content=t) for t in ("first", "second")])
    )


def _big(words: int) -> str:
    return " ".join(f"word{i % 97}" for i in range(words))


def _run(sim: SimConfig, text: str) -> tuple[Rollout, list[ResponseDone]]:
    """One create of ``text`` on a sim model configured by ``sim``, to its end."""

    async def scenario() -> tuple[Rollout, list[ResponseDone]]:
        sink = MemorySink(Mode.APPEND)
        model = ModelRegistry(sim).resolve("sim")
        rollout = Rollout(
            request=ResponseCreate(model="sim", input=text),
            model=model,
            limits=EngineLimits(pause_timeout=60),
        )
        reply = rollout.open_reply("resp_count", sink, mode=Mode.APPEND)
        reply.announce_created()
        await rollout.run()
        return rollout, done_events(sink)

    return asyncio.run(scenario())


def _exact(rollout: Rollout) -> int:
    """The context's tokens counted from scratch, the slow way."""
    request = rollout.request
    return len(tokenize_text(render_text(request.instructions, request.tools, rollout.context)))


def test_counting_after_the_first_output_bills_what_counting_first_bills() -> None:
    text = _big(2000)
    later, later_done = _run(SimConfig(), text)
    # A prefill rate reads the counts first: the same turn, counted before sampling.
    first, first_done = _run(SimConfig(prefill_tokens_per_second=1e9), text)
    assert later.sampler.counts_first is False
    assert first.sampler.counts_first is True
    (later_turn,), (first_turn,) = later.timings, first.timings
    assert later_turn.count > 0
    assert first_turn.count == 0
    assert later_turn.new_tokens == first_turn.new_tokens > 2000
    usage = [d.response.usage for d in (*later_done, *first_done)]
    assert usage[0] == usage[1]
    assert usage[0] is not None
    assert usage[0].input_tokens == _exact(later) - _output_tokens(later)
    assert later.counts.input_tokens == first.counts.input_tokens


def _output_tokens(rollout: Rollout) -> int:
    """Tokens of what the model wrote (in the context, not in this turn's input)."""
    request = rollout.request
    prompt = tokenize_text(render_text(request.instructions, request.tools, rollout.context[:1]))
    return _exact(rollout) - len(prompt)


def test_near_the_window_the_count_comes_first() -> None:
    text = _big(1000)  # about 2,000 tokens, 8,000 bytes: the bound is four times the count
    exact = len(tokenize_text(render_text(None, [], [Message(role="user", content=text)])))
    fits = dataclasses.replace(SimConfig(), context_window=exact + 10)
    rollout, done = _run(fits, text)
    assert rollout.timings[0].count == 0  # counted before sampling: the bound did not fit
    assert [d.response.status for d in done] == ["completed"]
    over = dataclasses.replace(SimConfig(), context_window=exact - 1)
    _, done = _run(over, text)
    assert [d.response.status for d in done] == ["failed"]
    assert done[0].response.error is not None
    assert done[0].response.error.code == "context_length_exceeded"


def test_a_turn_cut_off_before_its_first_output_still_counts_its_input() -> None:
    async def scenario() -> Rollout:
        sink = MemorySink(Mode.APPEND)
        model = ModelRegistry().resolve("sim")
        request = ResponseCreate(
            model="sim", input=_big(500), metadata={"sim_ttft_ms": "60000"}
        )  # the first token is a minute away
        rollout = Rollout(request=request, model=model, limits=EngineLimits(pause_timeout=60))
        rollout.open_reply("resp_cut", sink, mode=Mode.APPEND).announce_created()
        rollout.task = asyncio.get_running_loop().create_task(rollout.run())
        for _ in range(100):
            await asyncio.sleep(0)
            if rollout.uncounted:
                break
        assert rollout.uncounted  # sampling, its input not counted yet
        rollout.task.cancel()
        try:
            await rollout.task
        except asyncio.CancelledError:
            pass
        return rollout

    rollout = asyncio.run(scenario())
    assert not rollout.uncounted
    assert len(rollout.tokens) == _exact(rollout)
    assert rollout.counts.input_tokens == _exact(rollout)
    assert rollout.snapshot().status == "cancelled"


def test_new_tokens_are_counted_when_a_reader_tokenized_the_cache_first() -> None:
    async def scenario() -> Rollout:
        sink = MemorySink(Mode.APPEND)
        model = ModelRegistry().resolve("sim")
        request = ResponseCreate(model="sim", input=_big(500), metadata={"sim_ttft_ms": "100"})
        rollout = Rollout(request=request, model=model, limits=EngineLimits(pause_timeout=60))
        rollout.open_reply("resp_read", sink, mode=Mode.APPEND).announce_created()
        task = asyncio.get_running_loop().create_task(rollout.run())
        for _ in range(100):
            await asyncio.sleep(0)
            if rollout.uncounted:
                break
        assert rollout.uncounted
        assert len(rollout.tokens) > 500  # a reader (a fork, the inspector) tokenizes it
        await task
        return rollout

    rollout = asyncio.run(scenario())
    (turn,) = rollout.timings
    message = tokenize_text(render_text(None, [], rollout.context[:1]))
    prefix = tokenize_text(render_text(None, [], []))
    assert turn.new_tokens == len(message) - len(prefix)
    assert rollout.counts.input_tokens == len(message)


def test_an_input_of_rare_characters_near_the_encoders_limit_is_counted() -> None:
    # 60,000 characters outside the vocabulary: one token per UTF-8 byte, 240,000
    # tokens, more than the encoder takes in one call (200,000).
    text = "\U000f0000" * 60_000
    rollout, done = _run(SimConfig(), text)
    assert [d.response.status for d in done] == ["completed"]
    assert rollout.counts.input_tokens == len(
        tokenize_text(render_text(None, [], rollout.context[:1]))
    )
    assert rollout.counts.input_tokens > 200_000
