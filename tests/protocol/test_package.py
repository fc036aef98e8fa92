"""The package: sans-IO, its exports, its type information, the committed JSON Schema."""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

import protocol
from protocol import (
    Connection,
    ErrorCode,
    RemoteProtocolError,
    Role,
    encode_event,
)
from protocol.events import (
    ResponseAppend,
)
from tests.support.paths import ROOT

PROTOCOL_DIR = pathlib.Path(protocol.__file__).parent


# --- the package: sans-IO and its exports ------------------------------------

FORBIDDEN_IMPORTS = frozenset(
    {"asyncio", "trio", "anyio", "starlette", "uvicorn", "socket", "wsproto", "longresponse"}
)


def forbidden_imports(source: str) -> list[str]:
    """Top-level modules named in ``source``'s imports that the sans-IO rule forbids."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        else:
            continue
        found += [name for name in names if name.split(".")[0] in FORBIDDEN_IMPORTS]
    return found


def protocol_sources() -> Iterator[pathlib.Path]:
    yield from sorted(PROTOCOL_DIR.rglob("*.py"))


@pytest.mark.parametrize(
    "source",
    [
        "import trio",
        "import os, socket",
        "from asyncio import Queue",
        "from wsproto.events import Ping",
        "if TYPE_CHECKING:\n    import starlette.types",
        "def f():\n    import uvicorn",
        "importlib.import_module('anyio')",
        "__import__('longresponse.client')",
    ],
)
def test_the_import_walker_catches_forbidden_imports(source: str) -> None:
    assert forbidden_imports(source)


def test_the_import_walker_allows_the_rest() -> None:
    assert forbidden_imports("import msgspec\nfrom .codec import x\nfrom typing import Any") == []


def test_protocol_is_sans_io() -> None:
    sources = list(protocol_sources())
    assert PROTOCOL_DIR / "connection.py" in sources
    offenders = {
        path.name: names
        for path in sources
        if (names := forbidden_imports(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def test_importing_protocol_loads_no_io_library() -> None:
    code = (
        "import sys, protocol; "
        f"bad = {sorted(FORBIDDEN_IMPORTS)!r}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert result.stdout.strip() == "[]"


def public_modules() -> list[str]:
    return [
        f"protocol.{path.stem}"
        for path in sorted(PROTOCOL_DIR.glob("*.py"))
        if not path.stem.startswith("_")
    ]


def test_package_exports_exist_once() -> None:
    assert len(protocol.__all__) == len(set(protocol.__all__))
    missing = [name for name in protocol.__all__ if not hasattr(protocol, name)]
    assert missing == []


#: The wire vocabulary: exported as namespaces (``protocol.events.ResponseDone``),
#: not name by name, so the package's own API stays small.
VOCABULARY = ("protocol.events", "protocol.items", "protocol.response")
#: Run as a command (``python -m protocol.schema``), not imported by the package.
TOOLS = ("protocol.schema",)


@pytest.mark.parametrize("module_name", public_modules())
def test_every_public_module_is_reexported(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert hasattr(module, "__all__"), f"{module_name} has no __all__"
    short = module_name.removeprefix("protocol.")
    if module_name in VOCABULARY:
        assert short in protocol.__all__
        assert getattr(protocol, short) is module
        return
    if module_name in TOOLS:
        assert short not in protocol.__all__
        return
    for name in module.__all__:
        assert name in protocol.__all__, f"{module_name}.{name} is not re-exported"
        assert getattr(protocol, name) is getattr(module, name)


def test_the_public_api_is_small_and_internals_are_private() -> None:
    assert len(protocol.__all__) <= 35
    for internal in ("ResponseCreateBody", "check_append_items", "NeedData", "Closed"):
        assert internal not in protocol.__all__
    assert set(VOCABULARY) | set(TOOLS) | {
        "protocol.codec",
        "protocol.connection",
        "protocol.errors",
        "protocol.state",
    } == set(public_modules())


def test_public_modules_are_found() -> None:
    assert {"protocol.codec", "protocol.connection", "protocol.state"} <= set(public_modules())


def test_package_ships_type_information() -> None:
    assert (PROTOCOL_DIR / "py.typed").exists()


def test_message_limit_counts_utf8_bytes_not_characters() -> None:

    server = Connection(Role.SERVER, max_message_bytes=100)
    text = '{"type":"response.create","input":"' + "é" * 40 + '"}'  # 77 chars, 117 bytes
    assert len(text) <= 100 < len(text.encode())
    with pytest.raises(RemoteProtocolError) as raised:
        server.receive_message(text)
    assert raised.value.code == ErrorCode.MESSAGE_TOO_LARGE
    server.receive_message('{"type":"response.create","input":"' + "é" * 20 + '"}')


#: What a user of the package imports from it: the client, the settings, the
#: app factory and the server process helper (README, docs/, examples/).
PUBLIC_SURFACE = {
    "AppendClient",
    "ClientError",
    "ConnectionClosedError",
    "HandshakeError",
    "ResilientClient",
    "ServerConfig",
    "ServerProcess",
    "SimConfig",
    "Switches",
    "connect",
    "create_app",
    "resilient",
}


def test_longresponse_exports_exist_and_are_complete() -> None:
    import importlib

    import longresponse

    assert set(longresponse.__all__) == PUBLIC_SURFACE
    for name in longresponse.__all__:
        assert hasattr(longresponse, name), name
    # the server's inside is imported from its modules, not re-exported
    for internal in ("Session", "ShippedShape", "SegmentCache", "Rollout", "Pipeline"):
        assert not hasattr(longresponse, internal), internal
    # every public name a server module lists is reachable from its module
    for module_name in (
        "serve.app",
        "serve.ws.shipped",
        "engine.admission",
        "engine.rollout",
        "storage.backends",
        "engine.classifier",
    ):
        module = importlib.import_module(f"longresponse.{module_name}")
        for name in module.__all__:
            assert hasattr(module, name), (module_name, name)


def test_committed_json_schema_matches_the_structs() -> None:
    import json

    import jsonschema

    from protocol.schema import event_schemas

    committed = json.loads((ROOT / "protocol" / "schema.json").read_text())
    assert committed == event_schemas(), (
        "regenerate: python -m protocol.schema > protocol/schema.json"
    )
    jsonschema.Draft202012Validator.check_schema(committed)
    # A real event validates against it.

    frame = json.loads(encode_event(ResponseAppend(input="hi")))
    validator = jsonschema.Draft202012Validator(
        {"$ref": "#/$defs/ClientEvent", "$defs": committed["$defs"]}
    )
    validator.validate(frame)
    assert list(validator.iter_errors({"type": "response.append"}))  # input is required
