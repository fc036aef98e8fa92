"""The layers of the house, checked against the code (the idea of trio's ``test_exports``).

- ``protocol/`` imports nothing of ``longresponse`` (and no I/O: ``test_protocol``);
- ``longresponse.engine`` imports nothing of ``serve`` or ``storage``;
- ``longresponse.storage`` imports nothing of ``engine`` (nor ``serve``);
- ``longresponse.backends`` (real engines) imports nothing of ``serve`` or ``storage``;
- the client imports nothing of the project but ``protocol``;
- one state machine per response, in the protocol core: outside ``protocol/``
  only the engine's Reply drives one, and nothing assigns a response's state;
- every module says what it does (a docstring) and stays under ~500 lines.
"""

from __future__ import annotations

import ast
import asyncio
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from longresponse.config import ServerConfig
from longresponse.engine.stream import PeerGone, ServerClosed, StreamClosed
from longresponse.serve.http.sinks import RecordingSink, SSESink
from longresponse.serve.ws.session import Outbox
from protocol import LocalProtocolError, Mode
from protocol.events import OutputTextDelta, ResponseCreated
from protocol.response import Response
from tests.support.paths import ROOT

#: A module of the packages may not pass this many lines (STYLE: ~500).
MAX_MODULE_LINES = 520


def modules(package: str) -> Iterator[tuple[str, pathlib.Path]]:
    """(dotted module name, path) of every module under ``package``."""
    base = ROOT / package.replace(".", "/")
    for path in sorted(base.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def imported(name: str, path: pathlib.Path) -> set[str]:
    """Every module ``path`` (the module ``name``) imports, as absolute dotted names."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def offenders(package: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad: dict[str, list[str]] = {}
    for name, path in modules(package):
        hits = sorted(
            m
            for m in imported(name, path)
            if any(m == f or m.startswith(f + ".") for f in forbidden)
        )
        if hits:
            bad[name] = hits
    return bad


def test_the_layers_are_where_the_layout_says() -> None:
    names = {name for name, _ in modules("longresponse")}
    for required in (
        "longresponse.engine.rollout",
        "longresponse.engine.segment",
        "longresponse.engine.admission",
        "longresponse.serve.turns",
        "longresponse.serve.ws.session",
        "longresponse.serve.ws.append",
        "longresponse.serve.ws.shipped",
        "longresponse.serve.continuation",
        "longresponse.serve.http.responses",
        "longresponse.storage.persistence",
        "longresponse.client",
    ):
        assert required in names, required


def test_protocol_imports_nothing_of_longresponse() -> None:
    assert offenders("protocol", ("longresponse",)) == {}


def test_engine_imports_nothing_of_serve_or_storage() -> None:
    assert offenders("longresponse.engine", ("longresponse.serve", "longresponse.storage")) == {}


def test_storage_imports_nothing_of_engine_or_serve() -> None:
    assert offenders("longresponse.storage", ("longresponse.engine", "longresponse.serve")) == {}


def test_backends_import_nothing_of_serve_or_storage() -> None:
    forbidden = ("longresponse.serve", "longresponse.storage")
    assert offenders("longresponse.backends", forbidden) == {}


def test_the_client_imports_only_protocol() -> None:
    project = ("longresponse.engine", "longresponse.serve", "longresponse.storage")
    project += ("longresponse.config", "longresponse.ids", "longresponse.cli")
    assert offenders("longresponse.client", project) == {}
    for name, path in modules("longresponse.client"):
        outside = {
            m
            for m in imported(name, path)
            if m.startswith("longresponse") and not m.startswith("longresponse.client")
        }
        assert outside == set(), name


def test_the_imports_checker_sees_relative_imports() -> None:
    # A check that cannot fail is a defect: the walker must resolve ``..``.
    path = ROOT / "longresponse" / "serve" / "turns.py"
    assert "longresponse.engine.rollout" in imported("longresponse.serve.turns", path)
    bad = offenders("longresponse.serve", ("longresponse.engine",))
    assert "longresponse.serve.turns" in bad


def _state_writes(path: pathlib.Path) -> list[str]:
    """Lines of ``path`` that make or move a response state machine, or assign a state."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("ResponseStateMachine", "ResponseTrack"):
                hits.append(f"{path.name}:{node.lineno} makes a {func.id}")
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "process"
                and isinstance(func.value, ast.Attribute)
                and func.value.attr == "machine"
            ):
                hits.append(f"{path.name}:{node.lineno} drives a machine")
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "state":
                    hits.append(f"{path.name}:{node.lineno} assigns .{target.attr}")
    return hits


