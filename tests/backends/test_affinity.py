"""One affinity key per conversation, and llama.cpp slots pinned only while free.

The engine is the raw-socket stand-in (:class:`tests.support.engine_peer.StandIn`),
which records the headers and body of every request the gateway's real
Chat Completions client sends it; the clients at the front are the official
``openai`` SDK over HTTP. The real engine's side of it (what the cache reuses)
is ``tests/llama/test_cache_reuse.py``.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from longresponse.backends.chat import home_slot
from longresponse.engine.sampling import affinity_key
from tests.backends.test_backend_chat import ADD, chat_backend, gateway
from tests.conftest import openai_client
from tests.support.engine_peer import StandIn, answer, choice, record

HEADER = "x-longresponse-affinity"
USAGE = record({"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 2}})


def text_answer() -> bytes:
    return answer(choice({"content": "ok"}), choice(finish="stop"), USAGE, record("[DONE]"))


def call_answer(number: int) -> bytes:
    call = {"index": 0, "id": f"call_{number}", "type": "function"}
    call["function"] = {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    return answer(
        choice({"tool_calls": [call]}), choice(finish="tool_calls"), USAGE, record("[DONE]")
    )


@pytest.fixture
def engine() -> Iterator[StandIn]:
    """Odd requests answer with a call, even ones with text."""

    def script(number: int, body: dict[str, Any]) -> list[Any]:
        last = body["messages"][-1]
        return [text_answer() if last["role"] == "tool" else call_answer(number)]

    with StandIn(script) as peer:
        yield peer


def chain(client: Any, turns: int, **extra: Any) -> str:
    """An HTTP chain of ``turns`` responses, each answering the last one's call;
    the id of its first response."""
    first = response = client.responses.create(
        model="engine", input="Add 1 and 2.", tools=[ADD], store=True, **extra
    )
    for _ in range(turns - 1):
        (call,) = [item for item in response.output if item.type == "function_call"]
        response = client.responses.create(
            model="engine",
            previous_response_id=response.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "3"}],
            tools=[ADD],
            store=True,
            **extra,
        )
        if not any(item.type == "function_call" for item in response.output):
            response = client.responses.create(
                model="engine",
                previous_response_id=response.id,
                input="Again.",
                tools=[ADD],
                store=True,
                **extra,
            )
    return str(first.id)


@pytest.mark.slow  # six stored HTTP turns through a stand-in engine
def test_an_http_chain_keeps_one_key_for_its_whole_life(make_server: Any, engine: StandIn) -> None:
    """Every request of a stored HTTP chain is hydrated in a new rollout; each
    still carries the key of the chain's first response, and another chain
    carries another."""
    client = openai_client(gateway(make_server, engine.url))
    first = chain(client, 4)
    keys = [headers[HEADER] for headers in engine.headers]
    assert len(keys) >= 4
    assert set(keys) == {affinity_key(None, first)}
    other = chain(client, 2)
    later = {headers[HEADER] for headers in engine.headers[len(keys) :]}
    assert later == {affinity_key(None, other)}
    assert affinity_key(None, other) != affinity_key(None, first)


def test_a_conversations_turns_share_its_key(make_server: Any, engine: StandIn) -> None:
    """Turns in a conversation (``conversation``, no ``previous_response_id``)
    are each rebuilt from the store; all carry the key of the conversation's id."""
    client = openai_client(gateway(make_server, engine.url))
    conv = client.conversations.create()
    asked = client.responses.create(
        model="engine", input="Add 1 and 2.", tools=[ADD], conversation=conv.id
    )
    (call,) = [item for item in asked.output if item.type == "function_call"]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "3"}
    client.responses.create(model="engine", input=[output], tools=[ADD], conversation=conv.id)
    keys = [headers[HEADER] for headers in engine.headers]
    assert len(keys) == 2
    assert set(keys) == {affinity_key(None, conv.id)}
    assert engine.requests[-1]["messages"][-1]["role"] == "tool"


