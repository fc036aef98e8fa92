"""Every ```python block of README.md and docs/*.md runs, and prints what the text says.

The convention (stated in the README): a block reads the server's address
from ``LONGRESPONSE_URL`` (default ``http://127.0.0.1:8000``); here each block
runs in a subprocess of its own with that variable set to the test server.
A block's expected output is the fenced block right after an
``<!-- output -->`` line that follows it (before any other Python block); the
block's stdout must equal it line by line, where ``...`` in an expected line
matches any run of characters (for ids and times). A block without one must
still exit 0. Anything not meant to run is not fenced as ``python``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

#: every documented block, run against server processes.
pytestmark = pytest.mark.slow


def repository_root() -> Path:
    """The directory holding pyproject.toml, walking up from this file."""
    for directory in Path(__file__).resolve().parents:
        if (directory / "pyproject.toml").is_file():
            return directory
    raise RuntimeError("no pyproject.toml above tests/test_docs.py")


ROOT = repository_root()
#: The marker line that makes the next fenced block a Python block's expected output.
OUTPUT_MARKER = "<!-- output -->"
#: In an expected line, matches any run of characters.
WILDCARD = "..."
#: Seconds one block may run.
BLOCK_TIMEOUT = 60
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclasses.dataclass
class Block:
    path: Path
    line: int
    code: str
    expected: str | None = None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[Block]:
    """The ```python blocks of ``path``, each with its marked expected output."""
    text = path.read_text(encoding="utf-8")
    blocks: list[Block] = []
    for match in FENCE.finditer(text):
        language, body = match.group(1), match.group(2)
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        if before == OUTPUT_MARKER:
            if not blocks or blocks[-1].expected is not None:
                raise AssertionError(f"{path.name}:{line}: an output block with no Python before")
            blocks[-1].expected = body
        elif language == "python":
            blocks.append(Block(path, line, body))
    markers = sum(line.strip() == OUTPUT_MARKER for line in text.splitlines())
    found = sum(block.expected is not None for block in blocks)
    assert markers == found, f"{path.name}: {markers} output markers, {found} matched a block"
    return blocks


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in python_blocks(path)]


def line_matches(expected: str, actual: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split(WILDCARD))
    return re.fullmatch(pattern, actual) is not None


def output_matches(expected: str, actual: str) -> bool:
    want, got = expected.rstrip("\n").split("\n"), actual.rstrip("\n").split("\n")
    return len(want) == len(got) and all(map(line_matches, want, got))


BLOCKS = all_blocks()


def test_the_docs_have_python_blocks_with_outputs() -> None:
    assert any(block.path.name == "README.md" for block in BLOCKS)
    assert sum(block.expected is not None for block in BLOCKS) >= 5


def test_the_output_matcher() -> None:
    assert output_matches("a ...!\nb\n", "a resp_12!\nb")
    assert not output_matches("a ...!\nb\n", "a resp_12!\nc")
    assert not output_matches("a\n", "a\nb\n")
    assert not output_matches("a.b", "axb")  # only the wildcard is special


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: block.name)
def test_a_docs_python_block_runs(block: Block, server: Any, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(block.code, encoding="utf-8")
    env = dict(os.environ, LONGRESPONSE_URL=server.http_url, PYTHONIOENCODING="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=tmp_path,
        env=env,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"{block.name} failed:\n{result.stderr}"
    if block.expected is not None:
        assert output_matches(block.expected, result.stdout), (
            f"{block.name} printed:\n{result.stdout}\nexpected:\n{block.expected}"
        )
