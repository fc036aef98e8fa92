"""Each setting declared once: the command line, the environment, the settings
file and docs/SERVING.md agree with the declarations (``config.SETTINGS``)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest

from longresponse.cli import build_parser, config_from_args
from longresponse.config import RANGES, SETTINGS, ServerConfig, Switches
from longresponse.server_process import STARTUP_TIMEOUT, STOP_TIMEOUT, free_port, stop_process
from longresponse.settings import SettingsError
from tests.support.paths import ROOT

#: ServerConfig's fields that no setting sets: the backends come from the
#: file's [models.*] and the upstream settings.
NOT_SETTINGS = {"backends"}


def serve_actions() -> list[Any]:
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    return [action for action in serve._actions if action.dest != "help"]


def leaf_fields(cls: type, prefix: str = "") -> set[str]:
    """The dotted names of ``cls``'s fields, a dataclass member's fields in its place."""
    names = set()
    for field in dataclasses.fields(cls):
        if field.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(
            made := field.default_factory()
        ):
            names |= leaf_fields(type(made), f"{prefix}{field.name}.")
        else:
            names.add(prefix + field.name)
    return names


# --- the declarations --------------------------------------------------------


def test_every_server_config_field_is_a_declared_setting() -> None:
    targets = [s.field or s.name for s in SETTINGS if s.field is not None]
    assert len(targets) == len(set(targets))
    assert set(targets) == leaf_fields(ServerConfig) - NOT_SETTINGS


def test_the_declared_defaults_make_the_default_config() -> None:
    assert config_from_args(build_parser().parse_args(["serve"]), env={}) == ServerConfig()


def test_names_variables_and_ranges_follow_one_rule() -> None:
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))
    for setting in SETTINGS:
        assert setting.env == "LONGRESPONSE_" + setting.name.upper()
        assert (setting.range is not None) == (setting.kind in (int, float)), setting.name
    assert set(RANGES) == {s.name for s in SETTINGS if s.range is not None}


# --- the command line --------------------------------------------------------


def test_help_shows_each_flag_once_with_one_default() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "longresponse", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    text = " ".join(result.stdout.split())  # argparse wraps help lines
    actions = serve_actions()
    assert {action.dest for action in actions} == {s.name for s in SETTINGS}
    for action in actions:
        assert action.help.count("(default: ") == 1, action.option_strings
        assert "(default: None)" not in action.help
        assert "(default: True)" not in action.help
    assert text.count("(default: ") == len(SETTINGS)
    for setting in SETTINGS:
        assert text.count(f"; {setting.env})") == 1, setting.env
        assert f"(default: {setting.shown_default}; {setting.env})" in text
    assert "(default: forever; LONGRESPONSE_STORE_TTL)" in text
    assert "(default: on; LONGRESPONSE_TOKEN_CACHE)" in text


def test_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "longresponse", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == f"longresponse {metadata.version('longresponse')}"


def test_booleans_have_both_forms_and_keep_their_old_spellings() -> None:
    parse = build_parser().parse_args
    for argv, expected in [
        ([], True),
        (["--no-token-cache"], False),
        (["--token-cache"], True),
        (["--no-token-cache", "--token-cache"], True),
    ]:
        assert config_from_args(parse(["serve", *argv]), env={}).switches.token_cache is expected
    for argv, on in [
        (["--ws-compression", "on"], True),
        (["--ws-compression", "off"], False),
        (["--ws-compression"], True),
        (["--no-ws-compression"], False),
        (["--ws-per-message-deflate", "true"], True),  # uvicorn's name and spelling
        (["--ws-per-message-deflate", "false"], False),
    ]:
        assert config_from_args(parse(["serve", *argv]), env={}).ws_compression is on, argv
    cache = [([], True), (["--prefix-reuse"], True), (["--no-prefix-reuse"], False)]
    for argv, on in cache:
        assert config_from_args(parse(["serve", *argv]), env={}).prefix_reuse is on


def test_the_aliases_set_the_same_setting() -> None:
    parse = build_parser().parse_args
    ours = config_from_args(parse(["serve", "--shutdown-drain-timeout", "7"]), env={})
    uvicorns = config_from_args(parse(["serve", "--timeout-graceful-shutdown", "7"]), env={})
    assert ours == uvicorns
    assert uvicorns.shutdown_drain_timeout == 7
    flags = ["--upstream", "http://e/v1", "--upstream-model", "m", "--max-model-len", "4096"]
    (backend,) = config_from_args(parse(["serve", *flags]), env={}).backends
    assert backend.context_window == 4096


def test_an_out_of_range_alias_is_refused_as_the_flag_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--timeout-graceful-shutdown", "-1"])
    assert exited.value.code == 2
    assert "must be 0.001 to 86400, not -1" in capsys.readouterr().err


# --- the environment and the file, and which wins ------------------------------


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "longresponse.toml"
    path.write_text(text)
    return str(path)


def test_a_flag_beats_its_variable_which_beats_the_file_which_beats_the_default(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        "[server]\nport = 1111\nmax_lanes = 3\npause_timeout = 5\nsecrets_policy = 'redact'\n",
    )
    env = {"LONGRESPONSE_CONFIG": path, "LONGRESPONSE_PORT": "2222", "LONGRESPONSE_MAX_LANES": "4"}
    config = config_from_args(build_parser().parse_args(["serve", "--port", "3333"]), env=env)
    assert config.port == 3333  # the flag
    assert config.max_lanes == 4  # the variable, over the file
    assert config.pause_timeout == 5.0  # the file, over the default
    assert config.secrets_policy == "redact"
    assert config.max_queued == ServerConfig().max_queued  # the default
    # The file named by the flag, not the variable.
    (tmp_path / "other").mkdir()
    other = write(tmp_path / "other", "[server]\nmax_queued = 9\n")
    args = build_parser().parse_args(["serve", "--config", other])
    assert config_from_args(args, env={**env, "LONGRESPONSE_MAX_LANES": ""}).max_queued == 9


def test_the_file_carries_server_settings_beside_the_models(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[server]
store = "memory://"
inspector = false
keepalive_interval = 2
sim_ttft_ms = 250
mcp_allow_host = ["MCP.example.com"]
sim_calls = ['read_file={"cmd": "ls"}']
token_cache = false

[models.qwen]
kind = "chat"
base_url = "http://127.0.0.1:9/v1"
""",
    )
    config = config_from_args(build_parser().parse_args(["serve", "--config", path]), env={})
    assert (config.store, config.inspector, config.keepalive_interval) == ("memory://", False, 2.0)
    assert config.sim.time_to_first_token == 0.25
    assert config.mcp.allowed_hosts == frozenset({"mcp.example.com"})
    assert config.sim.calls == (("read_file", '{"cmd":"ls"}'),)
    assert config.switches == Switches(token_cache=False)
    assert [backend.name for backend in config.backends] == ["qwen"]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("prot = 1", "[server]: unknown setting 'prot'"),
        ("config = 'other.toml'", "[server]: unknown setting 'config'"),
        ("port = 70000", "[server] port: must be 0 to 65535, not 70000"),
        ("port = '80'", "[server] port: must be an integer, not '80'"),
        ("inspector = 'off'", "[server] inspector: must be true or false, not 'off'"),
        ("secrets_policy = 'x'", "[server] secrets_policy: must be one of flag, redact, refuse"),
        ("api_keys = 'k'", "[server] api_keys: must be a list of strings"),
    ],
)
def test_a_bad_file_setting_is_refused_naming_the_file_and_key(
    tmp_path: Path, table: str, message: str
) -> None:
    path = write(tmp_path, f"[server]\n{table}\n")
    with pytest.raises(SettingsError) as refused:
        config_from_args(build_parser().parse_args(["serve", "--config", path]), env={})
    assert str(refused.value).startswith(path)
    assert message in str(refused.value)


