"""The backend registry's settings: TOML tables, flags and environment, and refusals."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from longresponse.backends import settings
from longresponse.backends.registry import missing_keys, open_backends
from longresponse.backends.settings import SettingsError, backends_from_args, load_toml
from longresponse.config import BackendConfig

URL = 'base_url = "http://h/v1"'
CHAT = f'kind = "chat"\n{URL}\n'


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    return parser.parse_args(argv)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return str(path)


def test_a_toml_table_per_served_model(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[models.qwen]
kind = "chat"
base_url = "http://127.0.0.1:8000/v1"
upstream_model = "Qwen/Qwen3-8B"
api_key_env = "VLLM_KEY"
context_window = 32768
first_token_timeout = 300

[models.gpt]
kind = "responses-ws"
base_url = "https://api.openai.com/v1"
upstream_store = true
""",
    )
    qwen, gpt = load_toml(path)
    assert qwen == BackendConfig(
        name="qwen",
        kind="chat",
        base_url="http://127.0.0.1:8000/v1",
        upstream_model="Qwen/Qwen3-8B",
        api_key_env="VLLM_KEY",
        context_window=32768,
        first_token_timeout=300,
    )
    assert qwen.model == "Qwen/Qwen3-8B"
    assert (gpt.name, gpt.kind, gpt.model, gpt.upstream_store) == (
        "gpt",
        "responses-ws",
        "gpt",
        True,
    )


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('kind = "grpc"\n' + URL, "kind must be one of chat, responses, responses-ws"),
        ('kind = "chat"\nbase_url = "ftp://h/v1"', "base_url must be an http(s) or ws(s) URL"),
        ('kind = "chat"\nbase_url = "http:///v1"', "names no host"),
        (CHAT + 'api_key = "sk-123"', "unknown setting 'api_key'"),
        (CHAT + 'context_window = "big"', "context_window must be of type int"),
        (CHAT + "max_retries = 99", "max_retries must be from 0 to 10"),
        (CHAT + "upstream_store = 1", "upstream_store must be of type bool"),
    ],
)
def test_a_bad_table_is_refused_naming_the_table_and_key(
    tmp_path: Path, table: str, message: str
) -> None:
    path = write(tmp_path, f"[models.m]\n{table}\n")
    with pytest.raises(SettingsError, match=re.escape(message)) as refused:
        load_toml(path)
    assert "[models.m]" in str(refused.value)


def test_a_bad_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read"):
        load_toml(str(tmp_path / "absent.toml"))
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_toml(write(tmp_path, "[models.m\n"))
    with pytest.raises(SettingsError, match="unknown table 'server'"):
        load_toml(write(tmp_path, "[server]\nport = 1\n"))


def test_flags_and_environment_for_the_simple_case(tmp_path: Path) -> None:
    args = parse("--upstream", "http://127.0.0.1:9/v1", "--upstream-model", "m")
    (only,) = backends_from_args(args, env={})
    assert (only.name, only.kind, only.base_url, only.model) == (
        "m",
        "chat",
        "http://127.0.0.1:9/v1",
        "m",
    )
    env = {
        "LONGRESPONSE_UPSTREAM": "http://e/v1",
        "LONGRESPONSE_UPSTREAM_MODEL": "upstream-name",
        "LONGRESPONSE_UPSTREAM_KIND": "responses",
        "LONGRESPONSE_SERVED_MODEL_NAME": "served",
        "LONGRESPONSE_UPSTREAM_CONTEXT_WINDOW": "4096",
        "LONGRESPONSE_UPSTREAM_API_KEY_ENV": "E_KEY",
    }
    (only,) = backends_from_args(parse(), env=env)
    assert only == BackendConfig(
        name="served",
        kind="responses",
        base_url="http://e/v1",
        upstream_model="upstream-name",
        api_key_env="E_KEY",
        context_window=4096,
    )
    # A flag wins over its variable; the file's models come first.
    path = write(tmp_path, '[models.other]\nkind = "chat"\nbase_url = "http://o/v1"\n')
    both = backends_from_args(parse("--config", path, "--upstream-kind", "chat"), env=env)
    assert [(b.name, b.kind) for b in both] == [("other", "chat"), ("served", "chat")]
    assert backends_from_args(parse(), env={}) == ()
    with pytest.raises(SettingsError, match="go together"):
        backends_from_args(parse("--upstream", "http://e/v1"), env={})
    with pytest.raises(SettingsError, match="context window not an integer"):
        backends_from_args(parse(), env={**env, "LONGRESPONSE_UPSTREAM_CONTEXT_WINDOW": "x"})


def test_a_missing_key_names_the_variable_never_a_value() -> None:
    config = BackendConfig(name="m", kind="chat", base_url="http://h/v1", api_key_env="THE_KEY")
    assert missing_keys([config], env={}) == (
        "model 'm': the environment variable THE_KEY (its API key) is not set"
    )
    assert missing_keys([config], env={"THE_KEY": "sk-secret"}) is None
    with pytest.raises(SettingsError, match="unknown backend kind"):
        open_backends([BackendConfig(name="m", kind="smoke-signals", base_url="http://h")])


@pytest.mark.slow  # server processes that refuse to start
def test_serve_refuses_a_bad_configuration_with_exit_2(tmp_path: Path) -> None:
    bad = write(tmp_path, '[models.m]\nkind = "chat"\nbase_url = "http://h/v1"\ntimeout = 1\n')
    for argv, message in [
        (["--config", bad], "unknown setting 'timeout'"),
        (["--upstream", "http://h/v1"], "go together"),
        (
            [
                "--upstream",
                "http://h/v1",
                "--upstream-model",
                "m",
                "--upstream-api-key-env",
                "NOPE_K",
            ],
            "NOPE_K (its API key) is not set",
        ),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "longresponse", "serve", "--port", "0", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 2, done.stderr
        assert message in done.stderr
