"""``longresponse bench-engine``: the two-hop benchmark on a real engine.

Theory of operation
-------------------
llama.cpp's ``llama-server`` with SmolLM2-135M (``scripts/engine.sh`` builds
it; :mod:`longresponse.llama_server` starts it) is the engine. One agent
loop is a rollout of ``--turns`` model turns: the task, then on every turn
the model calls a tool (``tool_choice: "required"``: the functionary
template's grammar forces the call) and the client answers it with a tool
output of about ``--tool-output-tokens`` tokens, deterministic per rollout
and turn. The same loop is driven along each path, with the same messages,
``temperature: 0`` and the same per-turn output cap:

``direct``   the client talks Chat Completions to the engine itself (httpx,
             streamed, the whole conversation each turn): the baseline.
``append``   through the gateway, one long-running Response over the
             append-mode WebSocket (the project's trio client).
``ws``       through the gateway, the shipped WebSocket (the official SDK's
             ``responses.connect()``, ``previous_response_id``, ``store: false``).
``http``     through the gateway, ``POST /v1/responses`` streamed (the SDK,
             ``previous_response_id``, ``store: true``).

Each gateway configuration (``--configs``: ``default`` is the bare chat
backend; ``slots`` adds what docs/REAL_MODELS.md recommends for llama.cpp,
``cache_prompt = true`` and ``slots`` equal to the engine's ``--parallel``)
runs in its own ``longresponse serve`` process, all started side by side
before anything is measured.

Two scenarios, each path's rollouts taking turns so that drift in a shared
machine hits all of them alike:

**one** rollout at a time, ``--repeats`` rounds. Per turn: time to first
token (the first sign of the call: a ``tool_calls`` delta, an item added),
end to end (the request sent to the call's arguments done: the turn's
terminal event), the engine's own time for the request (its log's
``total time``; one request at a time, so its lines are the turn's), the
prompt tokens the engine evaluated and found cached (its usage, billed
as it came). The time outside the engine is end to end less the engine's;
the gateway's own overhead per turn is a path's outside time less the direct
client's. The gateway's CPU per turn is its ``process_cpu_seconds_total``
(``/metrics``) over the path's rounds, per turn; the engine's from
``/proc``.

**many**: ``--concurrency`` rollouts at once over the engine's ``--slots``
slots, per path and configuration: the wall time and the cache figures.

A continuation's *prefix* is the previous turn's prompt, which its prompt
extends; *reused* is the share of that prefix the engine found cached
(``cached / previous prompt``, at most 1). The evaluated tokens are the
prompt less the cached: the new tool output and call, plus any prefix
the engine had lost.

Results go to ``--out``: ``turns.json`` (every turn) and ``summary.md``
(the tables), printed too.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import httpx
import trio

from longresponse.llama_server import SERVED_NAME, LlamaEngine, LlamaServer
from longresponse.server_process import ServerProcess

from .scrape import unlabelled_samples

__all__ = [
    "CONFIGS",
    "INSTRUCTIONS",
    "PATHS",
    "TOOLS",
    "Loop",
    "TurnRecord",
    "add_arguments",
    "main",
    "run_engine_bench",
    "tool_output",
]

PATHS: Final = ("direct", "append", "ws", "http")
#: Gateway configurations: name -> the chat backend's extra settings (``slots``
#: is filled in with the engine's slot count).
CONFIGS: Final = {
    "default": {},
    "slots": {"cache_prompt": True, "slots": -1},
}
MODEL: Final = SERVED_NAME
INSTRUCTIONS: Final = (
    "You are a coding agent. Use the tools to read the files of the project, "
    "one call at a time, and keep going until you understand it."
)
TOOLS: Final = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a text file of the project.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "type": "function",
        "name": "search",
        "description": "Find lines containing a string.",
        "parameters": {
            "type": "object",
            "properties": {"pattern": {"type": "string"}},
            "required": ["pattern"],
        },
    },
]
TURN_TIMEOUT: Final = 300.0
#: A turn the gateway failed (``upstream_unavailable``) is tried again up to this often.
MAX_RETRIES: Final = 3
_WORDS: Final = (
    "rollout response append pause engine token cache prefix slot socket stream "
    "event item call output model turn context window budget usage server client "
    "request record store chain queue lane segment reply sampler backend config "
    "def return class import async await yield self value index length count"
).split()
_TIMING: Final = re.compile(r"\btotal time\s*=\s*([\d.]+) ms")


def tool_output(rollout: int, turn: int, words: int) -> str:
    """A tool's answer of ``words`` words, deterministic per ``rollout`` and ``turn``,
    shaped as numbered lines of code (about 1.8 tokens a word with SmolLM2's
    tokenizer)."""
    rng = random.Random(rollout * 1000 + turn)
    lines: list[str] = []
    line: list[str] = []
    for n in range(words):
        line.append(rng.choice(_WORDS))
        if len(line) == 9 or n == words - 1:
            lines.append(f"{len(lines) + 1:4d}  " + " ".join(line))
            line = []
    return f"# file {rollout}-{turn}\n" + "\n".join(lines)


@dataclasses.dataclass(slots=True)
class TurnRecord:
    """One model turn of one rollout, as measured."""

    scenario: str
    path: str
    config: str
    rollout: int
    turn: int
    ttft_ms: float
    e2e_ms: float
    prompt_tokens: int
    cached_tokens: int
    #: The engine's own time for the request (its log), where known.
    engine_ms: float | None = None
    #: Attempts that failed before this one (an engine's transient failure).
    retries: int = 0

    @property
    def evaluated(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclasses.dataclass(frozen=True, slots=True)
class Loop:
    """What every path's rollout is: turns, tool output size, output cap."""

    turns: int
    words: int
    max_tokens: int


