"""The layers of the house, checked against the code (the idea of trio's ``test_exports``).

- ``protocol/`` imports nothing of ``longresponse`` (and no I/O:
  ``tests/protocol/test_package.py``);
- ``longresponse.engine`` imports nothing of ``backends``, ``chat``, ``serve``,
  ``storage``, the client or the bench;
- ``longresponse.storage`` imports nothing of ``engine`` (nor ``serve``);
- ``longresponse.backends`` (the sim and the real engines) imports nothing of
  ``serve`` or ``storage``, and of the engine only the sampler interface
  (``engine/sampling.py``);
- the client imports nothing of the project but ``protocol``, and importing it
  in a fresh interpreter loads no server library (the package ``__init__`` is lazy);
- one state machine per response, in the protocol core: outside ``protocol/``
  only the engine's Reply drives one, and nothing assigns a response's state;
- one owner per piece of state: only ``engine/rollout.py`` changes a Rollout's
  fields, only ``engine/reply.py`` a Reply's, only ``engine/segment.py`` a
  Segment's, and the Rollout's collaborators (``Boundaries``, ``DeferredCount``,
  ``HostedCalls``) only in their own modules (everything else calls their methods);
  and in ``serve/`` no module assigns (or deletes, or sets with ``setattr``) an
  attribute of any object but ``self``: hooks are passed in, and state is
  changed by its owner's methods;
- no import circle anywhere in ``protocol/`` and ``longresponse/``, not even a
  type-only one (a lower module declares a ``Protocol`` for what it needs);
- no test reads a private name of the product;
- every module says what it does (a docstring). Modules are split by concern,
  never by line count: there is no size limit.
"""

from __future__ import annotations

import ast
import asyncio
import functools
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


@functools.cache
def parsed(text: str) -> ast.Module:
    """The tree of a module's text, parsed once for all the checks here (they
    read every file of the project, several times over); never changed."""
    return ast.parse(text)


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
    for node in ast.walk(parsed(path.read_text(encoding="utf-8"))):
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
    for node in ast.walk(parsed(path.read_text(encoding="utf-8"))):
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
def test_every_module_opens_with_what_it_does(package: str) -> None:
    for name, path in modules(package):
        text = path.read_text(encoding="utf-8")
        if path.name == "__init__.py" and not text.strip():
            continue
        tree = parsed(text)
        assert ast.get_docstring(tree), f"{name} has no module docstring"


# --- one owner per piece of state ------------------------------------------------

#: Class → (the module that owns its fields, names a value of it goes by). A
#: value also counts as one when a parameter or variable is annotated with it.
OWNERS: dict[str, tuple[str, frozenset[str]]] = {
    # ``conversation``: the rollout as its collaborators hold it (the turn loop, a count).
    "Rollout": (
        "longresponse.engine.rollout",
        frozenset({"rollout", "child", "parent", "conversation"}),
    ),
    "Reply": ("longresponse.engine.reply", frozenset({"reply"})),
    "Segment": ("longresponse.engine.segment", frozenset({"segment"})),
    # The Rollout's collaborators keep state of their own, changed only by them.
    "Boundaries": ("longresponse.engine.boundary", frozenset({"boundaries"})),
    "DeferredCount": ("longresponse.engine.counting", frozenset({"held"})),
    "HostedCalls": ("longresponse.engine.hosted", frozenset({"hosted"})),
}
#: Methods that change the list, dict, set or token cache they are called on.
MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault",
     "add", "discard", "sort", "reverse", "extend_tokens", "defer", "tokenize_deferred"}
)  # fmt: skip


