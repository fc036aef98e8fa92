"""An agent loop over append events, with real local tools run by the client.

    longresponse serve &            # or: make serve
    python examples/agent_loop.py --root . --calls 6

The whole rollout is ONE Response. Each time the model asks for tools the
server sends ``response.done`` (``requires_action``); this client runs the
tools on the local machine (list a directory, read a file, search text) and
sends their outputs with ``response.append``; the model resumes with its whole
context still in the server's memory.

The simulated model fills tool arguments from each tool's JSON schema, so the
schemas below enumerate real paths and patterns under ``--root``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from longresponse.client import connect
from protocol.events import FunctionCallArgumentsDone, OutputItemDone, OutputTextDelta, ResponseDone
from protocol.items import FunctionCall, Message, OutputText

MAX_OUTPUT_CHARS = 4000


def list_dir(root: Path, path: str) -> str:
    target = (root / path).resolve()
    entries = sorted(os.listdir(target))
    return "\n".join(e + ("/" if (target / e).is_dir() else "") for e in entries)


def read_file(root: Path, path: str) -> str:
    return (root / path).read_text(errors="replace")[:MAX_OUTPUT_CHARS]


def search_text(root: Path, pattern: str) -> str:
    hits: list[str] = []
    regex = re.compile(re.escape(pattern))
    for file in sorted(root.rglob("*.py")):
        if any(part.startswith(".") for part in file.relative_to(root).parts):
            continue
        for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
            if regex.search(line):
                hits.append(f"{file.relative_to(root)}:{number}: {line.strip()}")
    return "\n".join(hits[:50]) or "no matches"


def tool_definitions(root: Path) -> tuple[list[dict[str, Any]], dict[str, Callable[..., str]]]:
    subdirs = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    dirs = [".", *subdirs]
    files = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if not any(part.startswith(".") for part in p.relative_to(root).parts)
    )[:20] or ["README.md"]
    tools = [
        {
            "type": "function",
            "name": "list_dir",
            "description": "List the entries of a directory.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "enum": dirs}},
                "required": ["path"],
            },
        },
        {
            "type": "function",
            "name": "read_file",
            "description": "Read a text file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "enum": files}},
                "required": ["path"],
            },
        },
        {
            "type": "function",
            "name": "search_text",
            "description": "Find lines containing a string in the Python files.",
            "parameters": {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "enum": ["Rollout", "response.append", "pause"]}
                },
                "required": ["pattern"],
            },
        },
    ]
    runners: dict[str, Callable[..., str]] = {
        "list_dir": lambda path: list_dir(root, path),
        "read_file": lambda path: read_file(root, path),
        "search_text": lambda pattern: search_text(root, pattern),
    }
    return tools, runners


def run_tool(runners: dict[str, Callable[..., str]], call: FunctionCall) -> str:
    try:
        return runners[call.name](**json.loads(call.arguments))
    except Exception as exc:  # a tool failure is the model's to read, not a crash
        return f"error: {type(exc).__name__}: {exc}"


async def main(args: argparse.Namespace) -> int:
    tools, runners = tool_definitions(args.root)
    started = time.perf_counter()
    async with connect(args.url) as client:
        await client.create(
            model="sim",
            input=args.task,
            tools=tools,
            metadata={
                "sim_tool_calls": str(args.calls),
                "sim_parallel_calls": str(args.parallel),
            },
        )
        while True:
            event = await client.next_event(timeout=args.timeout)
            if isinstance(event, OutputTextDelta):
                print(event.delta, end="", flush=True)
            elif isinstance(event, FunctionCallArgumentsDone):
                print(f"→ {event.name}({event.arguments})")
            elif isinstance(event, OutputItemDone) and isinstance(event.item, Message):
                print()
            elif isinstance(event, ResponseDone):
                response = event.response
                if response.status != "requires_action":
                    usage = response.usage
                    print(
                        f"[{response.id}] {response.status} in "
                        f"{time.perf_counter() - started:.2f}s; "
                        f"{len(response.output)} output items; usage: "
                        f"{usage.input_tokens if usage else 0} input tokens "
                        f"({usage.input_tokens_details.cached_tokens if usage else 0} cached), "
                        f"{usage.output_tokens if usage else 0} output"
                    )
                    final = response.output[-1] if response.output else None
                    if isinstance(final, Message) and isinstance(final.content, list):
                        part = final.content[0]
                        ok = isinstance(part, OutputText) and bool(part.text)
                        return 0 if ok and response.status == "completed" else 1
                    return 1
                pending = set(response.required_action.call_ids)  # type: ignore[union-attr]
                calls = [
                    item
                    for item in response.output
                    if isinstance(item, FunctionCall) and item.call_id in pending
                ]
                outputs = []
                for call in calls:
                    output = run_tool(runners, call)
                    first = output.splitlines()[0] if output else ""
                    print(f"  ← {call.name}: {len(output)} chars: {first[:60]}")
                    outputs.append(
                        {"type": "function_call_output", "call_id": call.call_id, "output": output}
                    )
                await client.append(outputs, response_id=response.id)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1/responses")
    parser.add_argument(
        "--root", type=lambda p: Path(p).resolve(), default=".", help="directory the tools see"
    )
    parser.add_argument("--task", default="Find where the sampling loop pauses and explain it.")
    parser.add_argument("--calls", type=int, default=6, help="tool calls before the answer")
    parser.add_argument("--parallel", type=int, default=2, help="tool calls per turn")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait per event")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(trio.run(main, parse_args()))
