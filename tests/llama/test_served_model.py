"""A gateway whose TOML is wrong for the real llama-server, as an operator runs
it (``longresponse serve --config``): what its log says, once, at ERROR.

llama-server answers whatever ``model`` it is sent with the one it loaded, so
a TOML naming another model serves silently; only its ``GET /v1/models``
(the ``--alias`` it was started with) tells. A ``base_url`` whose path is not
the engine's API root fails every turn with a 404. Both are the operator's
to mend, and the log says how (``longresponse/backends/served_model.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from longresponse.llama_server import LlamaServer
from longresponse.server_process import ServerProcess
from tests.conftest import openai_client
from tests.llama.conftest import LOOP_TIMEOUT, MODEL
from tests.support.waiting import wait_for

#: Real turns on two cores shared with other work: seconds on a quiet machine,
#: minutes on a loaded one (the engine measured 13-28 times slower).
pytestmark = pytest.mark.timeout(LOOP_TIMEOUT)

LOGGER = "longresponse.backends.served_model"


def gateway(llama: LlamaServer, tmp_path: Path, old: str, new: str) -> ServerProcess:
    """``longresponse serve`` with the docs' TOML for ``llama``, ``old`` replaced by ``new``."""
    text = llama.gateway_config()
    assert old in text
    config = tmp_path / "llama.toml"
    config.write_text(text.replace(old, new))
    return ServerProcess(
        "--store", "memory://", "--config", str(config), log_file=tmp_path / "gateway.log"
    )


def logged(server: ServerProcess, level: str) -> list[str]:
    """The check's lines in the server's log at ``level`` (Python's default format)."""
    return [line for line in server.log().splitlines() if line.startswith(f"{level}:{LOGGER}:")]


@pytest.mark.slow  # a server process in front of the engine
def test_a_model_llama_server_does_not_have_is_one_error_with_the_fix(
    llama: LlamaServer, tmp_path: Path
) -> None:
    with gateway(
        llama, tmp_path, 'upstream_model = "smollm2"', 'upstream_model = "qwen3-8b"'
    ) as server:
        wait_for(lambda: logged(server, "ERROR"), "the check's ERROR line", 30)
        # llama-server answers all the same: the ERROR is all that tells.
        client: Any = openai_client(server)
        for _ in range(2):
            response = client.responses.create(
                model=MODEL, input="hi", max_output_tokens=5, temperature=0
            )
            assert response.status in ("completed", "incomplete")
    (line,) = logged(server, "ERROR")  # once, not per request
    assert "does not serve 'qwen3-8b' (it serves 'smollm2')" in line
    assert 'Set upstream_model = "smollm2" in [models.smollm2]' in line
    assert "or start llama-server with --alias qwen3-8b" in line


@pytest.mark.slow  # a server process in front of the engine
def test_a_base_url_that_is_not_the_api_root_is_one_error_with_the_fix(
    llama: LlamaServer, tmp_path: Path
) -> None:
    with gateway(llama, tmp_path, f"{llama.origin}/v1", f"{llama.origin}/v2") as server:
        wait_for(lambda: logged(server, "ERROR"), "the check's ERROR line", 30)
        client: Any = openai_client(server)
        for _ in range(2):
            with pytest.raises(openai.APIStatusError) as caught:
                client.responses.create(model=MODEL, input="hi", max_output_tokens=5)
            assert caught.value.status_code == 502
    (line,) = logged(server, "ERROR")
    assert "has no /v2/models (HTTP 404)" in line
    assert f"base_url '{llama.origin}/v2' is not its API root" in line
    assert "Set base_url in [models.smollm2]" in line
    # Each failed turn is still its own line, at WARNING: the ERROR said it all.
    failures = [ln for ln in server.log().splitlines() if "upstream failed" in ln]
    assert len(failures) == 2
    assert all(ln.startswith("WARNING:") for ln in failures)
    assert all("has no such endpoint" in ln for ln in failures)


@pytest.mark.slow  # a server process in front of the engine
def test_the_docs_toml_is_served_and_says_nothing_above_info(
    llama: LlamaServer, tmp_path: Path
) -> None:
    config = tmp_path / "llama.toml"
    config.write_text(llama.gateway_config())
    with ServerProcess(
        "--store", "memory://", "--config", str(config), log_level="info",
        log_file=tmp_path / "gateway.log",
    ) as server:  # fmt: skip
        wait_for(lambda: logged(server, "INFO"), "the check's INFO line", 30)
    assert logged(server, "INFO") == [
        f"INFO:{LOGGER}:model 'smollm2': the upstream at 127.0.0.1:{llama.port} serves 'smollm2'"
    ]
    assert not logged(server, "WARNING")
    assert not logged(server, "ERROR")
