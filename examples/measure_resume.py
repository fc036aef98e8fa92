"""Measure the server's time to continue a rollout, per turn, as it grows.

    python examples/measure_resume.py --rollouts 20 --appends 50 --output-tokens 2000

Starts its own server process (or uses ``--url``), asks for the
``responsesapi.websocket_timing`` events, and runs rollouts of ``--appends``
tool calls, answering each with a tool output of about ``--output-tokens``
tokens, in both shapes side by side: ``append`` (one long-running Response,
``response.append``) and ``ws`` (the shipped shape: ``response.create`` with
``previous_response_id`` and only the new output). For every continuation it
records the server-side ``resume_ms``: from the decoded client event to the
sampler being called again (lookup, checks, render and tokenize of the NEW
items). The ``http`` baseline chains ``POST /v1/responses`` through the store
and reads the same figure from the ``Server-Timing`` header (there the whole
history is read back and rendered on every turn; "new tokens" is then every
input token). Prints medians per turn and, with ``--markdown FILE``, appends
them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import trio

from longresponse.client import connect
from longresponse.server_process import ServerProcess
from protocol.events import OutputItemDone, ResponseCompleted, ResponseDone, TimingEvent
from protocol.items import FunctionCall

SHAPES = ("append", "ws", "http")

TOOL = {
    "type": "function",
    "name": "run_tests",
    "parameters": {"type": "object", "properties": {"target": {"type": "string"}}},
}
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def tool_output(turn: int, tokens: int) -> str:
    # About one token per word; varied so no two outputs are equal.
    return " ".join(f"{WORDS[(turn + i) % len(WORDS)]}{i % 97}" for i in range(tokens // 2))


def _server_timing(header: str) -> dict[str, float]:
    metrics = {}
    for part in header.split(","):
        name, _, duration = part.strip().partition(";dur=")
        metrics[f"{name}_ms"] = float(duration)
    return metrics


async def http_rollout(url: str, appends: int, output_tokens: int) -> list[dict[str, float]]:
    """The stateless baseline: ``POST /v1/responses`` chained through the store."""
    base = url.replace("ws://", "http://").removesuffix("/v1/responses")
    per_turn: list[dict[str, float]] = []
    meta = {"sim_tool_calls": str(appends)}
    body: dict[str, Any] = {
        "model": "sim",
        "input": "Run the test suite until it passes.",
        "tools": [TOOL],
        "metadata": meta,
    }
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        for turn in range(appends + 1):
            reply = await http.post("/v1/responses", json=body)
            reply.raise_for_status()
            if turn > 0:
                metrics = _server_timing(reply.headers["server-timing"])
                response = reply.json()
                metrics["new_tokens"] = response["usage"]["input_tokens"]
                metrics["cached_tokens"] = response["usage"]["input_tokens_details"][
                    "cached_tokens"
                ]
                per_turn.append(metrics)
            calls = [i for i in reply.json()["output"] if i["type"] == "function_call"]
            if not calls:
                break
            body = {
                "model": "sim",
                "previous_response_id": reply.json()["id"],
                "input": [
                    {
                        "type": "function_call_output",
                        "call_id": call["call_id"],
                        "output": tool_output(turn, output_tokens),
                    }
                    for call in calls
                ],
                "tools": [TOOL],
                "metadata": meta,
            }
    return per_turn


async def one_rollout(
    url: str, appends: int, output_tokens: int, shape: str
) -> list[dict[str, float]]:
    """Per continuation: the timing metrics of the turn it resumed."""
    if shape == "http":
        return await http_rollout(url, appends, output_tokens)
    headers = [("x-responsesapi-include-timing-metrics", "true")]
    per_append: list[dict[str, float]] = []
    subprotocols = ("longresponse.append.v1",) if shape == "append" else ()
    meta = {"sim_tool_calls": str(appends)}
    async with connect(url, headers=headers, subprotocols=subprotocols) as client:
        await client.create(
            model="sim",
            input="Run the test suite until it passes.",
            tools=[TOOL],
            metadata=meta,
            store=False,
        )
        turn = 0
        while True:
            events = await client.until_done(timeout=120)
            timing = await client.next_event(timeout=30)
            assert isinstance(timing, TimingEvent), timing
            if turn > 0:
                per_append.append(timing.timing_metrics)
            done = events[-1]
            assert isinstance(done, ResponseDone | ResponseCompleted), done
            calls = [
                e.item
                for e in events
                if isinstance(e, OutputItemDone) and isinstance(e.item, FunctionCall)
            ]
            if not calls:
                return per_append
            outputs = [
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": tool_output(turn, output_tokens),
                }
                for call in calls
            ]
            if shape == "append":
                await client.append(outputs)
            else:
                await client.create(
                    model="sim",
                    previous_response_id=done.response.id,
                    input=outputs,
                    tools=[TOOL],
                    metadata=meta,
                    store=False,
                )
            turn += 1


@contextlib.contextmanager
def server_process() -> Iterator[str]:
    with ServerProcess("--store", "memory://") as server:
        yield server.url


async def measure(
    url: str, rollouts: int, appends: int, output_tokens: int
) -> dict[str, list[list[Any]]]:
    """Rollouts of both shapes, alternated, so machine noise hits both alike."""
    runs: dict[str, list[list[Any]]] = {shape: [] for shape in SHAPES}
    for index in range(rollouts):
        for shape in SHAPES:
            runs[shape].append(await one_rollout(url, appends, output_tokens, shape))
        print(f"rollout {index + 1}/{rollouts} done", file=sys.stderr)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--appends", type=int, default=50)
    parser.add_argument("--output-tokens", type=int, default=2000)
    parser.add_argument("--markdown", help="append the result table to this file")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(server_process())
        runs = trio.run(measure, url, args.rollouts, args.appends, args.output_tokens)
    command = " ".join(["python", "examples/measure_resume.py", *sys.argv[1:]])
    lines = [
        f"Command: `{command}`  ",
        f"Machine: {platform.platform()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores; {args.rollouts} rollouts per shape, alternated; "
        f"tool outputs of ~{args.output_tokens} tokens; medians.",
        "",
        "| shape | turn | resume (ms) | pre-inference (ms) | new tokens | cached tokens |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    summary = []
    for shape in SHAPES:
        rows = []
        for index in sorted({0, 9, args.appends - 1} & set(range(args.appends))):
            samples = [run[index] for run in runs[shape]]
            rows.append(
                (
                    index + 1,
                    statistics.median(s["resume_ms"] for s in samples),
                    statistics.median(s["pre_inference_ms"] for s in samples),
                    statistics.median(s["new_tokens"] for s in samples),
                    statistics.median(s["cached_tokens"] for s in samples),
                )
            )
        lines.extend(
            f"| {shape} | {n} | {r:.3f} | {p:.3f} | {t:.0f} | {c:.0f} |" for n, r, p, t, c in rows
        )
        ratio = rows[-1][1] / rows[0][1] if rows[0][1] else float("nan")
        summary.append(f"{shape}: turn {rows[-1][0]} / turn 1 = {ratio:.2f}x")
    lines.append("")
    lines.append("Resume time growth: " + "; ".join(summary))
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "a") as out:
            out.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