def declared_fields(module: str, cls: str) -> set[str]:
    """The fields ``cls`` declares in ``module``: ``self.x = ...`` in its methods,
    annotations and ``__slots__`` in its body."""
    path = ROOT / (module.replace(".", "/") + ".py")
    tree = parsed(path.read_text(encoding="utf-8"))
    (body,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    fields: set[str] = set()
    for node in ast.walk(body):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for leaf in _leaves(target):
                if isinstance(leaf, ast.Attribute) and _is_self(leaf.value):
                    fields.add(leaf.attr)
                elif isinstance(leaf, ast.Name) and node in body.body:
                    fields.add(leaf.id)
    return fields - {"__slots__"}


def _leaves(target: ast.expr) -> Iterator[ast.expr]:
    """The assigned expressions of a target (tuples and starred unpacked)."""
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _leaves(element)
    elif isinstance(target, ast.Starred):
        yield from _leaves(target.value)
    else:
        yield target


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _last_name(node: ast.expr) -> str | None:
    """``rollout`` for ``rollout``, ``started.rollout`` and ``self.rollout``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _typed_names(tree: ast.Module, cls: str) -> set[str]:
    """Parameters and variables of ``tree`` annotated with ``cls`` (or ``cls | None``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            name, annotation = node.arg, node.annotation
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name, annotation = node.target.id, node.annotation
        else:
            continue
        if any(isinstance(n, ast.Name) and n.id == cls for n in ast.walk(annotation)) or (
            isinstance(annotation, ast.Constant) and cls in str(annotation.value).split(" | ")
        ):
            found.add(name)
    return found


def field_writes(path: pathlib.Path, owned: dict[str, tuple[set[str], set[str]]]) -> list[str]:
    """Where ``path`` assigns (or changes in place) a field of an owned class:
    ``owned`` maps the class to (its fields, the names its values go by)."""
    tree = parsed(path.read_text(encoding="utf-8"))
    receivers = {cls: names | _typed_names(tree, cls) for cls, (_, names) in owned.items()}
    hits: list[tuple[int, str]] = []

    def check(target: ast.expr, how: str) -> None:
        node = target
        while isinstance(node, ast.Attribute | ast.Subscript):
            if isinstance(node, ast.Attribute):
                whose = _last_name(node.value)
                for cls, (fields, _) in owned.items():
                    if whose in receivers[cls] and node.attr in fields:
                        line = target.lineno
                        hits.append((line, f"{path.name}:{line} {how} {cls}.{node.attr}"))
            node = node.value

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            if isinstance(node, ast.Assign | ast.Delete):
                targets = node.targets
            else:
                targets = [node.target]
            for target in targets:
                for leaf in _leaves(target):
                    check(leaf, "deletes" if isinstance(node, ast.Delete) else "assigns")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and isinstance(node.func.value, ast.Attribute)
        ):
            check(node.func.value, f"calls .{node.func.attr}() on")
    return [hit for _, hit in sorted(hits)]


def _owned() -> dict[str, tuple[set[str], set[str]]]:
    return {
        cls: (declared_fields(module, cls), set(names))
        for cls, (module, names) in OWNERS.items()
    }


def test_only_its_own_module_changes_a_rollout_a_reply_or_a_segment() -> None:
    owned = _owned()
    assert {"context", "tokens", "counts", "model_seen", "_inbox"} <= owned["Rollout"][0]
    assert {"error", "incomplete_reason", "flags"} <= owned["Reply"][0]
    assert {"_kept"} <= owned["Boundaries"][0]
    assert {"pending"} <= owned["DeferredCount"][0]
    assert {"ran"} <= owned["HostedCalls"][0]
    found: dict[str, list[str]] = {}
    for name, path in modules("longresponse"):
        if name.startswith("longresponse.bench"):
            continue
        mine = {cls: v for cls, v in owned.items() if OWNERS[cls][0] != name}
        if hits := field_writes(path, mine):
            found[name] = hits
    assert found == {}


def test_the_field_checker_sees_a_write(tmp_path: pathlib.Path) -> None:
    # A check that cannot fail is a defect: each form it looks for is found.
    planted = tmp_path / "planted.py"
    planted.write_text(
        "def f(rollout, started, x: 'Reply', seg: Segment | None):\n"
        "    rollout.tokens = 1\n"
        "    started.rollout.counts.input_tokens += 2\n"
        "    a, rollout.model_seen = 3, 4\n"
        "    rollout.context.extend([])\n"
        "    del rollout.context[:1]\n"
        "    x.error = None\n"
        "    seg.finishing = True\n"
        "    self.conversation.model_seen = 7\n"
        "    held.pending = False\n"
        "    record.tokens = 5  # not a rollout\n"
        "    rollout.status = 6  # not a field\n",
        encoding="utf-8",
    )
    hits = field_writes(planted, _owned())
    assert [hit.split(" ", 1)[1] for hit in hits] == [
        "assigns Rollout.tokens",
        "assigns Rollout.counts",
        "assigns Rollout.model_seen",
        "calls .extend() on Rollout.context",
        "deletes Rollout.context",
        "assigns Reply.error",
        "assigns Segment.finishing",
        "assigns Rollout.model_seen",
        "assigns DeferredCount.pending",
    ]


# --- serve/: nothing assigns another object's attributes --------------------------

#: Where a serve module may assign an attribute of an object not its own, each
#: with why: (module path under ROOT, the target as written).
FOREIGN_WRITES_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        # A logging.Filter rewrites the LogRecord it is handed, in place: the
        # record is a value passed down the handlers, and Python 3.11's Filter
        # has no other way (3.12 lets filter() return a new record).
        ("longresponse/serve/gate.py", "record.args"),
        ("longresponse/serve/gate.py", "record.msg"),
    }
)