# --- the paths --------------------------------------------------------------------


def _function_calls(output: Sequence[Any]) -> list[Any]:
    return [item for item in output if getattr(item, "type", None) == "function_call"]


def _call_outputs(calls: Sequence[Any], loop: Loop, number: int, turn: int) -> list[Any]:
    """The next input of a Responses path: an output for each of the turn's calls."""
    return [
        {
            "type": "function_call_output",
            "call_id": call.call_id,
            "output": tool_output(number, turn, loop.words),
        }
        for call in calls
    ]


def _sdk_next_input(path: str, response: Any, loop: Loop, number: int, turn: int) -> list[Any]:
    """A completed SDK turn's calls answered; ``RuntimeError`` if it made none."""
    calls = _function_calls(response.output)
    if response.status != "completed" or not calls:
        raise RuntimeError(f"{path} turn {turn}: {response.status}, no call")
    return _call_outputs(calls, loop, number, turn)


def direct_rollout(
    base_url: str, loop: Loop, number: int, label: tuple[str, str]
) -> list[TurnRecord]:
    """The baseline: Chat Completions straight to the engine."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": f"Task {number}: find where the cache is kept."},
    ]
    tools = [
        {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS
    ]
    records = []
    # llama-server closes the connection after each streamed answer (while it
    # says keep-alive): a fresh connection per turn, as the engine wants.
    fresh = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(timeout=TURN_TIMEOUT, limits=fresh) as http:
        for turn in range(1, loop.turns + 1):
            body = {
                "model": MODEL,
                "messages": messages,
                "tools": tools,
                "tool_choice": "required",
                "parallel_tool_calls": True,
                "temperature": 0,
                "max_completion_tokens": loop.max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            calls: dict[int, dict[str, Any]] = {}
            usage: dict[str, Any] = {}
            first = None
            started = time.perf_counter()
            with http.stream("POST", f"{base_url}/chat/completions", json=body) as answer:
                answer.raise_for_status()
                for line in answer.iter_lines():
                    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices", ()):
                        for piece in choice.get("delta", {}).get("tool_calls") or ():
                            first = first or time.perf_counter()
                            call = calls.setdefault(
                                piece.get("index", 0),
                                {
                                    "id": "",
                                    "type": "function",
                                    "function": {"name": "", "arguments": ""},
                                },
                            )
                            call["id"] = piece.get("id") or call["id"]
                            function = piece.get("function", {})
                            call["function"]["name"] += function.get("name") or ""
                            call["function"]["arguments"] += function.get("arguments") or ""
            ended = time.perf_counter()
            if not calls:
                raise RuntimeError(f"direct turn {turn}: the engine called no tool")
            details = usage.get("prompt_tokens_details") or {}
            records.append(
                TurnRecord(
                    label[0], "direct", label[1], number, turn,
                    ttft_ms=1000 * ((first or ended) - started),
                    e2e_ms=1000 * (ended - started),
                    prompt_tokens=int(usage.get("prompt_tokens", 0)),
                    cached_tokens=int(details.get("cached_tokens", 0)),
                )
            )  # fmt: skip
            ordered = [calls[i] for i in sorted(calls)]
            messages.append({"role": "assistant", "content": None, "tool_calls": ordered})
            for call in ordered:
                text = tool_output(number, turn, loop.words)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
    return records


def _request(loop: Loop, number: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "instructions": INSTRUCTIONS,
        "tools": TOOLS,
        "tool_choice": "required",
        "temperature": 0,
    }


def append_rollout(
    ws_url: str, loop: Loop, number: int, label: tuple[str, str]
) -> list[TurnRecord]:
    """One long-running Response over the append-mode WebSocket."""
    from longresponse.client import connect
    from protocol.events import (
        ErrorEvent,
        FunctionCallArgumentsDelta,
        OutputItemAdded,
        ResponseDone,
    )
    from protocol.items import FunctionCall

    async def run() -> list[TurnRecord]:
        records = []
        seen_input = seen_cached = 0
        answered: set[str] = set()
        async with connect(ws_url) as client:
            started = time.perf_counter()
            await client.create(
                **_request(loop, number),
                input=f"Task {number}: find where the cache is kept.",
                max_output_tokens=loop.max_tokens * (loop.turns + 1),
            )
            for turn in range(1, loop.turns + 1):
                retries = 0
                while True:
                    first, failed = None, None
                    with trio.fail_after(TURN_TIMEOUT):
                        while True:
                            event = await client.next_event(timeout=None)
                            if first is None and isinstance(
                                event, OutputItemAdded | FunctionCallArgumentsDelta
                            ):
                                first = time.perf_counter()
                            if isinstance(event, ErrorEvent):
                                failed = event
                            if isinstance(event, ResponseDone):
                                break
                    ended = time.perf_counter()
                    response = event.response
                    usage = response.usage
                    assert usage is not None
                    cached = usage.input_tokens_details.cached_tokens
                    if failed is None:
                        break
                    # A failed turn leaves the Response paused: resume it.
                    retries += 1
                    if retries > MAX_RETRIES or response.status != "requires_action":
                        raise RuntimeError(f"append turn {turn}: {failed}")
                    seen_input, seen_cached = usage.input_tokens, cached
                    started = time.perf_counter()
                    await client.append([])
                records.append(
                    TurnRecord(
                        label[0], "append", label[1], number, turn,
                        ttft_ms=1000 * ((first or ended) - started),
                        e2e_ms=1000 * (ended - started),
                        prompt_tokens=usage.input_tokens - seen_input,
                        cached_tokens=cached - seen_cached,
                        retries=retries,
                    )
                )  # fmt: skip
                seen_input, seen_cached = usage.input_tokens, cached
                pending = [
                    c
                    for c in response.output
                    if isinstance(c, FunctionCall) and c.call_id not in answered
                ]
                if response.status != "requires_action" or not pending:
                    raise RuntimeError(f"append turn {turn}: {response.status}, no call")
                answered.update(c.call_id for c in pending)
                if turn == loop.turns:
                    await client.cancel()
                    break
                outputs = _call_outputs(pending, loop, number, turn)
                started = time.perf_counter()
                await client.append(outputs)
        return records

    return trio.run(run)


def _retrying(path: str, turn: int, attempt: Callable[[], Attempt]) -> tuple[Attempt, int]:
    """An SDK turn, tried again while the gateway fails it (``response.failed``)."""
    for retries in range(MAX_RETRIES + 1):
        made = attempt()
        if made[0] is not None and made[0].status != "failed":
            return made, retries
    error = getattr(made[0], "error", None)
    raise RuntimeError(f"{path} turn {turn}: failed {MAX_RETRIES + 1} times: {error}")


#: One attempt at an SDK turn: its response (None if the stream ended without
#: one), when it was sent, its first output, its end.
Attempt = tuple[Any, float, float | None, float]
_FIRST: Final = ("response.output_item.added", "response.function_call_arguments.delta")
_ENDS: Final = ("response.completed", "response.incomplete", "response.failed")


def ws_rollout(http_url: str, loop: Loop, number: int, label: tuple[str, str]) -> list[TurnRecord]:
    """The shipped WebSocket, with the official SDK's ``responses.connect()``."""
    import openai

    client = openai.OpenAI(base_url=f"{http_url}/v1", api_key="bench", max_retries=0)
    records = []
    try:
        with client.responses.connect() as conn:
            previous = None
            new_input: Any = f"Task {number}: find where the cache is kept."
            for turn in range(1, loop.turns + 1):

                def attempt(
                    new_input: Any = new_input, previous: str | None = previous, turn: int = turn
                ) -> Attempt:
                    first, response = None, None
                    started = time.perf_counter()
                    conn.response.create(
                        **_request(loop, number),
                        input=new_input,
                        previous_response_id=previous,
                        store=False,
                        max_output_tokens=loop.max_tokens,
                    )
                    for event in conn:
                        if first is None and event.type in _FIRST:
                            first = time.perf_counter()
                        if event.type == "error":
                            raise RuntimeError(f"ws turn {turn}: {event}")
                        if event.type in _ENDS:
                            response = event.response
                            break
                    return response, started, first, time.perf_counter()

                made, retries = _retrying("ws", turn, attempt)
                records.append(_sdk_record("ws", label, number, turn, made, retries))
                response = made[0]
                new_input = _sdk_next_input("ws", response, loop, number, turn)
                previous = response.id
    finally:
        client.close()
    return records


