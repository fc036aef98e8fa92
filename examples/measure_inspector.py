"""What the inspector costs a turn: off, on with nobody watching, and watched.

    python examples/measure_inspector.py --rounds 6 --rollouts 2 --appends 30

Four server processes run side by side for the whole run, one per
configuration: ``--no-inspector``; ``--no-inspector`` again, a control: two
processes of the same code differ by themselves (memory layout, hash seeds,
where the OS puts them), and this is how much; the default (observations
kept, no watcher, so nothing is published); and the default with a live
feed (``/inspect/api/feed``) read by a thread for the whole run, so every
event is also published. The run goes in rounds; in each round every
configuration runs ``--rollouts`` append-mode rollouts of ``--appends`` tool
calls (``examples/measure_resume.py``'s rollout, with its
``responsesapi.websocket_timing`` events), in an order that rotates from
round to round, so that whatever else the machine does falls on all of them
alike. Per continuation it reads the server's ``resume_ms`` (the append
decoded to the sampler called), ``encode_ms`` (the turn's events built,
checked, encoded and queued: where the inspector notes each event) and
``inference_ms`` (the whole sampling loop; the simulated model is
unthrottled, so that is event work), and their sum.

It reports, per configuration and figure, the median over every
continuation and the spread of the per-round medians (lowest to highest), and
for each configuration against the first the median of the per-round
paired differences with their range. A difference whose range spans zero,
or that is no larger than the control's, is not measurable at this
precision. With ``--markdown FILE`` it appends the tables.
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
    "off again (a second process)": (["--no-inspector"], False),
    "on, nobody watching": ([], False),
    "on, one feed watching": ([], True),
}
FIGURES = ("resume_ms", "encode_ms", "inference_ms", "sum")
HEADINGS = ("resume (ms)", "encode (ms)", "inference incl. events (ms)", "sum (ms)")


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
    for turn in turns:
        turn["sum"] = sum(turn[f] for f in FIGURES[:-1])
    return turns


def medians(turns: list[dict[str, float]]) -> list[float]:
    return [statistics.median(t[f] for t in turns) for f in FIGURES]


def measure(args: argparse.Namespace) -> dict[str, list[list[dict[str, float]]]]:
    """Per configuration, per round, the continuations' figures."""
    rounds: dict[str, list[list[dict[str, float]]]] = {name: [] for name in CONFIGS}
    names = list(CONFIGS)
    with contextlib.ExitStack() as stack:
        servers = {
            name: stack.enter_context(ServerProcess("--store", "memory://", *flags))
            for name, (flags, _) in CONFIGS.items()
        }
        feeds = {
            name: stack.enter_context(watched(servers[name].http_url))
            for name, (_, watch) in CONFIGS.items()
            if watch
        }
        for name in names:  # one warm-up rollout each (imports, caches), not counted
            trio.run(run, servers[name].url, 1, args.appends, args.output_tokens)
        for number in range(args.rounds):
            order = names[number % len(names) :] + names[: number % len(names)]
            for name in order:
                turns = trio.run(
                    run, servers[name].url, args.rollouts, args.appends, args.output_tokens
                )
                rounds[name].append(turns)
            print(f"round {number + 1}/{args.rounds} done", file=sys.stderr)
        for name, lines in feeds.items():
            total = sum(len(turns) for turns in rounds[name])
            assert lines[0] > total, f"the feed of {name!r} was not read"
    return rounds


def report(rounds: dict[str, list[list[dict[str, float]]]], args: argparse.Namespace) -> str:
    names = list(CONFIGS)
    per_round = {name: [medians(turns) for turns in rounds[name]] for name in names}
    command = " ".join(["python", "examples/measure_inspector.py", *sys.argv[1:]])
    out = [
        f"Command: `{command}`  ",
        f"Machine: {platform.platform()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores; append mode; {args.rounds} rounds, each of "
        f"{args.rollouts} rollouts of {args.appends} tool calls per configuration "
        f"({args.rounds * args.rollouts * args.appends} continuations each), tool "
        f"outputs of ~{args.output_tokens} tokens.",
        "",
        "Median over every continuation (lowest to highest per-round median):",
        "",
        "| configuration | " + " | ".join(HEADINGS) + " |",
        "|---|" + "---:|" * len(FIGURES),
    ]
    for name in names:
        overall = medians([t for turns in rounds[name] for t in turns])
        cells = [
            f"{overall[i]:.3f} ({min(r[i] for r in per_round[name]):.3f} to "
            f"{max(r[i] for r in per_round[name]):.3f})"
            for i in range(len(FIGURES))
        ]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Paired per-round difference from off: median (lowest to highest):",
        "",
        "| difference | " + " | ".join(HEADINGS) + " |",
        "|---|" + "---:|" * len(FIGURES),
    ]
    off = per_round[names[0]]
    for name in names[1:]:
        cells = []
        for i in range(len(FIGURES)):
            diffs = [mine[i] - base[i] for mine, base in zip(per_round[name], off, strict=True)]
            spans_zero = min(diffs) <= 0 <= max(diffs)
            cells.append(
                f"{statistics.median(diffs):+.3f} ({min(diffs):+.3f} to {max(diffs):+.3f})"
                + (" ~0" if spans_zero else "")
            )
        out.append(f"| {name} - off | " + " | ".join(cells) + " |")
    out += ["", "(~0: the range spans zero; not measurable at this precision.)"]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--appends", type=int, default=30)
    parser.add_argument("--output-tokens", type=int, default=500)
    parser.add_argument("--markdown", help="append the tables to this file")
    args = parser.parse_args()
    text = report(measure(args), args)
    print(text)
    if args.markdown:
        with open(args.markdown, "a") as out:
            out.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
