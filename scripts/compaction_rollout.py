"""A long append rollout with compaction against llama-server in a 2,048-token window.

    PYTHONPATH=. .venv/bin/python scripts/compaction_rollout.py [TURNS] [THRESHOLD]

Starts llama-server (the engine ``make engine`` builds) with one slot of
2,048 tokens and ``longresponse serve`` in front of it (docs/REAL_MODELS.md's
TOML, ``context_window = 2048``), then runs one append-mode rollout of TURNS
tool calls (100) with ``context_management`` at THRESHOLD (1,000), answering
each call with a forecast. It prints every prompt the engine was sent (from
its ``-lv 4`` log: ``task.n_tokens``), the windows after each compaction, the
summary texts' lengths and the time, and the last summary as the engine
wrote it. A THRESHOLD of 0 runs it without compaction. docs/REAL_MODELS.md
("Compaction: the engine's own summary") has the figures of a run;
``tests/llama/test_compaction.py`` runs 50 turns of it.
"""

import json
import pathlib
import re
import sys
import tempfile
import time

import trio

from longresponse.client import connect
from longresponse.engine.compaction import CompactionKey
from longresponse.engine.render import encode
from longresponse.engine.summary import SUMMARY_INTRO
from longresponse.llama_server import SERVED_NAME, LlamaEngine, LlamaServer
from longresponse.server_process import ServerProcess
from protocol.events import OutputItemDone, ResponseDone
from protocol.items import Compaction, FunctionCall, Message, item_text

SECRET = "compaction rollout key"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def forecast(call: FunctionCall) -> str:
    try:
        city = json.loads(call.arguments).get("city", "there")
    except (ValueError, AttributeError):
        city = "there"
    return f"{city}: sunny, 21 C, light wind from the west, humidity 40 percent."


async def rollout(url: str, turns: int, threshold: int) -> tuple[str, int, list[Compaction]]:
    """The rollout: its final status, the calls answered, its compaction items."""
    compactions: list[Compaction] = []
    calls = 0
    async with connect(url) as client:
        await client.create(
            model=SERVED_NAME,
            input="What is the weather in Paris, then in every city you know?",
            tools=[WEATHER],
            temperature=0,
            max_tool_calls=turns,
            max_output_tokens=20_000,
            context_management=(
                [{"type": "compaction", "compact_threshold": threshold}] if threshold else None
            ),
        )
        while True:
            events = await client.until_done(timeout=600)
            done = events[-1]
            assert isinstance(done, ResponseDone), done
            compactions += [
                e.item
                for e in events
                if isinstance(e, OutputItemDone) and isinstance(e.item, Compaction)
            ]
            response = done.response
            if response.status != "requires_action":
                details = response.incomplete_details or response.error
                return f"{response.status} {details or ''}".strip(), calls, compactions
            pending = response.required_action.call_ids  # type: ignore[union-attr]
            outputs = [
                {"type": "function_call_output", "call_id": c.call_id, "output": forecast(c)}
                for c in response.output
                if isinstance(c, FunctionCall) and c.call_id in pending
            ]
            calls += len(outputs)
            await client.append(outputs)


def report(sent: list[int], compactions: list[Compaction], threshold: int) -> None:
    summaries = [i for i in range(len(sent) - 1) if sent[i + 1] < sent[i]]
    windows = [sent[i + 1] for i in summaries]
    growth = max(
        (
            sent[i + 1] - sent[i]
            for i in range(len(sent) - 1)
            if i not in summaries and i + 1 not in summaries
        ),
        default=0,
    )
    turns = [p for i, p in enumerate(sent) if i not in summaries]
    print(f"engine prompts ({len(sent)}): {sent}")
    print(f"turn prompts: max {max(turns)}; summary turns': {[sent[i] for i in summaries]}")
    print(f"largest prompt {max(sent)}; threshold {threshold} + one turn ({growth})")
    print(f"windows after compaction: {windows}")
    key = CompactionKey.derive(SECRET)
    texts = []
    for item in compactions:
        for message in key.open(item.encrypted_content, ""):
            text = item_text(message.content) if isinstance(message, Message) else ""
            if text.startswith(SUMMARY_INTRO):
                texts.append(text[len(SUMMARY_INTRO) :].strip())
    chars = [len(t) for t in texts]
    tokens = [len(encode(t)) for t in texts]
    print(f"summaries: {len(texts)}, {min(chars)}-{max(chars)} characters, ", end="")
    print(f"{min(tokens)}-{max(tokens)} tokens")
    print(f"the last, as written:\n{texts[-1]}")


def main() -> None:
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    threshold = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    with LlamaServer(LlamaEngine.from_cache(), "-lv", "4", parallel=1, context=2048) as engine:
        config = pathlib.Path(tempfile.mkdtemp()) / "llama.toml"
        config.write_text(engine.gateway_config())
        flags = ("--config", str(config), "--store", "memory://", "--compaction-key", SECRET)
        with ServerProcess(*flags) as gateway:
            started = time.monotonic()
            status, calls, compactions = trio.run(rollout, gateway.url, turns, threshold)
            elapsed = time.monotonic() - started
        sent = [int(n) for n in re.findall(r"new prompt, .*task\.n_tokens = (\d+)", engine.log())]
    print(f"{status}: {calls} calls answered, {len(compactions)} compactions, {elapsed:.0f} s")
    if compactions:
        report(sent, compactions, threshold)
    else:
        print(f"engine prompts ({len(sent)}): {sent}")


if __name__ == "__main__":
    main()
