"""Everything the engine's parts share for one job: the store, the journal, the budgets and the counters."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from blobsync.backends.base import ContainerStore
from blobsync.config import TransferConfig
from blobsync.engine.budget import MemoryBudget, RequestLimiter
from blobsync.engine.retry import Retrier
from blobsync.errors import ThrottledError
from blobsync.journal import Journal

T = TypeVar("T")


@dataclass
class Progress:
    """Live counters a progress display reads; the engine only ever adds to them."""

    job_id: str | None = None
    files_total: int = 0
    files_done: int = 0
    files_failed: int = 0
    files_skipped: int = 0
    bytes_total: int = 0
    bytes_done: int = 0  # bytes of file content acknowledged by the service (or found there on resume)
    bytes_sent: int = 0  # bytes that went over the wire in this run
    concurrency: int = 0  # the adaptive request limit now
    throttled: int = 0  # throttling answers so far
    started: float = field(default_factory=time.monotonic)


@dataclass
class EngineContext:
    store: ContainerStore
    journal: Journal
    config: TransferConfig
    memory: MemoryBudget
    limiter: RequestLimiter
    retrier: Retrier
    io_pool: ThreadPoolExecutor  # positional reads + per-block MD5
    hash_pool: ThreadPoolExecutor  # whole-file MD5, one thread: updates stay in order per file
    progress: Progress

    async def request(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """One service request under the retry policy, each try holding one request slot."""

        async def limited() -> T:
            async with self.limiter.slot():
                try:
                    result = await attempt()
                except ThrottledError:
                    self.limiter.on_throttled()
                    self.progress.throttled = self.limiter.throttled
                    self.progress.concurrency = self.limiter.limit
                    raise
            await self.limiter.on_success()
            self.progress.concurrency = self.limiter.limit
            return result

        return await self.retrier.call(limited)
