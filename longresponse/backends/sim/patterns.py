"""An example string for a JSON Schema ``pattern``: the simulated model's side.

Theory of operation
-------------------
When a free string of a structured answer must match a ``pattern`` its text
does not meet, the simulated model writes a short example instead
(``longresponse.engine.structured``). :func:`pattern_example` builds it from
the pattern's parse tree (the stdlib's own parser): the first branch of an
alternation, the least repetitions, the first character of each class, a
character outside a negated class. A construct it cannot build from
(lookarounds, back references...) gives None, as does an example longer
than :data:`MAX_EXAMPLE` or one the pattern turns out not to match.

A client's pattern is only ever *matched* by RE2
(``longresponse.json_schema.pattern_matches``), in time linear in the text;
the stdlib's parser only reads its parse tree, which costs what the pattern's
length does.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from typing import Any, Final

from ...json_schema import pattern_matches

__all__ = ["MAX_EXAMPLE", "pattern_example", "pattern_matches"]

#: The stdlib's own parser of regular expressions (private, but shipped with
#: every Python this project supports): it turns a ``pattern`` into the parts
#: an example string is built from.
_re_parser: Any = importlib.import_module("re._parser")
#: The longest example string built for a ``pattern``.
MAX_EXAMPLE: Final = 4096


class _Unbuildable(Exception):
    pass


def pattern_example(pattern: str) -> str | None:
    """A short string ``pattern`` matches (None when no example can be built)."""
    try:
        example = _emit(_re_parser.parse(pattern))
    except (re.error, _Unbuildable, RecursionError, TypeError, ValueError):
        return None
    return example if pattern_matches(pattern, example) else None


def _emit(parts: Sequence[Any]) -> str:
    out: list[str] = []
    for op, arg in parts:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "NOT_LITERAL":
            out.append("b" if arg == ord("a") else "a")
        elif name == "ANY":
            out.append("a")
        elif name == "IN":
            out.append(_from_class(arg))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, _, sub = arg
            piece = _emit(sub)
            if len(piece) * low > MAX_EXAMPLE:  # before the string is built
                raise _Unbuildable("too long")
            out.append(piece * low)
        elif name == "SUBPATTERN":
            out.append(_emit(arg[-1]))
        elif name == "ATOMIC_GROUP":
            out.append(_emit(arg))
        elif name == "BRANCH":
            out.append(_emit(arg[1][0]))
        elif name != "AT":  # anchors match where they stand; anything else is too hard
            raise _Unbuildable(name)
        if sum(map(len, out)) > MAX_EXAMPLE:
            raise _Unbuildable("too long")
    return "".join(out)


_CATEGORY_EXAMPLES: Final = {
    "CATEGORY_DIGIT": "0",
    "CATEGORY_NOT_DIGIT": "a",
    "CATEGORY_WORD": "a",
    "CATEGORY_NOT_WORD": " ",
    "CATEGORY_SPACE": " ",
    "CATEGORY_NOT_SPACE": "a",
}


def _from_class(items: Sequence[Any]) -> str:
    """One character of a ``[...]`` class (or of a negated one)."""
    if items and str(items[0][0]) == "NEGATE":
        for candidate in "a0A _-.~!":
            if not _in_class(candidate, items[1:]):
                return candidate
        raise _Unbuildable("negated class")
    op, arg = items[0]
    name = str(op)
    if name == "LITERAL":
        return chr(arg)
    if name == "RANGE":
        return chr(arg[0])
    if name == "CATEGORY" and str(arg) in _CATEGORY_EXAMPLES:
        return _CATEGORY_EXAMPLES[str(arg)]
    raise _Unbuildable(name)


def _in_class(char: str, items: Sequence[Any]) -> bool:
    for op, arg in items:
        name = str(op)
        if name == "LITERAL" and ord(char) == arg:
            return True
        if name == "RANGE" and arg[0] <= ord(char) <= arg[1]:
            return True
        if name == "CATEGORY" and str(arg) in _CATEGORY_PATTERNS:
            if re.fullmatch(_CATEGORY_PATTERNS[str(arg)], char):
                return True
    return False


_CATEGORY_PATTERNS: Final = {
    "CATEGORY_DIGIT": r"\d",
    "CATEGORY_NOT_DIGIT": r"\D",
    "CATEGORY_WORD": r"\w",
    "CATEGORY_NOT_WORD": r"\W",
    "CATEGORY_SPACE": r"\s",
    "CATEGORY_NOT_SPACE": r"\S",
}