def http_rollout(
    http_url: str, loop: Loop, number: int, label: tuple[str, str]
) -> list[TurnRecord]:
    """``POST /v1/responses`` streamed, chained with ``previous_response_id`` (stored)."""
    import openai

    client = openai.OpenAI(base_url=f"{http_url}/v1", api_key="bench", max_retries=0)
    records = []
    try:
        previous = None
        new_input: Any = f"Task {number}: find where the cache is kept."
        for turn in range(1, loop.turns + 1):

            def attempt(new_input: Any = new_input, previous: str | None = previous) -> Attempt:
                first, response = None, None
                started = time.perf_counter()
                stream = client.responses.create(
                    **_request(loop, number),
                    input=new_input,
                    previous_response_id=previous,
                    store=True,
                    stream=True,
                    max_output_tokens=loop.max_tokens,
                    timeout=TURN_TIMEOUT,
                )
                with stream:
                    for event in stream:
                        if first is None and event.type in _FIRST:
                            first = time.perf_counter()
                        if event.type in _ENDS:
                            response = event.response
                return response, started, first, time.perf_counter()

            made, retries = _retrying("http", turn, attempt)
            records.append(_sdk_record("http", label, number, turn, made, retries))
            response = made[0]
            new_input = _sdk_next_input("http", response, loop, number, turn)
            previous = response.id
    finally:
        client.close()
    return records


