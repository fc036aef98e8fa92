"""Compaction against the real engine: a long append rollout in a 2,048-token window.

llama-server with one slot of 2,048 tokens (``--parallel 1 --ctx-size 2048``)
behind the gateway as docs/REAL_MODELS.md configures it (its
``context_window`` is the slot's 2,048). Without compaction such a rollout
fails within a dozen turns (``context_length_exceeded``); with
``compact_threshold`` 1,000 it goes on, and each compaction's summary is the
engine's own text, written in a summary turn. What the engine was sent is
read from its own log (``-lv 4`` logs each task's prompt as ``task.n_tokens``).
``scripts/compaction_rollout.py`` runs the same rollout for 100 turns and
docs/REAL_MODELS.md has its figures.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from longresponse.client import connect
from longresponse.engine.compaction import CompactionKey
from longresponse.engine.summary import SUMMARY_INTRO
from longresponse.llama_server import LlamaEngine, LlamaServer
from protocol.events import OutputItemDone, ResponseDone
from protocol.items import Compaction, FunctionCall, Message, item_text
from tests.llama.conftest import LOOP_TIMEOUT, MODEL, WEATHER, gateway_backends

pytestmark = pytest.mark.timeout(LOOP_TIMEOUT)

#: Tool calls in the rollout, the most that keep the test within about a
#: minute on this two-core machine at a load average near 2: 30 took 32 s, 45
#: took 46 s, 50 took 57 s (10 compactions). The 100 of the target take about
#: 117 s (20 compactions): scripts/compaction_rollout.py.
TURNS = 50
THRESHOLD = 1000
#: The engine's slot: its whole context, the gateway's ``context_window``.
WINDOW = 2048
SECRET = "compaction test key"
#: Seconds one turn (or a turn and its summary) may take on two busy cores.
TURN = 180.0


def forecast(call: FunctionCall) -> str:
    try:
        city = json.loads(call.arguments).get("city", "there")
    except (ValueError, AttributeError):
        city = "there"
    return f"{city}: sunny, 21 C, light wind from the west, humidity 40 percent."


def prompts(engine: LlamaServer) -> list[int]:
    """The prompt of every task the engine ran, in its own tokens, in order."""
    return [int(n) for n in re.findall(r"new prompt, .*task\.n_tokens = (\d+)", engine.log())]


@pytest.mark.slow  # 50 real turns and their 10 compactions: about a minute
async def test_a_long_rollout_compacts_with_the_engines_summary_within_its_window(
    make_server: Any, llama_engine: LlamaEngine, tmp_path: Path, caplog: Any
) -> None:
    started = time.monotonic()
    with LlamaServer(llama_engine, "-lv", "4", parallel=1, context=WINDOW) as engine:
        gateway = make_server(
            store="memory://", backends=gateway_backends(engine, tmp_path), compaction_key=SECRET
        )
        compactions: list[Compaction] = []
        calls = 0
        async with connect(gateway.url) as client:
            await client.create(
                model=MODEL,
                input="What is the weather in Paris, then in every city you know?",
                tools=[WEATHER],
                temperature=0,
                max_tool_calls=TURNS,
                max_output_tokens=20_000,
                context_management=[{"type": "compaction", "compact_threshold": THRESHOLD}],
            )
            while True:
                events = await client.until_done(timeout=TURN)
                done = events[-1]
                assert isinstance(done, ResponseDone), done
                compactions += [
                    e.item
                    for e in events
                    if isinstance(e, OutputItemDone) and isinstance(e.item, Compaction)
                ]
                response = done.response
                if response.status != "requires_action":
                    break
                pending = response.required_action.call_ids  # type: ignore[union-attr]
                outputs = [
                    {"type": "function_call_output", "call_id": c.call_id, "output": forecast(c)}
                    for c in response.output
                    if isinstance(c, FunctionCall) and c.call_id in pending
                ]
                calls += len(outputs)
                await client.append(outputs)
        sent = prompts(engine)
    elapsed = time.monotonic() - started

    # It completes: every call made and answered, then the answer.
    assert response.status == "completed", (response.error, response.incomplete_details)
    assert calls == TURNS
    assert isinstance(response.output[-1], Message)
    assert len(compactions) >= 3

    # One summary turn per compaction, beside the rollout's own turns; each is
    # followed by the turn over its window, the smaller prompt.
    assert len(sent) == TURNS + 1 + len(compactions)
    summaries = [i for i in range(len(sent) - 1) if sent[i + 1] < sent[i]]
    assert len(summaries) == len(compactions)
    windows = [sent[i + 1] for i in summaries]
    turns = [p for i, p in enumerate(sent) if i not in summaries]
    growth = max(
        sent[i + 1] - sent[i]
        for i in range(len(sent) - 1)
        if i not in summaries and i + 1 not in summaries and sent[i + 1] > sent[i]
    )
    # No prompt the engine got, the summary turns' included, passes the
    # threshold by more than one turn, and the window after each compaction
    # stays about half the threshold (it does not grow with the rollout).
    assert max(sent) <= THRESHOLD + growth, (sent, growth)
    assert max(turns) <= THRESHOLD
    assert max(windows) <= THRESHOLD // 2 + growth, windows

    # Each summary is the engine's text (the deterministic one lists the outputs
    # it read instead), and no summary turn failed over to it.
    key = CompactionKey.derive(SECRET)
    for item in compactions:
        said = [
            item_text(m.content)
            for m in key.open(item.encrypted_content, "")
            if isinstance(m, Message) and item_text(m.content).startswith(SUMMARY_INTRO)
        ]
        assert len(said) == 1
        assert said[0].startswith(SUMMARY_INTRO + "\n")
        assert "tool outputs: " not in said[0]
        assert len(said[0]) > len(SUMMARY_INTRO) + 20
    assert "summary turn" not in caplog.text
    print(
        f"{TURNS} turns, {len(compactions)} compactions, prompts up to {max(sent)} "
        f"(threshold {THRESHOLD}, a turn {growth}), windows {min(windows)}-{max(windows)}, "
        f"{elapsed:.0f} s"
    )
