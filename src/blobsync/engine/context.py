"""Everything the engine's parts share for one job: the store, the journal, the budgets and the counters; and the
one function that builds it (and owns its threads)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from blobsync.backends.base import Store
from blobsync.config import AUTO_CEILING, AUTO_START, TransferConfig
from blobsync.engine.autotune import SharedTuning
from blobsync.engine.bandwidth import TokenBucket
from blobsync.engine.budget import MemoryBudget, RequestLimiter
from blobsync.engine.prompt import OverwritePrompt
from blobsync.engine.retry import Retrier, RetryPolicy
from blobsync.errors import ThrottledError
from blobsync.events import Progress
from blobsync.journal import Journal
from blobsync.redact import redact

T = TypeVar("T")
log = logging.getLogger("blobsync")


class RequestPath:
    """The one path every service request of a job takes: a slot of the adaptive limit for each try, the
    retry policy around the tries, and the counters the report and the progress display read."""

    def __init__(self, limiter: RequestLimiter, retrier: Retrier, progress: Progress) -> None:
        self.limiter = limiter
        self.retrier = retrier
        self.progress = progress

    async def __call__(self, attempt: Callable[[], Awaitable[T]]) -> T:
        limiter, progress = self.limiter, self.progress

        async def limited() -> T:
            async with limiter.slot():
                try:
                    result = await attempt()
                except ThrottledError:
                    limiter.on_throttled()
                    progress.throttled = limiter.throttled
                    progress.concurrency = limiter.limit
                    raise
            await limiter.on_success()
            progress.concurrency = limiter.limit
            return result

        return await self.retrier.call(limited)


def job_retrier(config: TransferConfig, progress: Progress) -> Retrier:
    """The retry policy of one job, counting its retries in `progress`."""

    def on_retry(error: BaseException, delay: float) -> None:
        progress.retries += 1
        log.info("retrying in %.1fs after: %s", delay, redact(str(error)))

    return Retrier(RetryPolicy(max_attempts=config.max_retries + 1, deadline=config.retry_deadline),
                   on_retry=on_retry)


def request_path(config: TransferConfig, progress: Progress, clock: Callable[[], float] = time.monotonic
                 ) -> RequestPath:
    """The request path of one job (or one ls, make or rm): its adaptive limit, retry policy and counters."""
    return RequestPath(RequestLimiter(config.start_concurrency, config.max_concurrency, clock),
                       job_retrier(config, progress), progress)


@dataclass
class EngineContext:
    store: Store
    journal: Journal
    config: TransferConfig
    memory: MemoryBudget
    requests: RequestPath
    io_pool: ThreadPoolExecutor  # positional reads + per-block MD5
    hash_pool: ThreadPoolExecutor  # whole-file MD5, one thread: updates stay in order per file
    progress: Progress
    overwrite_prompt: OverwritePrompt | None = None  # answers --overwrite prompt
    bandwidth: TokenBucket | None = None  # the --cap-mbps bucket the store's wire obeys (re-capped live)
    tuning: SharedTuning | None = None  # --concurrency auto's one tuner of the limiter (the session's, if shared)

    @property
    def limiter(self) -> RequestLimiter:
        return self.requests.limiter

    @property
    def retrier(self) -> Retrier:
        return self.requests.retrier

    async def request(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """One service request under the retry policy, each try holding one request slot."""
        return await self.requests(attempt)


def shared_tuning(limiter: RequestLimiter) -> SharedTuning:
    return SharedTuning(limiter, AUTO_START, AUTO_CEILING)


def memory_budget(config: TransferConfig) -> int:
    """The bytes of buffers a job may hold: --memory-mb, less under a bandwidth cap."""
    if not config.cap_bytes:
        return config.memory
    # Under a cap, bytes in flight share it: 16 blocks of 8 MiB at 20 Mbit/s took ~50 s to see the first
    # acknowledged (progress and resume move only then). About two seconds of the cap, and at least two blocks,
    # keep the link busy and each block short.
    return min(config.memory, max(2 * config.block_size, int(config.cap_bytes * 2)))


@asynccontextmanager
async def open_engine(config: TransferConfig, store: Store, journal: Journal, *, progress: Progress | None = None,
                      clock: Callable[[], float] = time.monotonic, bandwidth: TokenBucket | None = None,
                      overwrite_prompt: OverwritePrompt | None = None) -> AsyncIterator[EngineContext]:
    """The engine context of one job: its budgets, request path and thread pools, which it shuts down on exit."""
    progress = progress or Progress()
    io_pool = ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2) + 2), thread_name_prefix="bs-io")
    hash_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bs-md5")
    try:
        requests = request_path(config, progress, clock)
        yield EngineContext(store, journal, config, MemoryBudget(memory_budget(config)), requests, io_pool, hash_pool,
                            progress, overwrite_prompt, bandwidth, shared_tuning(requests.limiter))
    finally:
        io_pool.shutdown(wait=True)
        hash_pool.shutdown(wait=True)