def foreign_writes(path: pathlib.Path) -> list[str]:
    """Where ``path`` assigns, deletes or sets (``setattr``) an attribute of an object
    other than ``self`` (``self.x = ...`` is the owner's own write; ``self.x.y =
    ...`` and ``other.y = ...`` are not)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hits: list[tuple[int, str]] = []

    def check(target: ast.expr, how: str) -> None:
        for leaf in _leaves(target):
            if isinstance(leaf, ast.Attribute) and not _is_self(leaf.value):
                hits.append((leaf.lineno, f"{how} {ast.unparse(leaf)}"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.Delete):
            for target in node.targets:
                check(target, "deletes" if isinstance(node, ast.Delete) else "assigns")
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            check(node.target, "assigns")
        elif isinstance(node, ast.For | ast.AsyncFor):
            check(node.target, "assigns")
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            check(node.optional_vars, "assigns")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
            and not _is_self(node.args[0])
        ):
            hits.append((node.lineno, f"calls {node.func.id}() on {ast.unparse(node.args[0])}"))
    return [f"{line}: {hit}" for line, hit in sorted(hits)]


def test_no_serve_module_assigns_another_objects_attributes() -> None:
    found: dict[str, list[str]] = {}
    for _, path in modules("longresponse.serve"):
        where = path.relative_to(ROOT).as_posix()
        hits = [
            hit
            for hit in foreign_writes(path)
            if (where, hit.split(" ", 2)[2]) not in FOREIGN_WRITES_ALLOWED
        ]
        if hits:
            found[where] = hits
    assert found == {}


def test_the_foreign_write_checker_sees_each_form(tmp_path: pathlib.Path) -> None:
    # A check that cannot fail is a defect: each form it looks for is found.
    planted = tmp_path / "planted.py"
    planted.write_text(
        "class C:\n"
        "    def f(self, other, items):\n"
        "        self.mine = 1  # its own: allowed\n"
        "        self.part.field = 2\n"
        "        other.hook = lambda: None\n"
        "        a, other.count = 3, 4\n"
        "        other.total += 5\n"
        "        other.kind: int = 6\n"
        "        del other.gone\n"
        "        for other.item in items: pass\n"
        "        setattr(other, 'x', 7)\n"
        "        setattr(self, 'y', 8)  # its own: allowed\n",
        encoding="utf-8",
    )
    assert [hit.split(": ", 1)[1] for hit in foreign_writes(planted)] == [
        "assigns self.part.field",
        "assigns other.hook",
        "assigns other.count",
        "assigns other.total",
        "assigns other.kind",
        "deletes other.gone",
        "assigns other.item",
        "calls setattr() on other",
    ]


# --- no import circle, type-only imports included ------------------------------


def import_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports (any import, ``TYPE_CHECKING``
    ones included), each edge to the most specific module that exists."""
    paths = {name: path for package in packages for name, path in modules(package)}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        edges: set[str] = set()
        for target in imported(name, path):
            while target and target not in paths:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_anywhere() -> None:
    graph = import_graph(("protocol", "longresponse"))
    assert circles(graph) == []


def test_the_circle_check_finds_a_planted_circle() -> None:
    graph = import_graph(("protocol", "longresponse"))
    # engine.rollout already imports engine.render; plant the way back.
    assert "longresponse.engine.render" in graph["longresponse.engine.rollout"]
    graph["longresponse.engine.render"] = {*graph["longresponse.engine.render"]}
    graph["longresponse.engine.render"].add("longresponse.engine.rollout")
    assert any(
        {"longresponse.engine.render", "longresponse.engine.rollout"} <= set(part)
        for part in circles(graph)
    )


# --- who may import what ---------------------------------------------------------

ENGINE_MAY_NOT = (
    "longresponse.backends",
    "longresponse.chat",
    "longresponse.serve",
    "longresponse.storage",
    "longresponse.client",
    "longresponse.bench",
)
#: The one engine module a backend may import: the sampler interface.
SAMPLER_INTERFACE = "longresponse.engine.sampling"