def test_an_unknown_table_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "[sever]\nport = 1\n")
    with pytest.raises(SettingsError, match=re.escape("unknown table 'sever'")):
        config_from_args(build_parser().parse_args(["serve", "--config", path]), env={})


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("LONGRESPONSE_PORT", "http", "LONGRESPONSE_PORT: not an integer: 'http'"),
        ("LONGRESPONSE_INSPECTOR", "maybe", "LONGRESPONSE_INSPECTOR: not on or off: 'maybe'"),
        ("LONGRESPONSE_STORE_TTL", "nan", "LONGRESPONSE_STORE_TTL: must be 0.001 to"),
        ("LONGRESPONSE_HOSTED_TOOLS", "sure", "LONGRESPONSE_HOSTED_TOOLS: must be one of accept"),
        ("LONGRESPONSE_SIM_CALLS", "x=[1]", "LONGRESPONSE_SIM_CALLS: not NAME=<a JSON object>"),
        ("LONGRESPONSE_MAX_MODEL_LEN", "1", None),  # an alias is a flag only
    ],
)
def test_a_bad_variable_is_refused_naming_it(
    variable: str, value: str, message: str | None
) -> None:
    args = build_parser().parse_args(["serve"])
    if message is None:
        assert config_from_args(args, env={variable: value}) == ServerConfig()
        return
    with pytest.raises(SettingsError) as refused:
        config_from_args(args, env={variable: value})
    assert str(refused.value).startswith(message)


