"""The engine's prompt cache stays warm behind the gateway on the
configuration docs/REAL_MODELS.md recommends for llama.cpp
(``cache_prompt = true``, ``slots`` = its ``--parallel``).

Issue 22 saw pinning every turn to its key's slot (``id_slot``) hurt: an
HTTP chain, whose requests each carried a new random key, landed on a slot
at random every turn (70-78% of the prefix reused), and six rollouts over
two slots re-evaluated about half of theirs. Now a chain keeps one key and a
turn is pinned only while its slot is free. The figures are the engine's own
(its usage, billed as it came): a continuation's prefix is the previous
turn's prompt. ``longresponse bench-engine`` measures the same at length
(docs/BENCHMARKS.md).

llama-server itself drops a slot's context without saving it when the next
prompt shares more than half of it: rollouts whose context is mostly a
shared prefix (instructions and tools) overwrite each other's in their first
turns, with or without the gateway; the HTTP chain has a task of its own
long enough that the engine saves a slot's context before reusing it. More
rollouts than slots are measured by ``bench-engine`` (docs/BENCHMARKS.md,
"Not settled": a turn pinned home while its context sits in the other idle
slot loses it).
"""

from __future__ import annotations

import itertools
from typing import Any

import openai
import pytest
import trio

from longresponse.bench.engine import (
    INSTRUCTIONS,
    TOOLS,
    tool_output,
)
from longresponse.config import BackendConfig
from longresponse.llama_server import LlamaServer
from tests.conftest import openai_client

WORDS = 60
MAX_TOKENS = 48
#: A chain's turns: with a random slot every turn, 1 in 32 would find its own.
CHAIN_TURNS = 6
#: Tries of a turn sent on a connection the engine had closed (:func:`stale`).
STALE_RETRIES = 3
#: The share of each continuation's prefix the engine must find cached. The
#: engine keeps all of it (its slot, or its host-memory prompt cache);
#: pinned to busy slots it kept about half.
REUSED = 0.9
#: About 20 s on a quiet machine; a loaded one prefills ten to twenty times slower.
pytestmark = pytest.mark.timeout(600)


def gateway(make_server: Any, llama: LlamaServer) -> Any:
    backend = BackendConfig(
        name="smollm2",
        kind="chat",
        base_url=llama.base_url,
        context_window=llama.context,
        max_output_tokens=MAX_TOKENS,
        cache_prompt=True,
        slots=llama.parallel,
    )
    return make_server(store="memory://", backends=(backend,))


def stale(message: str) -> bool:
    """llama-server closes the connection after a streamed answer while it says
    keep-alive; a turn sent on it fails before reaching the engine (issue 22,
    defect 1, mended apart). Such a turn is sent again: what is checked here
    is the cache, which it never touched."""
    return "closed the connection before answering" in message


def task(number: int) -> str:
    """A task of its own for each rollout, a few hundred tokens long."""
    return f"Task {number}: find where the cache is kept. Notes:\n" + tool_output(number, 0, 200)


def check_reuse(prompts: list[tuple[int, int]], turns: int) -> None:
    """(prompt, cached) per turn of one rollout: each continuation found its prefix."""
    assert len(prompts) == turns
    for (before, _), (prompt, cached) in itertools.pairwise(prompts):
        assert prompt > before
        assert cached >= REUSED * before, prompts


def http_chain(client: Any, number: int) -> list[tuple[int, int]]:
    turns: list[tuple[int, int]] = []
    previous = None
    new_input: Any = task(number)
    for turn in range(1, CHAIN_TURNS + 1):
        for _ in range(STALE_RETRIES):
            try:
                response = client.responses.create(
                    model="smollm2",
                    instructions=INSTRUCTIONS,
                    input=new_input,
                    tools=TOOLS,
                    tool_choice="required",
                    temperature=0,
                    previous_response_id=previous,
                    store=True,
                )
            except openai.APIStatusError as exc:
                if exc.status_code != 502 or not stale(str(exc)):
                    raise
            else:
                break
        assert response.status == "completed"
        usage = response.usage
        turns.append((usage.input_tokens, usage.input_tokens_details.cached_tokens))
        calls = [item for item in response.output if item.type == "function_call"]
        assert calls
        previous = response.id
        new_input = [
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": tool_output(number, turn, WORDS),
            }
            for call in calls
        ]
    return turns


async def test_an_http_chain_stays_on_its_cache(make_server: Any, llama: LlamaServer) -> None:
    """Each request of a stored chain is a new rollout in the gateway; with one
    key for the chain it is pinned to one slot every turn, which holds its prefix."""
    client = openai_client(gateway(make_server, llama))
    turns = await trio.to_thread.run_sync(http_chain, client, 100)
    check_reuse(turns, CHAIN_TURNS)
