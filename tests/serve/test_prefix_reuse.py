"""Prefix reuse: a new rollout whose input begins with a conversation seen lately.

The official SDK over HTTP and over ``client.responses.connect()``, and the
project's own client in append mode, the same conversation against the same
kind of server, chained through the store or resent whole every turn: from
turn 2 on, the earlier context is ``cached_tokens`` and only the new input
``cache_write_tokens``, as over a WebSocket chain, when the server still holds
the conversation's tokens (``--prefix-reuse``, on by default); 0 cached when
it does not (another key's conversation, one pushed out of the budget, reuse
switched off). Reuse changes the work, never the answers, the errors or the
usage totals.
"""

from __future__ import annotations

import gc
import itertools
import tracemalloc
from array import array
from typing import Any

import httpx
import msgspec
import openai
import pytest
import trio

from longresponse.backends.registry import ModelRegistry
from longresponse.client import connect
from longresponse.engine.boundary import KnownPrefix
from longresponse.engine.limits import EngineLimits
from longresponse.engine.render import item_key, render_item, render_prefix
from longresponse.engine.rollout import Rollout
from longresponse.serve import prefix_reuse
from longresponse.serve.prefix_reuse import PrefixReuse
from protocol.events import ResponseCreate, ResponseDone
from protocol.items import FunctionCall, Message
from tests.engine.test_pipeline import FAKE_AWS_KEY, counters, normal
from tests.support.http_clients import openai_client

TOOL = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
META = {"sim_tool_calls": "2"}
INSTRUCTIONS = "You are a coding agent."


def _usage(response: Any) -> tuple[int, int, int]:
    usage = response.usage
    details = usage.input_tokens_details
    return usage.input_tokens, details.cached_tokens, details.cache_write_tokens


def _next_input(response: Any, turn: int) -> list[dict[str, Any]]:
    """The client's answer to ``response``: its call's output, or a new user turn."""
    calls = [item for item in response.output if item.type == "function_call"]
    if calls:
        return [{"type": "function_call_output", "call_id": calls[0].call_id, "output": f"o{turn}"}]
    return [{"role": "user", "content": f"And now step {turn}."}]


def http_chain(
    running: Any,
    turns: int,
    *,
    key: str = "test-key",
    first: str | None = None,
    items: list[dict[str, Any]] | None = None,
    instructions: str = INSTRUCTIONS,
    model: str = "sim",
    stream: bool = False,
    background: bool = False,
) -> list[Any]:
    """``turns`` chained creates over HTTP (``store=True``), the first continuing
    ``first`` with ``items`` (a new conversation by default)."""
    client = openai_client(running, key)
    responses: list[Any] = []
    previous = first
    items = items or [{"role": "user", "content": "Read the two files."}]
    for turn in range(turns):
        created = client.responses.create(
            model=model,
            instructions=instructions,
            input=items,  # type: ignore[arg-type]
            previous_response_id=previous,
            tools=[TOOL],  # type: ignore[list-item]
            metadata=META,
            store=True,
            stream=stream,
            background=background,
        )
        if stream:  # SSE: the Response is the terminal event's
            (response,) = [e.response for e in created if e.type == "response.completed"]
        else:
            response = created
        responses.append(response)
        previous, items = response.id, _next_input(response, turn)
    return responses


def ws_chain(running: Any, turns: int) -> list[Any]:
    """The same conversation over ``client.responses.connect()``."""
    responses: list[Any] = []
    with openai_client(running).responses.connect() as conn:
        previous, items = None, [{"role": "user", "content": "Read the two files."}]
        for turn in range(turns):
            conn.response.create(
                model="sim",
                instructions=INSTRUCTIONS,
                input=items,  # type: ignore[arg-type]
                previous_response_id=previous,  # type: ignore[arg-type]
                tools=[TOOL],  # type: ignore[list-item]
                metadata=META,
                store=True,
            )
            for event in conn:
                if event.type == "response.completed":
                    responses.append(event.response)
                    break
            previous, items = responses[-1].id, _next_input(responses[-1], turn)
    return responses


def _prefixes(running: Any) -> PrefixReuse:
    cache = running.app.parts.turns.prefixes
    assert cache is not None
    return cache


