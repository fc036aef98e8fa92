"""Ablation: server-side pre-inference time per turn with each reuse switched off.

    python examples/measure_ablation.py --rollouts 5 --appends 50 --output-tokens 2000

For every configuration (all reuses on, then each one off: a separate server
process started with the matching ``--no-...`` flag) it runs rollouts in
append mode and in the shipped shape, each continuation bringing a tool
output of about ``--output-tokens`` tokens, and reads the server's
``pre_inference_ms`` (validation + classification at admission, resolution,
render/tokenize; decode included) from the ``responsesapi.websocket_timing``
event of each turn. Prints a table of medians at turns 1, 10 and 50 and, with
``--markdown FILE``, appends it there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

import trio

from longresponse.server_process import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_resume import one_rollout

CONFIGS = {
    "all reuses on": [],
    "no incremental validation": ["--no-incremental-validation"],
    "no incremental classification": ["--no-incremental-classification"],
    "no token cache": ["--no-token-cache"],
    "no resolution reuse": ["--no-resolution-reuse"],
    "no overlapped post-inference": ["--no-overlapped-post-inference"],
}
SHAPES = ("append", "ws")


@contextlib.contextmanager
def server(flags: list[str], store: str) -> Iterator[str]:
    with ServerProcess("--store", store, *flags) as running:
        yield running.url


async def run_config(url: str, rollouts: int, appends: int, tokens: int) -> dict[str, list]:
    runs: dict[str, list] = {shape: [] for shape in SHAPES}
    for _ in range(rollouts):
        for shape in SHAPES:
            runs[shape].append(await one_rollout(url, appends, tokens, shape))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=5)
    parser.add_argument("--appends", type=int, default=50)
    parser.add_argument("--output-tokens", type=int, default=2000)
    parser.add_argument("--store", default="memory://")
    parser.add_argument("--markdown", help="append the table to this file")
    args = parser.parse_args()
    turns = sorted({1, 10, args.appends} & set(range(1, args.appends + 1)))
    rows = []
    for name, flags in CONFIGS.items():
        with server(flags, args.store) as url:
            runs = trio.run(run_config, url, args.rollouts, args.appends, args.output_tokens)
        for shape in SHAPES:
            medians = [
                statistics.median(run[turn - 1]["pre_inference_ms"] for run in runs[shape])
                for turn in turns
            ]
            post = statistics.median(
                turn["post_inference_ms"] for run in runs[shape] for turn in run
            )
            rows.append((name, shape, [*medians, post]))
        print(f"{name}: done", file=sys.stderr)
    command = " ".join(["python", "examples/measure_ablation.py", *sys.argv[1:]])
    header = " | ".join(f"pre-inference, turn {t} (ms)" for t in turns)
    header += " | post-inference before the terminal event, all turns (ms)"
    lines = [
        f"Command: `{command}`  ",
        f"Machine: {platform.platform()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores; {args.rollouts} rollouts per configuration and shape; "
        f"tool outputs of ~{args.output_tokens} tokens; medians of pre_inference_ms.",
        "",
        f"| configuration | shape | {header} |",
        "|---|---|" + "---:|" * (len(turns) + 1),
        *(
            f"| {name} | {shape} | " + " | ".join(f"{m:.3f}" for m in medians) + " |"
            for name, shape, medians in rows
        ),
    ]
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "a") as out:
            out.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
