"""The command line: --help documents every flag; a real server process serves."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from longresponse.cli import build_parser
from longresponse.client import connect
from longresponse.server_process import ServerProcess
from protocol.events import ResponseDone


def test_help_documents_every_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "longresponse", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    flags = [
        opt for action in serve._actions for opt in action.option_strings if opt.startswith("--")
    ]
    assert len(flags) > 10
    for flag in flags:
        assert flag in result.stdout
    for action in serve._actions:
        assert action.help, action


@pytest.mark.slow  # a server process
async def test_server_process_serves_a_rollout(server_process: ServerProcess) -> None:
    async with connect(server_process.url) as client:
        await client.create(model="sim", input="hello from a real process")
        done = (await client.until_done())[-1]
        assert isinstance(done, ResponseDone)
        assert done.response.status == "completed"


#: A sitecustomize that makes the [bench] extra's packages unimportable, as in
#: an environment where only the server was installed (``pip install -e .``).
_HIDE_BENCH_EXTRA = '''
import sys

class _Hidden:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"httpx", "matplotlib", "tqdm", "openai"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Hidden())
'''


@pytest.fixture
def without_bench_extra(tmp_path: Any) -> dict[str, str]:
    """An environment for a child process in which the [bench] extra is missing."""
    (tmp_path / "sitecustomize.py").write_text(_HIDE_BENCH_EXTRA)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), os.getcwd()])
    return env


@pytest.mark.parametrize(
    "command", ["bench", "bench-throughput", "bench-scale", "bench-engine", "soak"]
)
def test_a_bench_command_without_the_extra_names_it_in_one_line(
    without_bench_extra: dict[str, str], command: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "longresponse", command, "--rollouts", "1"],
        capture_output=True,
        text=True,
        env=without_bench_extra,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "pip install 'longresponse[bench]'" in lines[0]
    assert lines[0].startswith(f"longresponse {command}: ")


@pytest.mark.slow  # a server process
def test_the_server_serves_without_the_bench_extra(
    without_bench_extra: dict[str, str], tmp_path: Any
) -> None:
    script = (
        "import sys, trio\n"
        "from longresponse.client import connect\n"
        "from longresponse.server_process import ServerProcess\n"
        "async def main(url):\n"
        "    async with connect(url) as client:\n"
        "        await client.create(model='sim', input='hello without the bench extra')\n"
        "        print((await client.until_done())[-1].response.status)\n"
        "with ServerProcess('--store', 'memory://') as server:\n"
        "    trio.run(main, server.url)\n"
        "assert not {'httpx', 'matplotlib', 'tqdm', 'openai'} & set(sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=without_bench_extra,
        timeout=50,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "completed"
    help_text = subprocess.run(
        [sys.executable, "-m", "longresponse", "serve", "--help"],
        capture_output=True,
        text=True,
        env=without_bench_extra,
        check=True,
    ).stdout
    assert "--ws-compression" in help_text


def test_gc_tuning_freezes_start_up_and_sets_the_young_threshold() -> None:
    import gc

    from longresponse.config import GC_YOUNG_THRESHOLD
    from longresponse.serve.collector import tune_gc

    before = gc.get_threshold()
    try:
        tune_gc(GC_YOUNG_THRESHOLD)
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0
        gc.unfreeze()
        tune_gc(0)  # 0 keeps the threshold as it is
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_a_negative_gc_threshold_is_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "longresponse", "serve", "--gc-young-threshold", "-1"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "--gc-young-threshold: must be 100 to 1e+09, or 0, not -1" in result.stderr
