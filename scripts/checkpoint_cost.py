"""What a checkpoint write costs: ``.venv/bin/python scripts/checkpoint_cost.py [REDIS_URL]``.

For a checkpoint of N items (50 and 500) of 2,000 bytes each and a 1,000-byte
state, on SQLite (a temporary file, as ``longresponse serve`` opens it) and,
given a URL, on Redis: the time of one ``checkpoint_write`` that appends one
item (what a pause writes) against one that rewrites all N + 1 items (keep=0,
what a store without appends would do), 200 of each, and the bytes each sends
to the store. For SQLite also the bytes the process hands to ``write(2)``
(``wchar`` in ``/proc/self/io``: the WAL frames written, pages of 4 KiB).
"""

import asyncio
import contextlib
import pathlib
import statistics
import sys
import tempfile
import time

from longresponse.storage.backends import RedisStore, ResponseStore, SQLiteStore

ITEM = 2_000
STATE = b"s" * 1_000
WRITES = 200


def written_bytes() -> int:
    for line in pathlib.Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


async def measure(store: ResponseStore, name: str, n: int) -> None:
    items = [bytes([n % 251]) * ITEM for n in range(n)]
    for mode in ("append", "rewrite"):
        response_id = f"resp_cost_{name}_{n}_{mode}"
        epoch = await store.checkpoint_open(
            response_id, owner="", state=STATE, items=items, ttl=600
        )
        times = []
        sent = io = 0
        for _ in range(WRITES):
            if mode == "append":
                keep, new = n, [b"x" * ITEM]
            else:
                keep, new = 0, [*items, b"x" * ITEM]
            io_before, started = written_bytes(), time.perf_counter()
            assert await store.checkpoint_write(
                response_id, owner="", epoch=epoch, state=STATE, keep=keep, items=new, ttl=600
            )
            times.append(time.perf_counter() - started)
            io += written_bytes() - io_before
            sent += len(STATE) + sum(map(len, new))
            if mode == "append":  # back to n items, untimed
                await store.checkpoint_write(
                    response_id, owner="", epoch=epoch, state=STATE, keep=n, items=[], ttl=600
                )
        await store.checkpoint_delete(response_id, owner="")
        disk = f", {io / WRITES / 1024:7.1f} KiB to write(2)" if name == "sqlite" else ""
        print(
            f"{name:6} {n:4} items  {mode:7}: median {statistics.median(times) * 1000:6.2f} ms,"
            f" p90 {statistics.quantiles(times, n=10)[-1] * 1000:6.2f} ms,"
            f" {sent / WRITES / 1024:7.1f} KiB sent{disk}"
        )


async def main(redis_url: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with contextlib.aclosing(SQLiteStore(pathlib.Path(tmp) / "cost.db")) as sqlite:
            for n in (50, 500):
                await measure(sqlite, "sqlite", n)
    if redis_url:
        async with contextlib.aclosing(RedisStore(redis_url)) as store:
            for n in (50, 500):
                await measure(store, "redis", n)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