@pytest.mark.parametrize(
    ("stream", "background"),
    [(False, False), (True, False), (True, True)],
    ids=["json", "sse", "background"],
)
async def test_an_http_chain_reports_what_a_websocket_chain_does(
    make_server: Any, stream: bool, background: bool
) -> None:
    running = make_server()  # the defaults: prefix reuse on
    over_http = await trio.to_thread.run_sync(
        lambda: http_chain(running, 3, stream=stream, background=background)
    )
    over_ws = await trio.to_thread.run_sync(ws_chain, running, 3)
    usage = [_usage(r) for r in over_http]
    assert usage == [_usage(r) for r in over_ws]
    assert usage[0][1] == 0  # turn 1: the model has read nothing yet
    for (before, _, _), (now, cached, written) in itertools.pairwise(usage):
        # The parent's whole context (its input and its output) is cached, only
        # the new input written.
        assert before < cached < now
        assert cached + written == now
    assert _prefixes(running).hits == 2


async def test_without_prefix_reuse_every_http_input_token_is_written(
    make_server: Any,
) -> None:
    running = make_server(prefix_reuse=False)
    assert running.app.parts.turns.prefixes is None
    usage = [_usage(r) for r in await trio.to_thread.run_sync(http_chain, running, 3)]
    assert [(cached, written) for _, cached, written in usage] == [(0, n) for n, _, _ in usage]
    assert usage[2][0] > usage[1][0] > usage[0][0]


async def test_an_evicted_parent_reports_nothing_cached(make_server: Any) -> None:
    running = make_server()
    cache = _prefixes(running)
    a, b = ([{"role": "user", "content": f"Read the two files of {name}."}] for name in "ab")
    (first_a,) = await trio.to_thread.run_sync(lambda: http_chain(running, 1, items=a))
    # Room for one first turn's tokens and mark, not two.
    cache.budget_bytes = cache.nbytes * 3 // 2
    (first_b,) = await trio.to_thread.run_sync(lambda: http_chain(running, 1, items=b))
    assert cache.evictions == 1  # b's turn pushed a's out
    assert 0 < cache.nbytes <= cache.budget_bytes
    (second_b,) = await trio.to_thread.run_sync(
        lambda: http_chain(running, 1, first=first_b.id, items=_next_input(first_b, 0))
    )
    (second_a,) = await trio.to_thread.run_sync(
        lambda: http_chain(running, 1, first=first_a.id, items=_next_input(first_a, 0))
    )
    # The same conversation at the same turn: b's parent was held, a's was not.
    assert _usage(second_a)[0] == _usage(second_b)[0]
    assert _usage(second_b)[1] > _usage(first_b)[0]
    total, cached, written = _usage(second_a)
    assert (cached, written) == (0, total)


async def test_no_key_continues_from_another_keys_tokens(make_server: Any) -> None:
    running = make_server(api_keys=("key-one", "key-two"))
    cache = _prefixes(running)
    one = await trio.to_thread.run_sync(lambda: http_chain(running, 2, key="key-one"))
    hits = cache.hits
    # key-two naming key-one's response is refused; the cache is not read for it.
    with pytest.raises(openai.APIStatusError) as refused:
        await trio.to_thread.run_sync(
            lambda: http_chain(
                running, 1, key="key-two", first=one[0].id, items=_next_input(one[0], 0)
            )
        )
    assert refused.value.status_code in (400, 404)
    assert cache.hits == hits
    # key-two's own chain of the same conversation: its own turn 1 is all
    # written, its turn 2 reuses only its own parent.
    two = await trio.to_thread.run_sync(lambda: http_chain(running, 2, key="key-two"))
    assert [_usage(r) for r in two] == [_usage(r) for r in one]
    assert _usage(two[0])[1] == 0
    assert cache.hits == hits + 1