def _sdk_record(
    path: str, label: tuple[str, str], number: int, turn: int, made: Attempt, retries: int
) -> TurnRecord:
    response, started, first, ended = made
    usage = response.usage
    return TurnRecord(
        label[0], path, label[1], number, turn,
        ttft_ms=1000 * ((first or ended) - started),
        e2e_ms=1000 * (ended - started),
        prompt_tokens=usage.input_tokens,
        cached_tokens=usage.input_tokens_details.cached_tokens,
        retries=retries,
    )  # fmt: skip


# --- the run ----------------------------------------------------------------------

Rollout = Callable[[str, Loop, int, tuple[str, str]], list[TurnRecord]]
ROLLOUTS: Final[dict[str, Rollout]] = {
    "direct": direct_rollout,
    "append": append_rollout,
    "ws": ws_rollout,
    "http": http_rollout,
}


@dataclasses.dataclass(slots=True)
class Target:
    """Where one path of one configuration sends its rollouts."""

    path: str
    config: str
    address: str
    gateway: ServerProcess | None = None


def gateway_toml(base_url: str, settings: dict[str, Any], max_tokens: int) -> str:
    lines = [
        "[models.smollm2]",
        'kind = "chat"',
        f'base_url = "{base_url}"',
        "context_window = 8192",
        f"max_output_tokens = {max_tokens}",
        "first_token_timeout = 300",
    ]
    for key, value in settings.items():
        lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def engine_times(log: str) -> list[float]:
    """The ``total time`` of every request in a llama-server log, in order (ms)."""
    return [float(ms) for ms in _TIMING.findall(log)]


