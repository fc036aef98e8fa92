"""What the inspector costs a turn: off, on with nobody watching, and watched.

    python examples/measure_inspector.py --rollouts 5 --appends 30 --output-tokens 500

Each configuration gets its own server process: ``--no-inspector``; the
default (observations kept, no watcher, so nothing is published); and the
default with a live feed (``/inspect/api/feed``) read by a thread for the
whole run, so every event is also published. Each runs append-mode rollouts
of ``--appends`` tool calls (``examples/measure_resume.py``'s rollout, with
its ``responsesapi.websocket_timing`` events) and reads, per continuation,
the server's ``resume_ms`` (the append decoded to the sampler called),
``encode_ms`` (the turn's events built, checked, encoded and queued: where
the inspector's per-event note is taken) and ``inference_ms`` (the whole
sampling loop; the simulated model is unthrottled, so that is event work).
Prints medians side by side and, with ``--markdown FILE``, appends them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import trio

from longresponse.server_process import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_resume import one_rollout

#: Configuration → (server flags, whether a feed is read during the run).
CONFIGS = {
    "inspector off": (["--no-inspector"], False),
    "on, nobody watching": ([], False),
    "on, one feed watching": ([], True),
}
FIGURES = ("resume_ms", "encode_ms", "inference_ms")


@contextlib.contextmanager
def watched(http_url: str) -> Iterator[list[int]]:
    """A thread that reads the live feed until the block ends; yields [lines read]."""
    read = [0]
    stop = threading.Event()

    def follow() -> None:
        with httpx.stream("GET", f"{http_url}/inspect/api/feed", timeout=None) as feed:
            for _ in feed.iter_lines():
                read[0] += 1
                if stop.is_set():
                    return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield read
    finally:
        stop.set()  # the feed's next line (a state message at the latest) ends it
        thread.join(timeout=5)


async def run(url: str, rollouts: int, appends: int, tokens: int) -> list[dict[str, float]]:
    turns: list[dict[str, float]] = []
    for _ in range(rollouts):
        turns.extend(await one_rollout(url, appends, tokens, "append"))
    return turns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=5)
    parser.add_argument("--appends", type=int, default=30)
    parser.add_argument("--output-tokens", type=int, default=500)
    parser.add_argument("--markdown", help="append the table to this file")
    args = parser.parse_args()
    rows = []
    for name, (flags, watch) in CONFIGS.items():
        with ServerProcess("--store", "memory://", *flags) as server:
            feed = watched(server.http_url) if watch else contextlib.nullcontext([0])
            with feed as lines:
                turns = trio.run(run, server.url, args.rollouts, args.appends, args.output_tokens)
            if watch:
                assert lines[0] > len(turns), "the feed was not read"
        rows.append((name, [statistics.median(t[f] for t in turns) for f in FIGURES]))
        print(f"{name}: done ({len(turns)} turns)", file=sys.stderr)
    command = " ".join(["python", "examples/measure_inspector.py", *sys.argv[1:]])
    lines_out = [
        f"Command: `{command}`  ",
        f"Machine: {platform.platform()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores; append mode, {args.rollouts} rollouts of {args.appends} "
        f"tool calls per configuration, tool outputs of ~{args.output_tokens} tokens; "
        "medians over every continuation.",
        "",
        "| configuration | resume (ms) | encode (ms) | inference incl. events (ms) |",
        "|---|---:|---:|---:|",
        *(f"| {name} | " + " | ".join(f"{v:.3f}" for v in values) + " |" for name, values in rows),
    ]
    print("\n".join(lines_out))
    if args.markdown:
        with open(args.markdown, "a") as out:
            out.write("\n".join(lines_out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