@pytest.mark.parametrize(
    "changed", [{"instructions": "You are a careful coding agent."}, {"model": "sim-alt"}]
)
async def test_new_instructions_or_model_report_nothing_cached(
    make_server: Any, changed: dict[str, str]
) -> None:
    # The parent's tokens were read after other instructions, or by another
    # model: the model has not processed this context, over HTTP as over the
    # WebSocket.
    running = make_server()
    (first,) = await trio.to_thread.run_sync(http_chain, running, 1)
    (second,) = await trio.to_thread.run_sync(
        lambda: http_chain(running, 1, first=first.id, items=_next_input(first, 0), **changed)
    )
    total, cached, written = _usage(second)
    assert (cached, written) == (0, total)
    assert _prefixes(running).hits == 1  # found and rendered from, not counted cached


# --- clients that resend the whole conversation ------------------------------------


def _echoed(response: Any) -> list[dict[str, Any]]:
    """The response's output as a client sends it back: the fields it was given
    (ids and statuses included), as the Agents SDK does."""
    return [item.model_dump(exclude_unset=True) for item in response.output]


def http_full(
    running: Any,
    turns: int,
    *,
    key: str = "test-key",
    stream: bool = False,
    store: bool = False,
    opening: str = "Read the two files.",
) -> list[Any]:
    """``turns`` creates over HTTP, each with the whole conversation so far and
    never ``previous_response_id``."""
    client = openai_client(running, key)
    conversation: list[Any] = [{"role": "user", "content": opening}]
    responses: list[Any] = []
    for turn in range(turns):
        created = client.responses.create(
            model="sim",
            instructions=INSTRUCTIONS,
            input=conversation,
            tools=[TOOL],  # type: ignore[list-item]
            metadata=META,
            store=store,
            stream=stream,
        )
        if stream:
            (response,) = [e.response for e in created if e.type == "response.completed"]
        else:
            response = created
        responses.append(response)
        conversation += [*_echoed(response), *_next_input(response, turn)]
    return responses


def ws_full(running: Any, turns: int) -> list[Any]:
    """The same over ``client.responses.connect()``: one connection, the whole
    conversation in every ``response.create``."""
    responses: list[Any] = []
    conversation: list[Any] = [{"role": "user", "content": "Read the two files."}]
    with openai_client(running).responses.connect() as conn:
        for turn in range(turns):
            conn.response.create(
                model="sim",
                instructions=INSTRUCTIONS,
                input=conversation,
                tools=[TOOL],  # type: ignore[list-item]
                metadata=META,
                store=False,
            )
            for event in conn:
                if event.type == "response.completed":
                    responses.append(event.response)
                    break
            conversation += [*_echoed(responses[-1]), *_next_input(responses[-1], turn)]
    return responses


def _assert_prefix_reused(usage: list[tuple[int, int, int]]) -> None:
    """Turn 1 reads everything; from turn 2 on, all but the new input is cached."""
    assert usage[0][1] == 0
    for (before, _, _), (now, cached, written) in itertools.pairwise(usage):
        assert before < cached < now
        assert cached + written == now
        assert cached >= 0.95 * now or written < 100  # only the new input is written


@pytest.mark.parametrize("shape", ["json", "sse", "stored", "ws"])
async def test_a_client_resending_everything_reports_what_a_chain_does(
    make_server: Any, shape: str
) -> None:
    on, off = make_server(), make_server(prefix_reuse=False)

    def run(running: Any) -> list[Any]:
        if shape == "ws":
            return ws_full(running, 4)
        return http_full(running, 4, stream=shape == "sse", store=shape == "stored")

    resent = await trio.to_thread.run_sync(run, on)
    chained = await trio.to_thread.run_sync(ws_chain, on, 4)
    stateless = await trio.to_thread.run_sync(run, off)
    usage = [_usage(r) for r in resent]
    _assert_prefix_reused(usage)
    # The same usage as the same conversation chained on a WebSocket, and the
    # same answers and totals as a server that reuses nothing.
    assert usage == [_usage(r) for r in chained]
    assert [normal(r.output_text) for r in resent] == [normal(r.output_text) for r in stateless]
    assert [u[0] for u in usage] == [_usage(r)[0] for r in stateless]
    assert all(_usage(r)[1] == 0 for r in stateless)
    # Each turn rendered only what was new: less than half the stateless work.
    rendered = [counters(s)["tokens_rendered"] for s in (on, off)]
    assert 2 * rendered[0] < rendered[1]
    assert _prefixes(on).hits >= 3


