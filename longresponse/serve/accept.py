"""Accepting connections at the open-file limit: back off, log once a second.

Theory of operation
-------------------
asyncio's selector loop accepts in ``BaseSelectorEventLoop._accept_connection``
(``asyncio/selector_events.py``): each time the listening socket is readable
it calls ``accept()`` up to ``backlog`` times (uvicorn's 2048). When one fails
with EMFILE (the process's file descriptors are all in use), ENFILE, ENOBUFS
or ENOMEM, it logs ``socket.accept() out of system resource`` with the
exception's traceback, takes the socket out of the selector and schedules it
back in a second (``ACCEPT_RETRY_DELAY``), and then goes on round its loop:
the same ``accept()`` fails again, up to the backlog's count, each failure a
log record with its traceback and a timer of its own. Measured at the limit:
100% CPU, 55 MB of log a second, and the connections already open starved.

:class:`AcceptLoop` is that loop with this one step done as a server must:
on the first such failure it stops accepting for :data:`ACCEPT_BACKOFF`
seconds (once: the listening socket comes out of the selector and one timer
puts it back), returns to the connections it already serves, and logs one
warning line at most every :data:`LOG_INTERVAL` seconds, with how many
failures it held back. Connections waiting meanwhile stay in the kernel's
backlog and are accepted once descriptors are free again. Everything else is
asyncio's own. ``longresponse serve`` runs uvicorn on it (uvicorn's ``loop`` setting names
the class).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import Callable
from typing import Any, Final

__all__ = ["ACCEPT_BACKOFF", "LOG_INTERVAL", "OUT_OF_RESOURCES", "AcceptLoop"]

log = logging.getLogger(__name__)

#: Seconds the server stops accepting after ``accept()`` found no descriptor
#: (asyncio's own ``ACCEPT_RETRY_DELAY``).
ACCEPT_BACKOFF: Final = 1.0
#: The fewest seconds between two log lines of failed accepts.
LOG_INTERVAL: Final = 1.0
#: The ``accept()`` errors that mean "no resources now, try later".
OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class AcceptLoop(asyncio.SelectorEventLoop):
    """A selector event loop that backs off accepting at the open-file limit."""

    def __init__(self) -> None:
        super().__init__()
        #: When the last failed-accept line was written, and failures since.
        self._logged_at = -LOG_INTERVAL
        self._held_back = 0

    def _accept_connection(
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        sock: socket.socket,
        sslcontext: Any = None,
        server: Any = None,
        backlog: int = 100,
        *args: Any,
    ) -> None:
        """asyncio's accept step, ending at the first out-of-resources failure."""
        for _ in range(backlog):
            try:
                conn, addr = sock.accept()
                conn.setblocking(False)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # nothing more waiting
            except OSError as exc:
                if exc.errno not in OUT_OF_RESOURCES:
                    raise  # the loop logs it, as asyncio's does
                self._back_off(exc, protocol_factory, sock, sslcontext, server, backlog, *args)
                return
            accept = self._accept_connection2(  # type: ignore[attr-defined]
                protocol_factory, conn, {"peername": addr}, sslcontext, server, *args
            )
            self.create_task(accept)

    def _back_off(
        self,
        exc: OSError,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        sock: socket.socket,
        *more: Any,
    ) -> None:
        """Stop accepting on ``sock`` for :data:`ACCEPT_BACKOFF` seconds, and log
        it if no line was written in the last :data:`LOG_INTERVAL` seconds."""
        now = time.monotonic()
        if now - self._logged_at < LOG_INTERVAL:
            self._held_back += 1
        else:
            held_back = f" ({self._held_back} more not logged)" if self._held_back else ""
            log.warning(
                "cannot accept connections: %s%s; accepting again in %g s, "
                "open connections are served",
                exc.strerror or exc,
                held_back,
                ACCEPT_BACKOFF,
            )
            self._logged_at, self._held_back = now, 0
        self._remove_reader(sock.fileno())  # type: ignore[attr-defined]
        self.call_later(ACCEPT_BACKOFF, self._resume, protocol_factory, sock, *more)

    def _resume(
        self, protocol_factory: Callable[[], asyncio.BaseProtocol], sock: socket.socket, *more: Any
    ) -> None:
        """Accept on ``sock`` again, unless its server has closed it meanwhile."""
        if sock.fileno() != -1:
            self._start_serving(protocol_factory, sock, *more)  # type: ignore[attr-defined]

