"""How the engine's child process is found and how a failed start is reported,
without the engine: the binary here is a shell script that dies as the native
build did on a CPU whose VM does not enable what it advertises (a signal at
start), or exits, or never answers ``/health``."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from longresponse import llama_server
from longresponse.llama_server import ENGINE_RECIPE, LLAMA_VERSION, LlamaEngine, LlamaServer

ROOT = Path(__file__).resolve().parent.parent


def script_value(name: str) -> str:
    text = (ROOT / llama_server.ENGINE_SCRIPT).read_text()
    found = re.search(rf"^{name}=(\S+)$", text, re.MULTILINE)
    assert found, f"{name} is not set in {llama_server.ENGINE_SCRIPT}"
    return found.group(1)


def test_the_script_and_the_package_agree_on_where_the_binary_is() -> None:
    assert script_value("LLAMA_VERSION") == LLAMA_VERSION
    assert script_value("RECIPE") == ENGINE_RECIPE
    assert "SERVER=$CACHE/llama-server-$LLAMA_VERSION-$RECIPE/llama-server" in (
        ROOT / llama_server.ENGINE_SCRIPT
    ).read_text()


def test_the_build_is_portable_not_native() -> None:
    """llama.cpp builds for the building CPU unless told not to; that binary
    dies at start where AMX is advertised but not enabled."""
    text = (ROOT / llama_server.ENGINE_SCRIPT).read_text()
    assert "-DGGML_NATIVE=OFF" in text
    assert "AMX" not in re.sub(r"#.*", "", text)  # no AMX kernels asked for


def cache_with(tmp_path: Path, body: str) -> LlamaEngine:
    server = tmp_path / f"llama-server-{LLAMA_VERSION}-{ENGINE_RECIPE}" / "llama-server"
    server.parent.mkdir()
    server.write_text("#!/bin/sh\n" + body + "\n")
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    for other in (
        "models/SmolLM2-135M-Instruct.Q4_1.gguf",
        "templates/functionary-v3.2-im_end.jinja",
    ):
        (tmp_path / other).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / other).write_text("")
    return LlamaEngine.from_cache(tmp_path)


def test_a_binary_an_older_recipe_built_is_not_found(tmp_path: Path) -> None:
    old = tmp_path / f"llama-server-{LLAMA_VERSION}" / "llama-server"
    old.parent.mkdir()
    old.write_text("")
    with pytest.raises(FileNotFoundError, match=f"llama-server-{LLAMA_VERSION}-{ENGINE_RECIPE}"):
        LlamaEngine.from_cache(tmp_path)


def test_an_engine_killed_by_a_signal_at_start_is_named(tmp_path: Path) -> None:
    engine = cache_with(tmp_path, 'echo "loading model"; kill -SEGV $$')
    with pytest.raises(RuntimeError) as failed:
        LlamaServer(engine).start()
    message = str(failed.value)
    assert message.startswith("llama-server did not start: killed by SIGSEGV")
    assert "loading model" in message  # the log's tail follows


def test_an_engine_that_exits_at_start_gives_its_status(tmp_path: Path) -> None:
    engine = cache_with(tmp_path, 'echo "bad flag" >&2; exit 3')
    with pytest.raises(RuntimeError, match=r"did not start: exited with status 3\nbad flag"):
        LlamaServer(engine).start()


def test_an_engine_that_never_answers_is_stopped_after_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llama_server, "STARTUP_TIMEOUT", 0.5)
    engine = cache_with(tmp_path, "exec sleep 30")
    server = LlamaServer(engine)
    with pytest.raises(RuntimeError, match=r"no answer from /health within 0.5 s"):
        server.start()
    assert server.process is not None
    assert server.process.poll() is not None  # stopped, not left behind