def cpu_seconds(pid: int) -> float:
    """A process's CPU time (user + system) from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gateway_cpu(gateway: ServerProcess) -> float:
    answer = httpx.get(f"{gateway.http_url}/metrics", timeout=10)
    answer.raise_for_status()
    return unlabelled_samples(answer.text)["process_cpu_seconds_total"]


def _address(target: Target, engine: LlamaServer) -> str:
    if target.gateway is None:
        return engine.base_url
    return target.gateway.url if target.path == "append" else target.gateway.http_url


def run_one(
    targets: Sequence[Target], engine: LlamaServer, loop: Loop, repeats: int
) -> tuple[list[TurnRecord], dict[tuple[str, str], dict[str, float]]]:
    """Scenario *one*: a rollout at a time, the targets taking turns each round."""
    records: list[TurnRecord] = []
    cpu: dict[tuple[str, str], dict[str, float]] = {}
    assert engine.process is not None
    for round_ in range(repeats):
        order = list(targets) if round_ % 2 == 0 else list(reversed(targets))
        for target in order:
            key = (target.path, target.config)
            spent = cpu.setdefault(key, {"gateway": 0.0, "engine": 0.0, "turns": 0.0})
            number = len(records)  # a fresh conversation every time: nothing shared
            log_before = len(engine.log())
            engine_before = cpu_seconds(engine.process.pid)
            gateway_before = gateway_cpu(target.gateway) if target.gateway else 0.0
            made = ROLLOUTS[target.path](
                _address(target, engine), loop, number, ("one", target.config)
            )
            if target.gateway is not None:
                spent["gateway"] += gateway_cpu(target.gateway) - gateway_before
            spent["engine"] += cpu_seconds(engine.process.pid) - engine_before
            spent["turns"] += len(made)
            times = engine_times(engine.log()[log_before:])
            for record, ms in zip(made, times[-len(made) :], strict=False):
                record.engine_ms = ms
            records.extend(made)
            print(f"one: round {round_ + 1} {target.path}/{target.config}",
                  file=sys.stderr, flush=True)  # fmt: skip
    return records, cpu


def run_many(
    targets: Sequence[Target], engine: LlamaServer, loop: Loop, concurrency: int
) -> tuple[list[TurnRecord], dict[tuple[str, str], float]]:
    """Scenario *many*: ``concurrency`` rollouts at once, one target after another."""
    records: list[TurnRecord] = []
    walls: dict[tuple[str, str], float] = {}
    for target in targets:
        first = 10_000 + len(records)
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            futures = [
                pool.submit(
                    ROLLOUTS[target.path],
                    _address(target, engine),
                    loop,
                    first + n,
                    ("many", target.config),
                )
                for n in range(concurrency)
            ]
            for future in futures:
                records.extend(future.result())
        walls[(target.path, target.config)] = time.perf_counter() - started
        print(f"many: {target.path}/{target.config} {walls[(target.path, target.config)]:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    return records, walls


# --- the report -------------------------------------------------------------------


def continuations(records: Sequence[TurnRecord]) -> list[tuple[TurnRecord, TurnRecord]]:
    """(previous turn, turn) for every turn after the first of each rollout."""
    by_rollout: dict[tuple[str, str, str, int], list[TurnRecord]] = {}
    for record in records:
        by_rollout.setdefault((record.scenario, record.path, record.config, record.rollout), [])
        by_rollout[(record.scenario, record.path, record.config, record.rollout)].append(record)
    pairs: list[tuple[TurnRecord, TurnRecord]] = []
    for turns in by_rollout.values():
        turns.sort(key=lambda r: r.turn)
        pairs.extend(itertools.pairwise(turns))
    return pairs


def reused(previous: TurnRecord, turn: TurnRecord) -> float:
    """The share of the previous prompt (the continuation's prefix) found cached."""
    if previous.prompt_tokens <= 0:
        return 0.0
    return min(turn.cached_tokens, previous.prompt_tokens) / previous.prompt_tokens


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cache_row(pairs: Sequence[tuple[TurnRecord, TurnRecord]]) -> dict[str, float]:
    shares = [reused(p, t) for p, t in pairs]
    evaluated = [t.evaluated for _, t in pairs]
    return {
        "continuations": len(pairs),
        "evaluated_median": _median(evaluated),
        "evaluated_max": max(evaluated, default=0),
        "reused_min": min(shares, default=float("nan")),
        "reused_mean": statistics.fmean(shares) if shares else float("nan"),
        "prompt_last": max((t.prompt_tokens for _, t in pairs), default=0),
    }


def summarize(
    one: Sequence[TurnRecord],
    cpu: dict[tuple[str, str], dict[str, float]],
    many: Sequence[TurnRecord],
    walls: dict[tuple[str, str], float],
    *,
    loop: Loop,
    slots: int,
    concurrency: int,
    repeats: int,
) -> str:
    """The tables of ``summary.md``."""
    out = [
        f"Loop: {loop.turns} turns, tool outputs of {loop.words} words, at most "
        f"{loop.max_tokens} output tokens a turn; engine slots {slots}; "
        f"{repeats} rounds of one rollout; {concurrency} rollouts at once.",
        "",
        "### One rollout at a time (medians over turns 2-10 of every round)",
        "",
        "| path | config | TTFT ms | turn e2e ms | loop e2e s | vs direct | outside engine ms "
        "| gateway own ms | gateway CPU ms/turn | engine CPU ms/turn | evaluated/cont. "
        "| reused min | reused mean |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    keys = sorted({(r.path, r.config) for r in one}, key=lambda k: (PATHS.index(k[0]), k[1]))
    loops: dict[tuple[str, str], float] = {}
    outside: dict[tuple[str, str], float] = {}
    for key in keys:
        rows = [r for r in one if (r.path, r.config) == key]
        rounds = {r.rollout for r in rows}
        loops[key] = _median([sum(r.e2e_ms for r in rows if r.rollout == n) for n in rounds])
        later = [r for r in rows if r.turn > 1]
        outside[key] = _median([r.e2e_ms - r.engine_ms for r in later if r.engine_ms is not None])
    direct = next((k for k in keys if k[0] == "direct"), None)
    for key in keys:
        rows = [r for r in one if (r.path, r.config) == key]
        later = [r for r in rows if r.turn > 1]
        spent = cpu.get(key, {"gateway": 0.0, "engine": 0.0, "turns": 1.0})
        turns = max(spent["turns"], 1.0)
        cache = cache_row([pair for pair in continuations(rows)])
        versus = loops[key] / loops[direct] - 1 if direct else float("nan")
        own = outside[key] - outside[direct] if direct and key != direct else 0.0
        out.append(
            f"| {key[0]} | {key[1]} | {_median([r.ttft_ms for r in later]):.0f} "
            f"| {_median([r.e2e_ms for r in later]):.0f} | {loops[key] / 1000:.2f} "
            f"| {versus:+.1%} | {outside[key]:.1f} | {own:+.1f} "
            f"| {1000 * spent['gateway'] / turns:.1f} | {1000 * spent['engine'] / turns:.0f} "
            f"| {cache['evaluated_median']:.0f} | {cache['reused_min']:.2%} "
            f"| {cache['reused_mean']:.2%} |"
        )
    out += [
        "",
        f"### {concurrency} rollouts at once over {slots} slots",
        "",
        "| path | config | wall s | evaluated/cont. median | max | reused min | reused mean |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for key in sorted(walls, key=lambda k: (PATHS.index(k[0]), k[1])):
        rows = [r for r in many if (r.path, r.config) == key]
        cache = cache_row(continuations(rows))
        out.append(
            f"| {key[0]} | {key[1]} | {walls[key]:.1f} | {cache['evaluated_median']:.0f} "
            f"| {cache['evaluated_max']:.0f} | {cache['reused_min']:.2%} "
            f"| {cache['reused_mean']:.2%} |"
        )
    return "\n".join(out) + "\n"


# --- the command ------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, default=10, help="model turns per rollout")
    parser.add_argument(
        "--tool-output-words", type=int, default=220,
        help="words per tool output (about 1.8 tokens each with SmolLM2's tokenizer)",
    )  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=48, help="output cap per turn")
    parser.add_argument("--slots", type=int, default=2, help="the engine's --parallel")
    parser.add_argument("--threads", type=int, default=2, help="the engine's --threads")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of one rollout")
    parser.add_argument("--concurrency", type=int, default=6, help="rollouts at once")
    parser.add_argument(
        "--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}"
    )
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"gateway configs, of {', '.join(CONFIGS)}"
    )
    parser.add_argument(
        "--scenarios", default="one,many", help="one (a rollout at a time), many (concurrent)"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-engine"), help="results folder")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="CHECKOUT",
        help="also run each config's gateway from this checkout (labelled CONFIG@before), "
        "side by side with this one's",
    )
    parser.add_argument(
        "--baseline-configs",
        default=",".join(CONFIGS),
        help="the configs --baseline runs (comma-separated)",
    )


@contextlib.contextmanager
def _gateway(toml: Path, checkout: Path | None) -> Iterator[ServerProcess]:
    """A gateway with the chat backend of ``toml``, run from ``checkout`` if given
    (its ``longresponse`` first on the child's ``PYTHONPATH``)."""
    saved = os.environ.get("PYTHONPATH")
    if checkout is not None:
        os.environ["PYTHONPATH"] = str(checkout.resolve())
    try:
        server = ServerProcess("--config", str(toml), "--store", "memory://").start()
    finally:
        if checkout is not None:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved
    try:
        yield server
    finally:
        server.stop()


def run_engine_bench(args: argparse.Namespace) -> str:
    """Start the engine and the gateways, run the scenarios, write the results."""
    paths = [p for p in args.paths.split(",") if p]
    configs = [c for c in args.configs.split(",") if c]
    unknown = [p for p in paths if p not in PATHS] + [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"bench-engine: unknown path or config {unknown[0]!r}")
    loop = Loop(turns=args.turns, words=args.tool_output_words, max_tokens=args.max_tokens)
    engine_files = LlamaEngine.from_cache()
    with contextlib.ExitStack() as stack:
        engine = stack.enter_context(
            LlamaServer(engine_files, parallel=args.slots, threads=args.threads)
        )
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-engine-")))
        targets: list[Target] = []
        if "direct" in paths:
            targets.append(Target("direct", "-", engine.base_url))
        checkouts: list[tuple[str, Path | None]] = [("", None)]
        if args.baseline is not None:
            checkouts.append(("@before", args.baseline))
        for config in configs:
            settings = {k: (args.slots if v == -1 else v) for k, v in CONFIGS[config].items()}
            toml = folder / f"{config}.toml"
            toml.write_text(gateway_toml(engine.base_url, settings, args.max_tokens))
            for suffix, checkout in checkouts:
                if checkout is not None and config not in args.baseline_configs.split(","):
                    continue
                gateway = stack.enter_context(_gateway(toml, checkout))
                for path in paths:
                    if path != "direct":
                        targets.append(Target(path, config + suffix, gateway.http_url, gateway))
        scenarios = args.scenarios.split(",")
        # Warm-up: every target once, one turn (imports, the model's first load).
        warm = Loop(turns=2, words=loop.words, max_tokens=loop.max_tokens)
        for target in targets:
            ROLLOUTS[target.path](_address(target, engine), warm, 99_000, ("warm", target.config))
        one: list[TurnRecord] = []
        cpu: dict[tuple[str, str], dict[str, float]] = {}
        many: list[TurnRecord] = []
        walls: dict[tuple[str, str], float] = {}
        if "one" in scenarios:
            one, cpu = run_one(targets, engine, loop, args.repeats)
        if "many" in scenarios:
            many, walls = run_many(targets, engine, loop, args.concurrency)
    summary = summarize(
        one, cpu, many, walls, loop=loop, slots=args.slots,
        concurrency=args.concurrency, repeats=args.repeats,
    )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version()}
    (args.out / "turns.json").write_text(
        json.dumps(
            {
                "machine": machine,
                "loop": dataclasses.asdict(loop),
                "turns": [dataclasses.asdict(r) for r in [*one, *many]],
                "cpu": {f"{p}/{c}": v for (p, c), v in cpu.items()},
                "walls": {f"{p}/{c}": v for (p, c), v in walls.items()},
            },
            indent=1,
        )
    )
    (args.out / "summary.md").write_text(summary)
    return summary


def main(args: argparse.Namespace) -> int:
    print(run_engine_bench(args))
    return 0
