"""Streamed answers whose every write has a deadline: a reader that stops is cut off.

Theory of operation
-------------------
A streamed HTTP answer (Server-Sent Events) writes through the server's
``send``, which waits while the transport's buffer is above its high-water
mark. A client that never reads holds that ``await`` for ever, and with it
whatever the stream's iterator holds: a background response's event log, an
inspector feed's place among the watchers. The streams that have a bounded
sink of their own (``serve.http.sinks.SSESink``, the WebSocket outbox) cut
such a reader off when their queue stays full; the streams that read a shared
record instead (a background response's followers, the inspector's feeds:
each follower's queue is its place in a log bounded in bytes) have only the
write to time.

:class:`DeadlineStream` gives every write ``timeout`` seconds
(``--slow-reader-timeout``). Past it the connection is dropped outright
(``serve.seam.abort``: a graceful close would wait on the same reader), the
iterator is closed at once (its ``finally`` lets go of what it held), and the
answer ends quietly: a slow reader is one log line, not an application error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable
from typing import Final

from starlette.responses import StreamingResponse

from .seam import abort, until_gone
from .types import Message, Receive, Scope, Send

__all__ = ["SSE_MEDIA_TYPE", "DeadlineStream"]

SSE_MEDIA_TYPE: Final = "text/event-stream"


class _Abandoned(Exception):
    """A write outlived its deadline; the connection is dropped."""


class DeadlineStream(StreamingResponse):
    """A streamed answer whose every write must finish within ``timeout`` seconds."""

    def __init__(
        self,
        content: AsyncIterable[bytes],
        *,
        timeout: float,
        why: str,
        media_type: str = SSE_MEDIA_TYPE,
        headers: dict[str, str] | None = None,
        on_close: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self.timeout = timeout
        self.why = why
        #: Called once the answer is over, however it ends (even before the
        #: iterator started, when its own ``finally`` never runs).
        self.on_close = on_close
        #: The reader was cut off (a write outlived its deadline).
        self.abandoned = False

    def stop_when_gone(self, scope: Scope) -> None:
        """Stop writing once the client of ``scope`` is gone (``serve.seam.until_gone``):
        the server drops those writes, but asyncio logs each one."""
        self.body_iterator = until_gone(scope, self.body_iterator)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_by_deadline(message: Message) -> None:
            try:
                async with asyncio.timeout(self.timeout):
                    await send(message)
            except TimeoutError:
                self.abandoned = True
                abort(scope, f"{self.why}: a write waited {self.timeout:g} s")
                raise _Abandoned from None

        try:
            await super().__call__(scope, receive, send_by_deadline)
        except* _Abandoned:
            pass  # cut off: dropped and logged above
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()  # the iterator lets go of what it holds now, not at GC
            if self.on_close is not None:
                self.on_close()