@pytest.mark.slow  # four stored HTTP turns through a stand-in engine
def test_prompt_cache_key_names_the_key_across_chains(make_server: Any, engine: StandIn) -> None:
    """Conversations the client gives one ``prompt_cache_key`` share one key
    (and one llama.cpp home slot), whatever their chains."""
    client = openai_client(gateway(make_server, engine.url, slots=4))
    chain(client, 2, prompt_cache_key="agent-7")
    chain(client, 2, prompt_cache_key="agent-7")
    key = affinity_key("agent-7", "")
    assert {headers[HEADER] for headers in engine.headers} == {key}
    assert len(key) == 32
    assert int(key, 16) >= 0
    slot = home_slot(chat_backend(engine.url, slots=4), key)
    assert {body["id_slot"] for body in engine.requests} == {slot}
    assert affinity_key("agent-8", "") != key
    assert affinity_key("agent-7", "resp_1") == key  # the client's key wins
    assert affinity_key(None, "") == ""


def keys_homed_at(config: Any) -> dict[int, list[str]]:
    """``prompt_cache_key`` values whose home slot is each of ``config``'s slots."""
    found: dict[int, list[str]] = {}
    for n in range(100):
        slot = home_slot(config, affinity_key(f"k{n}", ""))
        assert slot is not None
        found.setdefault(slot, []).append(f"k{n}")
    return found


def test_a_slot_is_pinned_only_while_it_is_free(make_server: Any) -> None:
    """With ``slots = 2``: a conversation holds its home slot while it is free;
    one whose home slot is taken, and any while the backend's turns fill as
    many slots as there are, is left to the engine (no ``id_slot``); once they
    end, a slot is pinned again."""
    arrived = [threading.Event() for _ in range(4)]
    release = threading.Event()

    def script(number: int, body: dict[str, Any]) -> list[Any]:
        arrived[min(number, 4) - 1].set()
        if number <= 3:
            assert release.wait(30)
        return [text_answer()]

    with StandIn(script) as peer:
        homes = keys_homed_at(chat_backend(peer.url, slots=2))
        client = openai_client(gateway(make_server, peer.url, slots=2))

        def ask(key: str) -> Any:
            return client.responses.create(model="engine", input="hi", prompt_cache_key=key)

        # Slot 0's conversation, another homed at slot 0, then slot 1's while
        # two turns are in flight; each waits in the engine until all arrived.
        keys = (homes[0][0], homes[0][1], homes[1][0])
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            running = []
            for number, key in enumerate(keys):
                running.append(pool.submit(ask, key))
                assert arrived[number].wait(30)
            release.set()
            for future in running:
                assert future.result().status == "completed"
        ask(homes[1][0])
    assert [body.get("id_slot") for body in peer.requests] == [0, None, None, 1]


def test_a_client_resending_everything_keeps_its_conversations_key(
    make_server: Any, engine: StandIn
) -> None:
    """A client that never chains (the whole conversation in every request, no
    store) starts a new rollout each time; prefix reuse finds the conversation
    it resends, and its key with it: every request carries the key of the
    conversation's first response, as a chain's would."""
    client = openai_client(gateway(make_server, engine.url))
    conversation: list[Any] = [{"role": "user", "content": "Add 1 and 2."}]
    first = None
    for _ in range(3):
        response = client.responses.create(
            model="engine", input=conversation, tools=[ADD], store=False
        )
        first = first or response
        conversation += [item.model_dump(exclude_unset=True) for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        if calls:
            conversation.append(
                {"type": "function_call_output", "call_id": calls[0].call_id, "output": "3"}
            )
        else:
            conversation.append({"role": "user", "content": "Again."})
    keys = [headers[HEADER] for headers in engine.headers]
    assert len(keys) == 3
    assert first is not None
    assert set(keys) == {affinity_key(None, first.id)}
