"""The process, set up for a long-lived server: the collector, the allocator, threads.

Theory of operation
-------------------
A paused rollout is thousands of live objects (its items, tasks, protocol
state, the connection's), and every full collection walks all of them.
Python starts a full collection after ten middle ones once the objects that
survived since the last one are a quarter of those it walked then; at its
default young threshold (700 net allocations) that came often enough that,
with 10,000 paused rollouts, the collector took 18 of the server's 42 CPU
seconds (13.6 of them in 16 full collections), most of the time of resuming
them all at once (docs/BENCHMARKS.md, "Close to the floor").

:func:`tune_gc` raises the young threshold (``--gc-young-threshold``,
:data:`~longresponse.config.GC_YOUNG_THRESHOLD`), so there are fewer young,
middle and full collections, and freezes what exists at start-up (modules,
the app, the tokenizer's tables) into the permanent generation that no
collection walks. Cycles are still collected, only less often; a young
collection takes longer (a few milliseconds at 20,000 with many rollouts
live, against tenths of one), which a continuation's latency rarely meets.
It is called once, by ``longresponse serve``, just before the server runs:
never by an app built in-process (tests, embedding), whose process is not
the server's own.

:func:`fix_mmap_threshold` is the allocator's half. glibc serves an
allocation from its own mapping when it is at least the mmap threshold
(128 KiB at first), and gives the mapping back on free; but when such a block
is freed it raises the threshold to the block's size (up to 32 MiB), so the
next message of that size comes from the heap, whose freed top it keeps. One
10 MiB WebSocket message was enough: after the connections that sent them had
closed and every Python object was freed, RSS stayed 10 to 21 MiB above idle,
a freed block or two kept at random. Setting the threshold once
(``--mmap-threshold``, :data:`~longresponse.config.MMAP_THRESHOLD`) turns the
sliding off: a large message's buffers are mapped and unmapped, and RSS comes
back to within a MiB of idle (``tests/serve/test_memory.py``). Elsewhere than
glibc it does nothing.

:func:`set_switch_interval` is the interpreter's half: a thread holds the
interpreter for :data:`SWITCH_INTERVAL` at most before it hands it to another
waiting (Python's default is 5 ms). Admission's costly checks run in worker
threads (``longresponse.serve.turns``); a request that waits on the event
loop meanwhile needs several hand-overs, and 512 new tools held another
client's ``/healthz`` 30-44 ms at 5 ms, 7-13 ms at 0.5 ms.

All three change the whole process, so they are called once, by
``longresponse serve``, never by a constructor (an app built in-process
leaves its host's process as it found it; the tests that time the loop set
the interval by a fixture).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from typing import Final

__all__ = ["SWITCH_INTERVAL", "fix_mmap_threshold", "set_switch_interval", "tune_gc"]

#: Seconds a thread runs before the interpreter hands it to another waiting.
SWITCH_INTERVAL: Final = 0.0005

#: glibc's ``mallopt`` parameter number for the mmap threshold (``malloc.h``).
_M_MMAP_THRESHOLD = -3


def tune_gc(young_threshold: int) -> None:
    """Freeze the objects made so far; collect the young generation every
    ``young_threshold`` net allocations (0 keeps the current threshold)."""
    gc.freeze()
    if young_threshold > 0:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, old)


def set_switch_interval(interval: float = SWITCH_INTERVAL) -> float:
    """Hand the interpreter to a waiting thread every ``interval`` seconds (for
    the whole process); the interval it had before."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    return before


def fix_mmap_threshold(size: int) -> bool:
    """With glibc, serve allocations of ``size`` bytes or more from their own
    mappings, a fixed threshold (0 leaves glibc's sliding one). True if set."""
    if size <= 0 or not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:  # pragma: no cover - every Linux has a C library
        return False
    libc = ctypes.CDLL(name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:  # pragma: no cover - musl has no mallopt
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, size))
