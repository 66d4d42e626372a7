"""Everything the engine's parts share for one job: the store, the journal, the budgets and the counters; and the
one function that builds it (and owns its threads)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from blobsync.backends.base import Store
from blobsync.config import AUTO_CEILING, AUTO_START, TransferConfig
from blobsync.engine.autotune import SharedTuning
from blobsync.engine.bandwidth import TokenBucket
from blobsync.engine.budget import MemoryBudget, RequestLimiter
from blobsync.engine.digest import HashLanes
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

    def met_elsewhere(self, retries: int, throttled: int) -> None:
        """Retries and throttling answers a process of this job's own met on its behalf (a listing's process):
        counted as this path's, in the report and the progress display."""
        self.retrier.retries += retries
        self.progress.retries += retries
        self.limiter.throttled += throttled
        self.progress.throttled = self.limiter.throttled


def job_retrier(config: TransferConfig, progress: Progress) -> Retrier:
    """The retry policy of one job, counting its retries in `progress`."""

    def on_retry(error: BaseException, delay: float) -> None:
        progress.retries += 1
        log.info("retrying in %.1fs after: %s", delay, redact(str(error)))

    return Retrier(RetryPolicy(max_attempts=config.max_retries + 1, deadline=config.retry_deadline),
                   on_retry=on_retry)


@dataclass
class EngineContext:
    store: Store
    journal_of: Callable[[], Journal]  # the session's journal, opened on first use (a get or a put keeps none)
    config: TransferConfig
    memory: MemoryBudget
    requests: RequestPath
    io_pool: ThreadPoolExecutor  # positional reads + per-block MD5
    hashing: HashLanes  # whole-file MD5s: a file's updates on one lane (in order), files on lanes side by side
    progress: Progress
    overwrite_prompt: OverwritePrompt | None = None  # answers --overwrite prompt
    bandwidth: TokenBucket | None = None  # the --cap-mbps bucket the store's wire obeys (re-capped live)
    tuning: SharedTuning | None = None  # --concurrency auto's one tuner of the limiter (the session's, if shared)

    @property
    def journal(self) -> Journal:
        return self.journal_of()

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
