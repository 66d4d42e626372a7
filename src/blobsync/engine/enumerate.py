"""Walking a local tree into a scratch index from a worker thread, so the event loop never blocks on stat()."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

from blobsync.journal.index import Entry, SyncIndex

_BATCH = 5000
_BATCHES_IN_HAND = 4  # memory stays bounded on huge trees: the walk waits for the loop to store batches


async def index_in_thread(index: SyncIndex, side: str, entries: Callable[[], Iterator[Entry]],
                          seen: Callable[[int], None] = lambda count: None) -> None:
    """Run `entries()` in a worker thread and insert its batches into `index` on the loop's thread (SQLite
    connections stay on one thread), telling `seen` of each. Errors of the walk itself surface here."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[list[Entry] | None] = asyncio.Queue()
    stop = threading.Event()
    slots = threading.Semaphore(_BATCHES_IN_HAND)

    def produce() -> None:
        try:
            batch: list[Entry] = []
            for entry in entries():
                batch.append(entry)
                if len(batch) >= _BATCH:
                    slots.acquire()
                    if stop.is_set():
                        return
                    loop.call_soon_threadsafe(queue.put_nowait, batch)
                    batch = []
            loop.call_soon_threadsafe(queue.put_nowait, batch)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    walking = loop.run_in_executor(None, produce)
    try:
        while (batch := await queue.get()) is not None:
            index.add(side, batch)
            seen(len(batch))
            slots.release()
    finally:
        stop.set()
        for _ in range(_BATCHES_IN_HAND):
            slots.release()
        await asyncio.wait([walking])
    walking.result()
