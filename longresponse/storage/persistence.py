"""Persistence: stored responses durable before they are acknowledged; the ledger behind.

Durable before acknowledged: a finished ``store=true`` response is written to
the store, and the write has landed (SQLite: a committed WAL transaction;
Redis: the ``SET`` answered), before its terminal event is handed to the
transport. A client that saw ``completed`` can name the response after any
crash of this process. A write that fails raises :class:`StoreWriteFailed`,
and the response ends ``failed`` instead of ``completed``.

Usage records (the billing ledger) stay off the critical path: they go
through a bounded background queue (the post-inference work of DESIGN §3
step 4) and are written after the terminal event. The loss window on a crash
is what that queue holds: at most :data:`POST_INFERENCE_QUEUE_DEPTH` records,
in practice those of the last few milliseconds of finished responses. A clean
shutdown drains it (:meth:`Persistence.drain`) and loses nothing.

The ordering guarantee: a response is readable, in the process that served
it, by the time its id could be used. Every id being written has a pending
entry until its write lands, and every read in this process (GET, chaining
with ``previous_response_id``, WebSocket hydration) waits for a pending write
of the id it asks for. Another process sharing the store (Redis) sees the
record once the write lands, before the terminal event; there a read that
misses keeps looking for up to :data:`CROSS_PROCESS_GRACE` seconds (so a truly
unknown id costs that long to report as not found).

A background response is written before it runs, held by this process's
lease (:meth:`Persistence.persist_running`); the server renews the leases it
holds and takes over those that ran out (``longresponse.serve.http.background``).

Rebuilding a conversation from the store walks ``previous_response_id`` back
to its start: the whole history is read and rendered again on every request.
That is the stateless baseline the HTTP path measures.

Checkpoints of append-mode rollouts (``checkpoint_open`` and the rest, named
as on :class:`~longresponse.storage.records.ResponseStore`) go straight to the
store, awaited by the caller: each is durable when it returns. Persistence
only counts them (calls, bytes sent, seconds) for ``/metrics`` and the bench.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Collection, Sequence
from typing import Final

import msgspec

from protocol.items import (
    ApplyPatchCall,
    ApplyPatchCallOutput,
    CallOutput,
    ClientCall,
    Compaction,
    CompactionTrigger,
    ComputerCall,
    ComputerCallOutput,
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Item,
    LocalShellCall,
    LocalShellCallOutput,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpListTools,
    Message,
    Reasoning,
    ShellCall,
    ShellCallOutput,
    answered_call_id,
    approval_name,
    call_name,
)
from protocol.response import Response

from ..ids import new_id
from .records import CheckpointState, ResponseStore, StoredResponse, UsageRecord

__all__ = [
    "CROSS_PROCESS_GRACE",
    "CROSS_PROCESS_POLL",
    "MAX_CHAIN_DEPTH",
    "POST_INFERENCE_QUEUE_DEPTH",
    "Conversation",
    "Persistence",
    "StoreWriteFailed",
    "stored_input_items",
]

log = logging.getLogger(__name__)

#: Writes waiting for the background worker; beyond it, queuing waits.
POST_INFERENCE_QUEUE_DEPTH: Final = 1024
#: How long a read that missed on a shared store keeps looking (another
#: process's write may still be landing), and how often it looks.
CROSS_PROCESS_GRACE: Final = 0.5
CROSS_PROCESS_POLL: Final = 0.01
#: Longest ``previous_response_id`` chain rebuilt from the store.
MAX_CHAIN_DEPTH: Final = 10_000

_ID_PREFIX: Final = {
    Message: "msg",
    FunctionCall: "fc",
    FunctionCallOutput: "fco",
    CustomToolCall: "ctc",
    CustomToolCallOutput: "ctco",
    LocalShellCall: "lsh",
    LocalShellCallOutput: "lsho",
    ShellCall: "sh",
    ShellCallOutput: "sho",
    ApplyPatchCall: "apc",
    ApplyPatchCallOutput: "apco",
    ComputerCall: "cu",
    ComputerCallOutput: "cuo",
    Reasoning: "rs",
    McpListTools: "mcpl",
    McpCall: "mcp",
    McpApprovalRequest: "mcpr",
    McpApprovalResponse: "mcpa",
    Compaction: "cmp",
    CompactionTrigger: "ctr",
}


def stored_input_items(items: Sequence[Item]) -> list[Item]:
    """Input items as stored and listed: each with an id, messages as part lists."""
    out: list[Item] = []
    for item in items:
        changes: dict[str, object] = {}
        if not isinstance(getattr(item, "id", None), str):
            changes["id"] = new_id(_ID_PREFIX[type(item)])
        if isinstance(item, Message) and isinstance(item.content, str):
            changes["content"] = [InputText(text=item.content)]
        if isinstance(item, Message | FunctionCallOutput) and not isinstance(item.status, str):
            changes["status"] = "completed"
        out.append(msgspec.structs.replace(item, **changes) if changes else item)
    return out


class StoreWriteFailed(Exception):
    """A ``store=true`` response could not be made durable; it must not be acknowledged."""

    def __init__(self, response_id: str, cause: Exception) -> None:
        super().__init__(f"The response could not be stored: {cause}")
        self.response_id = response_id


class Conversation(msgspec.Struct, frozen=True, kw_only=True):
    """A chain rebuilt from the store: everything before the next request."""

    #: Inputs and outputs of every response in the chain, oldest first.
    items: list[Item]
    #: The last response of the chain (the one named by previous_response_id).
    last: StoredResponse
    #: Client tool calls of the last response that have no output yet.
    pending: dict[str, str]
    #: The id of the chain's first response (the conversation's affinity key's source).
    root_id: str = ""


class Persistence:
    """A store behind a bounded write-behind queue (see the module docstring)."""

    def __init__(
        self,
        store: ResponseStore,
        *,
        depth: int = POST_INFERENCE_QUEUE_DEPTH,
        overlapped: bool = True,
    ) -> None:
        self.store = store
        #: Off: post-inference writes complete before the caller goes on (the
        #: terminal event waits for them), as without an overlapping queue.
        self.overlapped = overlapped
        self._queue: asyncio.Queue[tuple[UsageRecord, asyncio.Future[None] | None] | None] = (
            asyncio.Queue(depth)
        )
        self._pending: dict[str, asyncio.Future[None]] = {}
        self._worker: asyncio.Task[None] | None = None
        self._stragglers: set[asyncio.Task[None]] = set()
        self.written = 0
        self.failed_writes = 0
        self.usage_written = 0
        self.write_seconds = 0.0
        #: Checkpoint opens and writes that landed, the bytes they sent (states
        #: and items) and the seconds they took, landed or not.
        self.checkpoints_written = 0
        self.checkpoint_bytes = 0
        self.checkpoint_seconds = 0.0

    # --- lifecycle (owned by the app's lifespan) ------------------------------

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run())

    async def drain(self) -> None:
        """Write everything queued, then stop the worker (a clean shutdown loses nothing)."""
        if self._worker is None:
            return
        await self._queue.put(None)
        await self._worker
        self._worker = None

    async def _run(self) -> None:
        while True:
            entry = await self._queue.get()
            if entry is None:
                return
            record, done = entry
            started = time.perf_counter()
            try:
                await self.store.put_usage(record)
                self.usage_written += 1
            except Exception:
                log.exception("usage record of %s failed", record.response_id)
            finally:
                self.write_seconds += time.perf_counter() - started
                if done is not None and not done.done():
                    done.set_result(None)

    async def _enqueue(self, record: UsageRecord) -> None:
        # A future only when the caller waits (post-inference not overlapped).
        done = None if self.overlapped else asyncio.get_running_loop().create_future()
        self.start()
        await self._queue.put((record, done))
        if done is not None:
            await asyncio.shield(done)

    def usage_nowait(self, response: Response, *, owner: str, transport: str) -> None:
        """Queue a usage record without waiting (from cleanup code that must not block).

        With the queue full the record is written by a task of its own instead.
        """
        record = _usage_record(response, owner=owner, transport=transport)
        try:
            self._queue.put_nowait((record, None))
            self.start()
        except asyncio.QueueFull:
            task = asyncio.get_running_loop().create_task(self.store.put_usage(record))
            self._stragglers.add(task)
            task.add_done_callback(self._stragglers.discard)

    async def bill_so_far(self, response: Response, *, owner: str, transport: str) -> None:
        """The ledger's record of a response still running (an append-mode
        checkpoint): replaced by a later one for the same response."""
        await self._enqueue(_usage_record(response, owner=owner, transport=transport))

    async def post_inference(
        self,
        response: Response,
        *,
        owner: str,
        transport: str,
        store_input: Sequence[Item] | None = None,
        previous_response_id: str | None = None,
        store_context: Sequence[Item] | None = None,
    ) -> None:
        """The post-inference work of one finished response.

        With ``store_input``, the stored response first: written and durable
        when this returns (raises :class:`StoreWriteFailed` otherwise, and
        nothing is billed: the caller ends the response failed and bills
        that). Then a usage-ledger record, queued (or, not overlapped, written).
        """
        if store_input is not None:
            await self.persist(
                response,
                owner=owner,
                input_items=store_input,
                previous_response_id=previous_response_id,
                context=store_context,
            )
        await self._enqueue(_usage_record(response, owner=owner, transport=transport))

    # --- writes ----------------------------------------------------------------

    async def persist(
        self,
        response: Response,
        *,
        owner: str,
        input_items: Sequence[Item],
        previous_response_id: str | None,
        context: Sequence[Item] | None = None,
    ) -> None:
        """Write ``response`` to the store; it is durable when this returns.

        Raises :class:`StoreWriteFailed` if the store refused or failed the
        write (readers waiting on it then find nothing).
        """
        record = _stored(response, owner, input_items, previous_response_id, context)
        await self._write(record, self.store.put(record))

    async def persist_running(
        self,
        response: Response,
        *,
        owner: str,
        input_items: Sequence[Item],
        previous_response_id: str | None,
        holder: str,
        lease: float,
    ) -> None:
        """Write ``response``, a background response that has not ended, held by
        ``holder``'s lease for ``lease`` seconds; durable when this returns.

        Raises :class:`StoreWriteFailed` as :meth:`persist` does.
        """
        record = _stored(response, owner, input_items, previous_response_id, None)
        await self._write(record, self.store.put_running(record, holder=holder, lease=lease))

    async def _write(self, record: StoredResponse, put: Awaitable[None]) -> None:
        done = asyncio.get_running_loop().create_future()
        self._pending[record.id] = done
        started = time.perf_counter()
        try:
            await put
            self.written += 1
        except Exception as exc:
            self.failed_writes += 1
            log.warning("storing response %s failed: %s", record.id, exc)
            raise StoreWriteFailed(record.id, exc) from exc
        finally:
            self.write_seconds += time.perf_counter() - started
            self._pending.pop(record.id, None)
            if not done.done():
                done.set_result(None)

    # --- checkpoints (the store's, counted; the module docstring) ----------------

    async def checkpoint_open(
        self, response_id: str, *, owner: str, state: bytes, items: Sequence[bytes], ttl: float
    ) -> int:
        """:meth:`ResponseStore.checkpoint_open` (durable when it returns; raises
        :class:`StoreError` as the store does)."""
        started = time.perf_counter()
        try:
            epoch = await self.store.checkpoint_open(
                response_id, owner=owner, state=state, items=items, ttl=ttl
            )
        finally:
            self.checkpoint_seconds += time.perf_counter() - started
        self._count_checkpoint(state, items)
        return epoch

    async def checkpoint_write(
        self,
        response_id: str,
        *,
        owner: str,
        epoch: int,
        state: bytes,
        keep: int,
        items: Sequence[bytes],
        ttl: float,
    ) -> bool:
        """:meth:`ResponseStore.checkpoint_write` (durable when it returns ``True``)."""
        started = time.perf_counter()
        try:
            written = await self.store.checkpoint_write(
                response_id, owner=owner, epoch=epoch, state=state, keep=keep, items=items, ttl=ttl
            )
        finally:
            self.checkpoint_seconds += time.perf_counter() - started
        if written:
            self._count_checkpoint(state, items)
        return written

    async def checkpoint_take(
        self, response_id: str, *, owner: str, ttl: float
    ) -> CheckpointState | None:
        """:meth:`ResponseStore.checkpoint_take`."""
        return await self.store.checkpoint_take(response_id, owner=owner, ttl=ttl)

    async def checkpoint_read(self, response_id: str, *, owner: str) -> CheckpointState | None:
        """:meth:`ResponseStore.checkpoint_read`."""
        return await self.store.checkpoint_read(response_id, owner=owner)

    async def checkpoint_delete(
        self, response_id: str, *, owner: str, epoch: int | None = None
    ) -> bool:
        """:meth:`ResponseStore.checkpoint_delete`."""
        return await self.store.checkpoint_delete(response_id, owner=owner, epoch=epoch)

    def _count_checkpoint(self, state: bytes, items: Sequence[bytes]) -> None:
        self.checkpoints_written += 1
        self.checkpoint_bytes += len(state) + sum(len(item) for item in items)
    async def renew_leases(
        self, response_ids: Collection[str], *, holder: str, lease: float
    ) -> set[str]:
        """The store's :meth:`~ResponseStore.renew_leases` (raises :class:`StoreError`)."""
        return await self.store.renew_leases(response_ids, holder=holder, lease=lease)

    async def take_expired(
        self, *, holder: str, lease: float, response_id: str | None = None
    ) -> list[StoredResponse]:
        """The store's :meth:`~ResponseStore.take_expired` (raises :class:`StoreError`)."""
        return await self.store.take_expired(holder=holder, lease=lease, response_id=response_id)

    async def end_taken(
        self, taken: StoredResponse, response: Response, *, holder: str, transport: str
    ) -> bool:
        """Store ``response``, the end of ``taken`` (a record :meth:`take_expired`
        gave ``holder``), and queue its usage record, only while ``holder`` still
        holds its lease; ``False`` (nothing written or billed) otherwise.

        Raises :class:`StoreError` if the store fails (the lease then runs out
        again, and the next taker ends it).
        """
        record = msgspec.structs.replace(taken, response=response)
        if not await self.store.put_held(record, holder=holder):
            return False
        self.written += 1
        await self._enqueue(_usage_record(response, owner=taken.owner, transport=transport))
        return True

    # --- reads -----------------------------------------------------------------

    async def get(self, response_id: str, *, owner: str) -> StoredResponse | None:
        """The stored response (after any pending write of it), or ``None``.

        On a store shared with other processes, a miss is looked up again for
        up to :data:`CROSS_PROCESS_GRACE` seconds: the process that made the
        response may have sent it a moment before its write landed.
        """
        pending = self._pending.get(response_id)
        if pending is not None:
            await asyncio.shield(pending)
        record = await self.store.get(response_id, owner=owner)
        if record is None and getattr(self.store, "shared", False):
            deadline = time.monotonic() + CROSS_PROCESS_GRACE
            while record is None and time.monotonic() < deadline:
                await asyncio.sleep(CROSS_PROCESS_POLL)
                record = await self.store.get(response_id, owner=owner)
        return record

    async def items(self, item_ids: Collection[str], *, owner: str) -> dict[str, Item]:
        """The stored items of ``owner`` with these ids (input, output and
        context items of its stored responses, then items of its
        conversations), by id; an id missing from the result is held by none
        (or by another owner's only).

        On a store shared with other processes, ids not found are looked up
        again for up to :data:`CROSS_PROCESS_GRACE` seconds, as :meth:`get` does.
        Raises :class:`StoreError` if the store fails.
        """
        wanted = set(item_ids)
        found = await self._items(wanted, owner)
        if len(found) < len(wanted) and getattr(self.store, "shared", False):
            deadline = time.monotonic() + CROSS_PROCESS_GRACE
            while len(found) < len(wanted) and time.monotonic() < deadline:
                await asyncio.sleep(CROSS_PROCESS_POLL)
                found = await self._items(wanted, owner)
        return found

    async def _items(self, wanted: set[str], owner: str) -> dict[str, Item]:
        """Stored responses' items first; the ids none holds, in conversations."""
        found = _items_of(await self.store.holding(wanted, owner=owner), wanted)
        missing = wanted - found.keys()
        if missing:
            for conversation in await self.store.conversations_holding(missing, owner=owner):
                for item in conversation.items:
                    item_id = getattr(item, "id", None)
                    if item_id in missing:
                        found[item_id] = item
        return found

    async def delete(self, response_id: str, *, owner: str) -> bool:
        pending = self._pending.get(response_id)
        if pending is not None:
            await asyncio.shield(pending)
        return await self.store.delete(response_id, owner=owner)

    async def conversation(self, response_id: str, *, owner: str) -> Conversation | None:
        """Rebuild the chain ending at ``response_id``; ``None`` if any link is missing."""
        last = await self.get(response_id, owner=owner)
        if last is None:
            return None
        chain = [last]
        while chain[-1].previous_response_id is not None:
            if len(chain) >= MAX_CHAIN_DEPTH:
                return None
            parent = await self.get(chain[-1].previous_response_id, owner=owner)
            if parent is None:
                return None
            chain.append(parent)
        items: list[Item] = []
        for record in reversed(chain):
            if record.context is not None:
                items.extend(record.context)
            else:
                items.extend(record.input_items)
                items.extend(record.response.output)
        answered = {
            answered_call_id(item) for item in last.context or () if isinstance(item, CallOutput)
        }
        pending = {
            item.call_id: call_name(item)
            for item in last.response.output
            if isinstance(item, ClientCall) and item.call_id not in answered
        }
        # An MCP approval request waits for an answer too (which need not come).
        pending.update(
            (item.id, approval_name(item))
            for item in last.response.output
            if isinstance(item, McpApprovalRequest)
        )
        return Conversation(items=items, last=last, pending=pending, root_id=chain[-1].response.id)


def _stored(
    response: Response,
    owner: str,
    input_items: Sequence[Item],
    previous_response_id: str | None,
    context: Sequence[Item] | None,
) -> StoredResponse:
    return StoredResponse(
        id=response.id,
        owner=owner,
        created_at=time.time(),
        response=response,
        input_items=stored_input_items(input_items),
        previous_response_id=previous_response_id,
        context=stored_input_items(context) if context is not None else None,
    )


def _items_of(records: list[StoredResponse], wanted: set[str]) -> dict[str, Item]:
    found: dict[str, Item] = {}
    for record in records:
        for items in (record.input_items, record.response.output, record.context or ()):
            for item in items:
                item_id = getattr(item, "id", None)
                if item_id in wanted:
                    found[item_id] = item
    return found


def _usage_record(response: Response, *, owner: str, transport: str) -> UsageRecord:
    usage = response.usage
    return UsageRecord(
        response_id=response.id,
        owner=owner,
        model=response.model,
        input_tokens=usage.input_tokens if usage else 0,
        cached_tokens=usage.input_tokens_details.cached_tokens if usage else 0,
        output_tokens=usage.output_tokens if usage else 0,
        created_at=time.time(),
        transport=transport,
    )