def test_the_engine_imports_no_backend_chat_serve_or_storage() -> None:
    assert offenders("longresponse.engine", ENGINE_MAY_NOT) == {}


def backend_reaches(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Backend module -> the engine modules it imports other than the interface."""
    return {
        name: bad
        for name, edges in graph.items()
        if name.startswith("longresponse.backends")
        and (
            bad := {
                e
                for e in edges
                if e.startswith("longresponse.engine") and e != SAMPLER_INTERFACE
            }
        )
    }


def test_a_backend_reaches_the_engine_through_the_sampler_interface_only() -> None:
    assert backend_reaches(import_graph(("longresponse",))) == {}


def test_the_backend_check_sees_a_planted_reach() -> None:
    graph = import_graph(("longresponse",))
    graph["longresponse.backends.chat"].add("longresponse.engine.rollout")
    assert backend_reaches(graph) == {"longresponse.backends.chat": {"longresponse.engine.rollout"}}



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


# --- no test reads a private name of the product (issue 19, point 7) ---------
#
# A test reaches the product through its public names or the wire. Private
# names are collected by ast from the product (``def _x``, ``class _X``,
# ``self._x = ...``, module-level ``_x = ...``); those the tests' own helpers
# define too (a helper's ``self._process``) are left to the tests. A read is
# ``obj._x``, ``setattr(obj, "_x", ...)`` (``monkeypatch.setattr`` too) and
# an import of a private name or from a private module.


def _sources(folder: pathlib.Path) -> list[pathlib.Path]:
    """The project's Python files under ``folder`` (not those npm installs beside
    the Node clients, under ``node_modules``)."""
    return sorted(p for p in folder.rglob("*.py") if "node_modules" not in p.parts)


def _private_names_defined_in(folder: pathlib.Path) -> set[str]:
    def private(name: str) -> bool:
        return name.startswith("_") and not name.endswith("__")

    names: set[str] = set()
    for path in _sources(folder):
        tree = parsed(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined = [node.name]
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined = [node.attr] if isinstance(node.value, ast.Name) else []
            else:
                defined = []
            names.update(name for name in defined if private(name))
        for statement in tree.body:  # module-level names
            if isinstance(statement, ast.Assign | ast.AnnAssign):
                targets = (
                    statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                )
                names.update(t.id for t in targets if isinstance(t, ast.Name) and private(t.id))
    return names


def _private_reads_in_tests(product_private: set[str], tests: pathlib.Path) -> list[str]:
    def product_module(module: str) -> bool:
        return module.split(".")[0] in ("longresponse", "protocol")

    def private_part(module: str) -> bool:
        return any(part.startswith("_") and not part.endswith("__") for part in module.split("."))

    found: list[str] = []
    for path in _sources(tests):
        where = path.relative_to(tests.parent)
        for node in ast.walk(parsed(path.read_text())):
            line = getattr(node, "lineno", 0)
            if isinstance(node, ast.Attribute) and node.attr in product_private:
                found.append(f"{where}:{line}: reads .{node.attr}")
            elif isinstance(node, ast.Call) and len(node.args) >= 2:
                name = node.func.attr if isinstance(node.func, ast.Attribute) else None
                name = node.func.id if isinstance(node.func, ast.Name) else name
                target = node.args[1] if name in ("setattr", "getattr", "delattr") else None
                if (
                    isinstance(target, ast.Constant)
                    and isinstance(target.value, str)
                    and target.value in product_private
                ):
                    found.append(f"{where}:{line}: {name}(..., {target.value!r})")
            elif isinstance(node, ast.ImportFrom) and product_module(node.module or ""):
                module = node.module or ""
                names = [a.name for a in node.names if a.name.startswith("_")]
                if private_part(module) or names:
                    shown = ", ".join(names) or "..."
                    found.append(f"{where}:{line}: from {module} import {shown}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if product_module(alias.name) and private_part(alias.name):
                        found.append(f"{where}:{line}: import {alias.name}")
    return found


def test_no_test_reads_a_private_name_of_the_product() -> None:
    product = _private_names_defined_in(ROOT / "longresponse") | _private_names_defined_in(
        ROOT / "protocol"
    )
    product -= _private_names_defined_in(ROOT / "tests")
    assert {"_responses", "_queue", "_check_window"} <= product  # the walk sees the product
    reads = _private_reads_in_tests(product, ROOT / "tests")
    assert not reads, "tests read private names of the product:\n" + "\n".join(reads)