async def test_a_client_resending_everything_gets_the_flags_a_stateless_server_gives(
    make_server: Any,
) -> None:
    # --secrets-policy flag (the default): a Response's metadata flags what its
    # input holds. A client that resends everything sends the secret of its
    # first turn again in every request, and each Response says so.
    on, off = make_server(), make_server(prefix_reuse=False)
    opening = f"My key is {FAKE_AWS_KEY}; read the two files."
    resent = await trio.to_thread.run_sync(lambda: http_full(on, 3, opening=opening))
    stateless = await trio.to_thread.run_sync(lambda: http_full(off, 3, opening=opening))
    assert all(r.metadata["secrets_flagged"] == "1" for r in stateless)
    assert _prefixes(on).hits == 2
    assert [r.metadata for r in resent] == [r.metadata for r in stateless]


async def test_an_append_mode_create_begins_from_a_known_conversation(
    make_server: Any,
) -> None:
    running = make_server()
    conversation: list[Any] = [{"role": "user", "content": "Read the two files."}]
    seen = 0
    async with connect(running.url) as client:
        await client.create(
            model="sim", instructions=INSTRUCTIONS, input=conversation, tools=[TOOL], metadata=META
        )
        while True:
            done = (await client.until_done())[-1]
            assert isinstance(done, ResponseDone)
            output = done.response.output
            conversation += [msgspec.to_builtins(item) for item in output[seen:]]
            seen = len(output)
            if done.response.status != "requires_action":
                break
            calls = [i for i in output if isinstance(i, FunctionCall)][-1:]
            outputs = [
                {"type": "function_call_output", "call_id": c.call_id, "output": "ok"}
                for c in calls
            ]
            conversation += outputs
            await client.append(outputs)
    # The same conversation resent whole, on a new connection, with a new question.
    conversation.append({"role": "user", "content": "Now fix it."})
    async with connect(running.url) as client:
        await client.create(
            model="sim", instructions=INSTRUCTIONS, input=conversation, tools=[TOOL], metadata=META
        )
        again = (await client.until_done())[-1]
    assert isinstance(again, ResponseDone)
    usage = again.response.usage
    assert usage is not None
    # The whole earlier rollout (all but the new question) was known.
    assert usage.input_tokens_details.cached_tokens >= 0.95 * usage.input_tokens
    assert _prefixes(running).hits == 1


async def test_metrics_count_the_lookups_and_what_is_held(make_server: Any) -> None:
    running = make_server()
    await trio.to_thread.run_sync(http_full, running, 3)
    text = (await trio.to_thread.run_sync(httpx.get, f"{running.http_url}/metrics")).text
    figures = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("longresponse_prefix_reuse_")
    }
    cache = _prefixes(running)
    assert figures["longresponse_prefix_reuse_lookups_total"] == cache.lookups == 2
    assert figures["longresponse_prefix_reuse_hits_total"] == cache.hits == 2
    assert figures["longresponse_prefix_reuse_bytes"] == cache.nbytes > 0
    assert figures["longresponse_prefix_reuse_marks"] == len(cache) == 3


async def test_a_websocket_continuation_read_back_from_the_store_reports_its_reuse(
    make_server: Any,
) -> None:
    # A chain whose next turn comes on a new connection (a socket per run, as
    # pydantic-ai opens them): its parent is not on the connection and is read
    # back from the store, as over HTTP, and reports the same reuse.
    running = make_server()
    one = await trio.to_thread.run_sync(ws_chain, running, 2)
    hits = _prefixes(running).hits

    def next_turn() -> Any:
        with openai_client(running).responses.connect() as conn:
            conn.response.create(
                model="sim",
                instructions=INSTRUCTIONS,
                input=_next_input(one[-1], 1),  # type: ignore[arg-type]
                previous_response_id=one[-1].id,
                tools=[TOOL],  # type: ignore[list-item]
                metadata=META,
                store=True,
            )
            for event in conn:
                if event.type == "response.completed":
                    return event.response
        raise AssertionError("no response.completed")

    third = await trio.to_thread.run_sync(next_turn)
    (chained,) = (await trio.to_thread.run_sync(ws_chain, running, 3))[2:]
    assert _usage(third) == _usage(chained)
    _assert_prefix_reused([_usage(r) for r in (*one, third)])
    assert _prefixes(running).hits == hits + 1