def test_only_the_protocol_core_keeps_a_responses_state() -> None:
    found = {
        name: hits
        for name, path in modules("longresponse")
        if not name.startswith("longresponse.bench") and (hits := _state_writes(path))
    }
    # The engine drives the machine in one place: a Reply whose stream is
    # gone ends cancelled (nobody is left to tell).
    assert found == {"longresponse.engine.reply": [found["longresponse.engine.reply"][0]]}
    assert "drives a machine" in found["longresponse.engine.reply"][0]


@pytest.mark.parametrize("package", ["protocol", "longresponse"])
def test_every_module_opens_with_what_it_does_and_stays_small(package: str) -> None:
    for name, path in modules(package):
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        assert lines <= MAX_MODULE_LINES, f"{name} has {lines} lines"
        if path.name == "__init__.py" and not text.strip():
            continue
        tree = ast.parse(text)
        assert ast.get_docstring(tree), f"{name} has no module docstring"


# --- every transport's events go through the protocol core -------------------


def _created(response_id: str = "resp_1") -> ResponseCreated:
    response = Response(id=response_id, created_at=0, status="in_progress", model="sim")
    return ResponseCreated(sequence_number=0, response=response)


def _delta(sequence_number: int) -> OutputTextDelta:
    return OutputTextDelta(
        sequence_number=sequence_number, item_id="m", output_index=0, content_index=0, delta="x"
    )


@pytest.mark.parametrize("sink_type", ["json", "sse", "websocket"])
def test_every_sink_checks_its_events_in_the_protocol_core(sink_type: str) -> None:
    async def scenario() -> None:
        sink: RecordingSink | Outbox
        if sink_type == "json":
            sink = RecordingSink()
        elif sink_type == "sse":
            sink = SSESink(4)
        else:
            sink = Outbox(ServerConfig(), Mode.SHIPPED)
        sink.push(_created())
        track = sink.track("resp_1")
        assert track.next_sequence == 1
        with pytest.raises(LocalProtocolError):
            sink.push(_delta(5))  # out of order: refused, nothing recorded
        assert track.next_sequence == 1
        sink.push(_delta(1))
        assert track.next_sequence == 2
        if isinstance(sink, SSESink):
            assert await sink.next() == (
                b"event: response.created\ndata: " + _created_bytes() + b"\n\n"
            )

    asyncio.run(scenario())


def _created_bytes() -> bytes:
    from protocol import encode_event

    return encode_event(_created())


# --- "we closed" and "the peer is gone" are two errors -----------------------


def test_a_closing_outbox_raises_server_closed_and_a_failed_send_peer_gone() -> None:
    async def scenario() -> None:
        config = ServerConfig(send_queue_depth=1, slow_reader_timeout=0.01)
        outbox = Outbox(config, Mode.APPEND)
        outbox.push(_created())
        with pytest.raises(ServerClosed) as slow:
            await outbox.room()  # full, and nobody drains it
        assert slow.value.reason == "slow_reader"
        assert outbox.closing is not None

        async def broken_send(message: dict[str, object]) -> None:
            raise ConnectionResetError("peer reset")

        fresh = Outbox(config, Mode.APPEND)
        fresh.push(_created())
        with pytest.raises(PeerGone) as gone:
            await fresh.write_to(broken_send)
        assert isinstance(gone.value, StreamClosed)
        assert not isinstance(gone.value, ServerClosed)

    asyncio.run(scenario())


# --- importing the client loads no server -----------------------------------------

SERVER_ONLY = ("starlette", "uvicorn", "redis", "sqlite3", "cryptography", "jsonschema")


def loaded_by(statement: str) -> set[str]:
    """The top-level modules of :data:`SERVER_ONLY` that ``statement`` loads, in a
    fresh interpreter."""
    probe = (
        f"import sys; {statement}; "
        f"print(' '.join(m for m in {SERVER_ONLY!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(done.stdout.split())


def test_importing_the_client_loads_no_server() -> None:
    assert loaded_by("import longresponse.client") == set()
    assert loaded_by("from longresponse.client import connect") == set()


def test_the_client_import_check_sees_a_server_load() -> None:
    # A check that cannot fail is a defect: the probe sees what the server loads.
    loaded = loaded_by("import longresponse.client, longresponse.serve.app")
    assert {"starlette", "redis", "sqlite3", "cryptography"} <= loaded
