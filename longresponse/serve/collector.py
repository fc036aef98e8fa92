"""The garbage collector, set up for a server that holds many live rollouts.

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
"""

from __future__ import annotations

import gc

__all__ = ["tune_gc"]


def tune_gc(young_threshold: int) -> None:
    """Freeze the objects made so far; collect the young generation every
    ``young_threshold`` net allocations (0 keeps the current threshold)."""
    gc.freeze()
    if young_threshold > 0:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, old)
