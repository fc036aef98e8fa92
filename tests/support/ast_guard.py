"""One thread at a time in :func:`ast.parse`, for the test process.

CPython keeps one AST-construction state per interpreter, and its recursion
depth is assigned at the start of each conversion and checked at the end
(``Python/Python-ast.c``; CPython issue 106905 is one of its bugs). When a
garbage collection inside one thread's conversion runs a finalizer, the
interpreter may switch threads there; a second thread converting meanwhile
resets the shared depth, and the first fails with ``SystemError: AST
constructor recursion depth mismatch``.

The suite runs servers in threads, and CPython 3.11's :mod:`traceback`
parses the failing line with :func:`ast.parse` to place its carets, so a
server thread logging an exception while hypothesis parses a test's source
in the main thread (it does, to derive a seed and to describe lambdas) failed
``test_protocol_fuzz`` once. :func:`install` serializes every
:func:`ast.parse` of this process behind one lock; ``tests/test_ast_guard.py``
shows the failure without it and none with it.
"""

from __future__ import annotations

import ast
import functools
import threading
from typing import Any

__all__ = ["install", "installed"]

_LOCK = threading.RLock()
_UNGUARDED = ast.parse


@functools.wraps(_UNGUARDED)
def _guarded_parse(*args: Any, **kwargs: Any) -> Any:
    with _LOCK:
        return _UNGUARDED(*args, **kwargs)


def install() -> None:
    """Replace :func:`ast.parse` with the serialized one (idempotent)."""
    ast.parse = _guarded_parse


def installed() -> bool:
    return ast.parse is _guarded_parse
