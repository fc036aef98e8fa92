"""Shared workers, shared fairly between API keys.

Theory of operation
-------------------
Admission's costly checks run off the event loop, in worker threads, and
the secrets classifier reads a very long text in a child process
(``scan_process``). Both used to be first come, first served: two threads
and one child for everyone. Three 15 MB creates of one key, each read by
the classifier for about 12 s, held both threads and the child, so another
key's create with a new tool waited 46.9 s (alone 68-84 ms) and its
300 Ki-character text 15.9 s (issue 28).

:class:`FairSlots` hands out a bounded number of slots, at most
``per_key`` to one key at a time; a key that wants more waits in its own
queue, and the keys waiting are served round-robin as slots free. Two
kinds of slot use it:

* :class:`CheckWorkers`, the threads: :data:`CHECK_THREADS` in all, at most
  :data:`CHECK_THREADS_PER_KEY` for one key. A thread waiting for the child
  holds no core, so threads are many: one key's long reads leave threads
  for every other key until :data:`CHECK_THREADS` / 2 keys are busy at once.
* the classifier's children (``ScanProcess``): one per key at a time, up to
  ``scan_process.SCAN_CHILDREN`` children, started as needed. The operating
  system shares the cores between the children that read, so another key's
  short text is read beside a long one (on the 2-core machine, at its own
  speed while one long text is read), not after it.

Why children and not slices of one text: a scan cut into slices finds the
same only when no match, check or entropy run depends on text past the
slice's edge, and the classifier's rules are not all bounded (a private
key runs to its ``-----END``, an entropy run is judged by its start, the
redaction loop reads again what a finding changed). Separate processes
keep every verdict what it was by construction: it is the same function on
the same text. The limit: past ``SCAN_CHILDREN`` keys reading long texts
at once, the next key waits (round-robin) for a child to free.

* :class:`AdmittingTurns`, on the event loop: a create's work before its
  model runs (reading and checking its body, admitting it, starting its
  rollout), at most :data:`ADMITTING_PER_KEY` creates of one key at once. A
  burst of 300 HTTP creates from one key used to be 300 tasks ready at once
  on the loop, each taking its slice of every round, so another key's
  request waited for all of them (``GET /healthz`` 68-84 ms instead of 3-6,
  ``scripts/issue28_burst.py``); the creates past the bound now wait, not
  ready, in their key's queue.

Work given without a key (``""``: keys off) shares one queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, TypeVar

__all__ = [
    "ADMITTING",
    "ADMITTING_PER_KEY",
    "CHECK_THREADS",
    "CHECK_THREADS_PER_KEY",
    "AdmittingTurns",
    "CheckWorkers",
    "FairSlots",
]

_T = TypeVar("_T")

#: Worker threads for admission's costly checks, in all.
CHECK_THREADS: Final = 16
#: Of them, the most one API key holds at once (its other checks wait their turn).
CHECK_THREADS_PER_KEY: Final = 2
#: Creates admitted at once on the event loop (read, checked, started), in all...
ADMITTING: Final = 256
#: ... and of one API key (its other creates wait their turn, not ready).
ADMITTING_PER_KEY: Final = 4


class FairSlots:
    """At most ``slots`` holders at once, at most ``per_key`` of one key; keys
    that wait are served round-robin (each key's own waiters first come,
    first served). Thread-safe."""

    def __init__(self, slots: int, per_key: int) -> None:
        if slots < 1 or per_key < 1:
            raise ValueError("slots and per_key must be at least 1")
        self.slots = slots
        self.per_key = per_key
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        #: The keys with waiters, in the order they are served (round-robin).
        self._waiting: dict[str, deque[Callable[[], None]]] = {}
        self._in_use = 0

    @property
    def in_use(self) -> int:
        """The slots held now."""
        return self._in_use

    def held_by(self, key: str) -> int:
        """The slots ``key`` holds now."""
        return self._held.get(key, 0)

    def request(self, key: str, granted: Callable[[], None]) -> None:
        """Call ``granted()`` once ``key`` holds a slot: now, in this thread, if
        one is free to it, else in the thread that frees one. The holder gives
        it back with :meth:`release`. ``granted`` must not raise."""
        with self._lock:
            self._waiting.setdefault(key, deque()).append(granted)
            ready = self._grant()
        for call in ready:
            call()

    def release(self, key: str) -> None:
        """Give back a slot of ``key``'s; the next waiter (round-robin) takes it."""
        with self._lock:
            held = self._held[key] - 1
            if held:
                self._held[key] = held
            else:
                del self._held[key]
            self._in_use -= 1
            ready = self._grant()
        for call in ready:
            call()

    @contextlib.contextmanager
    def holding(self, key: str) -> Iterator[None]:
        """Block the calling thread until ``key`` holds a slot; give it back after."""
        event = threading.Event()
        self.request(key, event.set)
        event.wait()
        try:
            yield
        finally:
            self.release(key)

    def _grant(self) -> list[Callable[[], None]]:
        """Hand free slots to waiting keys, round-robin (the lock held)."""
        ready: list[Callable[[], None]] = []
        while self._in_use < self.slots:
            key = next((k for k in self._waiting if self._held.get(k, 0) < self.per_key), None)
            if key is None:
                break
            queue = self._waiting.pop(key)
            ready.append(queue.popleft())
            if queue:  # to the back of the round
                self._waiting[key] = queue
            self._held[key] = self._held.get(key, 0) + 1
            self._in_use += 1
        return ready