def ws_chain_of_models(running: Any, models: list[str]) -> tuple[list[Any], list[Any]]:
    """A chain over ``client.responses.connect()``, turn ``i`` with ``models[i]``:
    its responses, and its conversation as a client resends it whole, with the
    next input."""
    responses: list[Any] = []
    conversation: list[Any] = []
    with openai_client(running).responses.connect() as conn:
        previous, items = None, [{"role": "user", "content": "Read the two files."}]
        for turn, model in enumerate(models):
            conversation += items
            conn.response.create(
                model=model,
                instructions=INSTRUCTIONS,
                input=items,  # type: ignore[arg-type]
                previous_response_id=previous,  # type: ignore[arg-type]
                tools=[TOOL],  # type: ignore[list-item]
                metadata=META,
                store=False,
            )
            for event in conn:
                if event.type == "response.completed":
                    responses.append(event.response)
                    break
            conversation += _echoed(responses[-1])
            previous, items = responses[-1].id, _next_input(responses[-1], turn)
    return responses, [*conversation, *items]


async def test_a_model_switched_in_place_leaves_nothing_cached_for_the_old_model(
    make_server: Any,
) -> None:
    # A WebSocket chain switches from sim to sim-alt in place: sim-alt read the
    # second turn. The same conversation resent whole to sim: sim never read
    # the second turn, so it is not cached (as on a chain switching back).
    running = make_server()
    (_, second), conversation = await trio.to_thread.run_sync(
        ws_chain_of_models, running, ["sim", "sim-alt"]
    )
    assert _usage(second)[1] == 0  # sim-alt read it all afresh
    client = openai_client(running)
    again = await trio.to_thread.run_sync(
        lambda: client.responses.create(
            model="sim",
            instructions=INSTRUCTIONS,
            input=conversation,
            tools=[TOOL],  # type: ignore[list-item]
            metadata=META,
            store=False,
        )
    )
    assert _prefixes(running).hits == 1  # its tokens were taken in
    total, cached, written = _usage(again)
    assert (cached, written) == (0, total)


@pytest.mark.parametrize("words", [1, 2000])
def test_the_budget_counts_what_the_conversations_take(words: int) -> None:
    # Many conversations of one turn, short and long, as HTTP leaves them: each
    # rollout gone, its tokens held by the cache. What the cache holds then,
    # measured, is what it counts against its budget.
    model = ModelRegistry().resolve("sim")
    request = ResponseCreate(model="sim", input=[], instructions=INSTRUCTIONS)
    prefix = array("I", render_prefix(INSTRUCTIONS, []))
    conversations = []
    for n in range(1000):
        items = [
            Message(role="user", content=f"Question {n}: " + "why " * words),
            Message(role="assistant", content=f"Answer {n}."),
        ]
        tokens = array("I", [token for item in items for token in render_item(item)])
        conversations.append((items, KnownPrefix(2, tokens, prefix, "sim", len(tokens))))
    cache = PrefixReuse(budget_bytes=1 << 40)
    gc.collect()
    tracemalloc.start()
    try:
        for n, (items, known) in enumerate(conversations):
            rollout = Rollout(request=request, model=model, limits=EngineLimits())
            rollout.seed(items, known)
            rollout.join_chain(f"resp_{n:032x}")
            cache.keep(rollout, owner="key")
            del rollout
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(cache) == 1000
    assert 0.75 * cache.nbytes <= held <= 1.1 * cache.nbytes


def test_a_lookup_does_not_read_the_item_it_leaves_to_the_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A known prefix leaves at least the newest item to the turn, so a lookup
    # has no use for its key: the newest item (a long paste, a large tool
    # output) is not hashed on the event loop for nothing.
    keyed: list[Any] = []

    def key(item: Any) -> bytes | None:
        keyed.append(item)
        return item_key(item)

    monkeypatch.setattr(prefix_reuse, "item_key", key)
    items = [
        Message(role="user", content="Read the two files."),
        Message(role="user", content="word " * 200_000),
    ]
    assert PrefixReuse(budget_bytes=1 << 20).find("key", items) is None
    assert keyed == items[:1]