@pytest.mark.slow  # server processes that refuse to start
def test_serve_exits_2_on_an_out_of_range_variable_as_on_the_flag() -> None:
    by_variable = subprocess.run(
        [sys.executable, "-m", "longresponse", "serve"],
        capture_output=True,
        text=True,
        env={**os.environ, "LONGRESPONSE_PORT": "99999"},
        timeout=60,
    )
    assert by_variable.returncode == 2
    assert "LONGRESPONSE_PORT: must be 0 to 65535, not 99999" in by_variable.stderr
    by_flag = subprocess.run(
        [sys.executable, "-m", "longresponse", "serve", "--port", "99999"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert by_flag.returncode == 2
    assert "--port: must be 0 to 65535, not 99999" in by_flag.stderr


def test_variables_of_every_kind_are_read() -> None:
    env = {
        "LONGRESPONSE_INSPECTOR": "off",
        "LONGRESPONSE_SIM_TOKENS_PER_SECOND": "65",
        "LONGRESPONSE_API_KEYS": "a, b",
        "LONGRESPONSE_SIM_CALLS": 'read_file={"cmd": "ls"}\nview_image={}',
        "LONGRESPONSE_NO_SUCH_SETTING": "ignored",  # not a setting: none of ours
    }
    config = config_from_args(build_parser().parse_args(["serve"]), env=env)
    assert config.inspector is False
    assert config.sim.tokens_per_second == 65.0
    assert config.api_keys == ("a", "b")
    assert config.sim.calls == (("read_file", '{"cmd":"ls"}'), ("view_image", "{}"))


# --- a real `longresponse serve` configured by its environment ----------------


@pytest.fixture
def served_by_environment(tmp_path: Path) -> Iterator[int]:
    """``longresponse serve`` with no flags at all: its port, a boolean and a
    float from LONGRESPONSE_* variables, its store from the settings file."""
    port = free_port()
    path = write(tmp_path, '[server]\nstore = "memory://"\nport = 1\n')
    env = {
        **os.environ,
        "LONGRESPONSE_PORT": str(port),  # over the file's
        "LONGRESPONSE_INSPECTOR": "off",
        "LONGRESPONSE_KEEPALIVE_INTERVAL": "0.05",
        "LONGRESPONSE_LOG_LEVEL": "warning",
        "LONGRESPONSE_CONFIG": path,
    }
    process = subprocess.Popen([sys.executable, "-m", "longresponse", "serve"], env=env)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert process.poll() is None, "the server exited"
                assert time.monotonic() < deadline, "the server did not listen on the port"
                time.sleep(0.05)
        yield port
    finally:
        stop_process(process, signal.SIGINT, STOP_TIMEOUT)


@pytest.mark.slow  # a server process
def test_a_server_takes_its_settings_from_the_environment(served_by_environment: int) -> None:
    base = f"http://127.0.0.1:{served_by_environment}"
    with httpx.Client(base_url=base, timeout=30) as http:
        assert http.get("/inspect/api/state").json()["enabled"] is False
        body = {
            "model": "sim",
            "input": "slow",
            "stream": True,
            "metadata": {"sim_ttft_ms": "400", "sim_tool_calls": "0"},
        }
        with http.stream("POST", "/v1/responses", json=body) as reply:
            kinds = [
                json.loads(line.removeprefix("data: "))["type"]
                for line in reply.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"
            ]
    # 400 ms of silence at one keepalive every 50 ms (the default is 15 s).
    assert kinds.count("keepalive") >= 3
    assert kinds[-1] == "response.completed"


# --- docs/SERVING.md ------------------------------------------------------------


def flags_table_rows() -> list[list[str]]:
    """The cells of each row of SERVING.md's flags table."""
    text = (ROOT / "docs" / "SERVING.md").read_text(encoding="utf-8")
    table = text.split("## The flags", 1)[1].split("\n\n", 2)[1]
    lines = table.splitlines()
    assert lines[0] == "| flag | environment | default | meaning |"
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines[2:]]


def test_the_docs_flags_table_lists_every_setting_and_nothing_else() -> None:
    rows = flags_table_rows()
    declared = {option for action in serve_actions() for option in action.option_strings}
    by_variable: dict[str, list[str]] = {}
    for flag, variable, default, meaning in rows:
        documented = set(re.findall(r"--[a-z0-9-]+", flag))
        assert documented, flag
        assert documented <= declared, f"documented but not declared: {documented - declared}"
        (name,) = re.findall(r"`(LONGRESPONSE_[A-Z_]+)`", variable)
        assert name not in by_variable, f"{name} documented twice"
        by_variable[name] = [flag, default, meaning]
    for setting in SETTINGS:
        assert setting.env in by_variable, f"{setting.option} ({setting.env}) is not in the docs"
        flag, default, meaning = by_variable[setting.env]
        for option in (setting.option, *setting.aliases):
            assert re.search(rf"`{option}\b", flag), f"{option} is not in its row: {flag}"
        assert meaning
        # The default as --help states it, maybe with a gloss: "2592000 (30 days)".
        shown = re.sub(r"^(\d+)\.0(?=\s|$)", r"\1", default.replace("`", "").replace(",", ""))
        assert f"{shown} ".startswith(f"{setting.shown_default} "), (setting.name, default)
    assert len(by_variable) == len(SETTINGS)
