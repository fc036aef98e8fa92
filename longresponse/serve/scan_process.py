"""The secrets classifier over very long texts, in a child process.

A worker thread keeps the event loop free only while it runs Python code: the
interpreter hands itself over between bytecodes, never inside a call into C.
The classifier's regular expressions are such calls, each scanning as far as
it must: on 15 MB of ``sk-sk-…`` one search ran 2.3 s in one piece, and with
the whole scan in a worker thread another client's ``GET /healthz`` still
waited up to 98 ms at a time (issue 20). :class:`ScanProcess` reads texts of
:data:`FAR_CHARS` characters or more in a child process instead, where
nothing it holds is the server's; shorter texts, whose longest search is a
few milliseconds, are read in the calling thread. The findings are the same
either way: it is the same function.

The children are shared fairly between API keys (issue 28: one key's three
15 MB texts, 12 s each, held the one child and another key's 300
Ki-character text waited 15.9 s): a key reads in one child at a time, up to
:data:`SCAN_CHILDREN` children (started as needed) read at once, and keys
waiting for a child are served round-robin (``fair_share.FairSlots``; why
children and not slices of a text: that module's docstring).

The child ends with its server, however the server ends. Its parent is the
fork server, not the server, and every child of a fork server holds the
fork server's "alive" pipe and the resource tracker's, so a child left
waiting for work after a ``kill -9`` of the server kept all three processes
(about 46 MB) alive, reparented to init, a trio per crash (issue 28). The
child watches the server's process (a pidfd on Linux, read by a thread of
its own; elsewhere a check once a second) and exits when it ends; the fork
server then reads the end of its pipe and exits, and the resource tracker
after it. A parent-death signal would not do: it watches the fork server.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import select
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Final

from ..engine.classifier import Finding, scan
from .fair_share import FairSlots

__all__ = ["FAR_CHARS", "SCAN_CHILDREN", "ScanProcess"]

log = logging.getLogger(__name__)

#: Texts this long or longer are read in the child process (a search over
#: 256 Ki characters of the worst text measured holds the interpreter about
#: 2 ms; the hop to the child costs about 1 ms).
FAR_CHARS: Final = 256 * 1024

#: Children that read at once, each for another key: twice the cores, at
#: least 2 and at most 8 (each about 20 MiB; the operating system shares the
#: cores between those reading, so a short text beside long ones is read
#: at half its speed at worst on 2 cores, 4 children).
SCAN_CHILDREN: Final = max(2, min(8, 2 * (os.cpu_count() or 1)))


class ScanProcess:
    """:func:`~longresponse.engine.classifier.scan`, in a child process for long
    texts. Thread-safe; :meth:`close` stops the child."""

    def __init__(self, far_chars: int = FAR_CHARS, children: int = SCAN_CHILDREN) -> None:
        self.far_chars = far_chars
        self.children = children
        #: A child for each key that reads, round-robin when all are taken.
        self.slots = FairSlots(children, per_key=1)
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False
        #: The process id of the child that read the last long text (None before).
        self.child_pid: int | None = None

    def scan(self, text: str, key: str = "") -> list[Finding]:
        """The findings in ``text``, as :func:`scan` returns them, read for the
        API key ``key``. Blocks the calling thread (never the event loop's)
        while ``key`` waits its turn for a child and while the child reads; if
        the child cannot (it died, or the server is closing), the text is read
        here."""
        if len(text) < self.far_chars:
            return scan(text)
        pool = self._started()
        if pool is not None:
            try:
                with self.slots.holding(key):
                    self.child_pid, found = pool.submit(_scan_in_child, text).result()
                return found
            except (BrokenProcessPool, RuntimeError) as exc:  # died, or shut down
                log.warning("the classifier's child process failed (%r); reading in place", exc)
                with self._lock:
                    if self._pool is pool:
                        self._pool = None
        return scan(text)

    def close(self) -> None:
        """Stop the child (a read in it ends, its caller reads in place)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _started(self) -> ProcessPoolExecutor | None:
        with self._lock:
            if self._pool is None and not self._closed:
                # forkserver: the child does not inherit the server's threads,
                # sockets or memory, only what the classifier imports.
                context = multiprocessing.get_context("forkserver")
                # What the fork server loads first: the classifier, not the
                # server's __main__ (which a script may run unguarded).
                context.set_forkserver_preload([scan.__module__])
                self._pool = ProcessPoolExecutor(
                    self.children,
                    mp_context=context,
                    initializer=_end_with,
                    initargs=(os.getpid(),),
                )
            return self._pool


def _scan_in_child(text: str) -> tuple[int, list[Finding]]:
    """What the child runs: its process id and the findings."""
    return os.getpid(), scan(text)


def _end_with(server: int) -> None:
    """The child's start: a thread that ends the child when process ``server`` ends."""
    threading.Thread(target=_watch, args=(server,), name="end-with-server", daemon=True).start()


def _watch(server: int) -> None:
    try:
        handle = os.pidfd_open(server)  # Linux 5.3+: readable once the process ends
    except (AttributeError, OSError):  # no pidfds here, or the server is gone already
        while _alive(server):
            time.sleep(1.0)
    else:
        select.select([handle], [], [])
    os._exit(0)  # nobody waits for what the child was reading


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