class CheckWorkers:
    """The threads that run admission's costly checks, shared fairly between
    keys (:class:`FairSlots`). Thread-safe; :meth:`close` stops them."""

    def __init__(self, threads: int = CHECK_THREADS, per_key: int = CHECK_THREADS_PER_KEY) -> None:
        self.slots = FairSlots(threads, per_key)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="longresponse-check")
        #: The checks not started yet (cancelled by :meth:`close`).
        self._waiting: set[Future[Any]] = set()
        self._lock = threading.Lock()

    async def run(self, key: str, work: Callable[..., _T], *args: object) -> _T:
        """``work(*args)`` in a worker thread once ``key`` has its turn. Raises what
        ``work`` raises; cancelled while it waits for its turn, it never runs."""
        return await asyncio.wrap_future(self.submit(key, work, *args))

    def submit(self, key: str, work: Callable[..., _T], *args: object) -> Future[_T]:
        """``work(*args)`` in a worker thread once ``key`` has its turn; its future."""
        future: Future[_T] = Future()
        with self._lock:
            self._waiting.add(future)

        def granted() -> None:
            try:
                self._pool.submit(self._run, key, future, work, args)
            except RuntimeError as exc:  # closed meanwhile
                self.slots.release(key)
                if future.set_running_or_notify_cancel():
                    future.set_exception(exc)

        self.slots.request(key, granted)
        return future

    def _run(
        self, key: str, future: Future[_T], work: Callable[..., _T], args: tuple[object, ...]
    ) -> None:
        try:
            with self._lock:
                self._waiting.discard(future)
            if not future.set_running_or_notify_cancel():
                return  # cancelled while it waited
            try:
                result = work(*args)
            except BaseException as exc:
                future.set_exception(exc)
                del exc  # no cycle through the traceback
            else:
                future.set_result(result)
        finally:
            self.slots.release(key)

    def close(self) -> None:
        """Stop the threads (a check still waiting for one is dropped: cancelled)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            waiting, self._waiting = self._waiting, set()
        for future in waiting:
            future.cancel()


class AdmittingTurns:
    """Turns on the event loop for the work before a create's model runs, shared
    fairly between keys (:class:`FairSlots`): at most ``per_key`` creates of
    one key at once; the others wait in its queue, round-robin with other keys'."""

    def __init__(self, slots: int = ADMITTING, per_key: int = ADMITTING_PER_KEY) -> None:
        self.slots = FairSlots(slots, per_key)

    @contextlib.asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        """Wait for ``key``'s turn, hold it for the block. A waiter cancelled (its
        client left) gives its place up; a turn granted as it left is passed on."""
        granted = asyncio.get_running_loop().create_future()

        def grant() -> None:
            if granted.cancelled():
                self.slots.release(key)  # it left while it waited: the next one's
            else:
                granted.set_result(None)

        self.slots.request(key, grant)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.slots.release(key)  # granted just as it was cancelled
            raise
        try:
            yield
        finally:
            self.slots.release(key)
