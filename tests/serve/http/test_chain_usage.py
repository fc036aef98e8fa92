"""An HTTP ``previous_response_id`` chain reports its reuse, as a WebSocket chain does.

The official SDK over HTTP and over ``client.responses.connect()``, the same
conversation against the same kind of server: from turn 2 on, the parent's
whole context is ``cached_tokens`` and only the new input ``cache_write_tokens``
when the server still holds the parent's tokens (the process-wide HTTP token
cache, on by default); 0 cached when it does not (another key's parent, an
evicted entry, the cache switched off).
"""

from __future__ import annotations

import itertools
from typing import Any

import openai
import pytest
import trio

from longresponse.serve.http.token_cache import HTTPTokenCache
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


def _token_cache(running: Any) -> HTTPTokenCache:
    cache = running.app.parts.http.token_cache
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
    running = make_server()  # the defaults: the token cache on
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
    assert _token_cache(running).hits == 2


async def test_without_the_token_cache_every_http_input_token_is_written(
    make_server: Any,
) -> None:
    running = make_server(http_token_cache=False)
    assert running.app.parts.http.token_cache is None
    usage = [_usage(r) for r in await trio.to_thread.run_sync(http_chain, running, 3)]
    assert [(cached, written) for _, cached, written in usage] == [(0, n) for n, _, _ in usage]
    assert usage[2][0] > usage[1][0] > usage[0][0]


async def test_an_evicted_parent_reports_nothing_cached(make_server: Any) -> None:
    # Room for one first turn's tokens (about 60 tokens of 4 bytes), not two.
    running = make_server(http_token_cache_bytes=400)
    cache = _token_cache(running)
    (first_a,) = await trio.to_thread.run_sync(http_chain, running, 1)
    (first_b,) = await trio.to_thread.run_sync(http_chain, running, 1)
    assert len(cache) == 1  # b's turn pushed a's out
    assert cache.nbytes <= 400
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
    cache = _token_cache(running)
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
    # The entries are per key: a response id is found only under its owner.
    keys = running.app.parts.http.keys
    owner_one, owner_two = keys.owner("Bearer key-one"), keys.owner("Bearer key-two")
    assert cache.get(owner_two, one[1].id) is None
    assert cache.get(owner_one, one[1].id) is not None


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
    assert _token_cache(running).hits == 1  # found and rendered from, not counted cached
