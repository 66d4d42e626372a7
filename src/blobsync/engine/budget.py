"""Global budgets: bytes in flight (a pool of reusable buffers) and requests in flight."""

from __future__ import annotations

import asyncio
import mmap
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

# A pooled buffer. Block-sized ones are anonymous mmaps: page-aligned (direct I/O can write them as they are) and
# returned to the OS whole when dropped, where a large bytearray comes from malloc at an odd address. Private ones:
# mmap's default (shared) is backed by shmem, whose first touch of a page costs ~40% more (measured: 232 MiB of
# buffers, 0.17 -> 0.12 s).
BlockBuffer = bytearray | mmap.mmap
_MMAP_FROM = 1024 * 1024


def new_buffer(capacity: int) -> BlockBuffer:
    """A zero-filled buffer of exactly `capacity` bytes (page-aligned from 1 MiB up)."""
    if capacity >= _MMAP_FROM:
        if hasattr(mmap, "MAP_PRIVATE"):  # POSIX (Windows' mmap takes no flags)
            return mmap.mmap(-1, capacity, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return mmap.mmap(-1, capacity)
    return bytearray(capacity)


class WarmBuffers:
    """Idle block buffers a process keeps from one session to the next, so that the next session's blocks land in
    pages touched already: a fresh buffer's first touch costs ~0.4 s of CPU per GiB on the bench VM, and a worker
    of a split file runs one range task's session after another, each of which would fault in a pool of its own.
    Kept only where `keep` was called (blobsync's own worker processes); a library's host keeps its memory."""

    def __init__(self) -> None:
        self.limit = 0
        self._lock = threading.Lock()
        self._idle: dict[int, list[mmap.mmap]] = {}

    def keep(self, limit: int) -> None:
        """Keep up to `limit` bytes of the buffers sessions leave idle when they close."""
        self.limit = limit

    def take(self, capacity: int) -> mmap.mmap | None:
        with self._lock:
            idle = self._idle.get(capacity)
            return idle.pop() if idle else None

    def give(self, buffers: Iterable[BlockBuffer]) -> None:
        """A closing session's idle buffers: they replace what was kept (the last session's block size is the
        likeliest next), up to the limit; the rest are dropped."""
        kept: dict[int, list[mmap.mmap]] = {}
        held = 0
        for buf in buffers:
            if isinstance(buf, mmap.mmap) and held + len(buf) <= self.limit:
                kept.setdefault(len(buf), []).append(buf)
                held += len(buf)
        with self._lock:
            self._idle = kept


WARM = WarmBuffers()


class MemoryBudget:
    """Bytes in flight, as reusable buffers; waiters are served first come, first served.

    Buffers are kept for reuse because fresh multi-MiB allocations cost page faults on every block.
    Allocated buffers (in use or idle) plus reservations never exceed the limit; idle buffers of another
    size are dropped to make room.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counted = 0  # allocated buffers (in use or idle) + reservations
        self._idle: dict[int, list[BlockBuffer]] = {}
        self._queue: deque[object] = deque()
        self._futures: dict[object, asyncio.Future[None]] = {}

    @property
    def counted(self) -> int:
        return self._counted

    def _fits(self, size: int) -> bool:
        # A request larger than the whole budget (an auto-raised block size) is let through alone.
        if self._counted + size <= self.limit or self._counted == 0:
            return True
        for cap in list(self._idle):
            idle = self._idle[cap]
            while idle and self._counted + size > self.limit:
                idle.pop()
                self._counted -= cap
            if not idle:
                del self._idle[cap]
        return self._counted + size <= self.limit or self._counted == 0

    def _try_buffer(self, capacity: int) -> BlockBuffer | None:
        idle = self._idle.get(capacity)
        if idle:
            return idle.pop()
        if self._fits(capacity):
            self._counted += capacity
            return WARM.take(capacity) or new_buffer(capacity)
        return None

    def _try_reserve(self, size: int) -> int | None:
        if self._fits(size):
            self._counted += size
            return size
        return None

    async def _acquire(self, attempt: Callable[[], T | None]) -> T:
        if not self._queue:
            got = attempt()
            if got is not None:
                return got
        ticket = object()
        self._queue.append(ticket)
        try:
            while True:
                if self._queue[0] is ticket:
                    got = attempt()
                    if got is not None:
                        return got
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._futures[ticket] = fut
                await fut
        finally:
            self._queue.remove(ticket)
            self._futures.pop(ticket, None)
            self._wake()

    def _wake(self) -> None:
        for fut in self._futures.values():
            if not fut.done():
                fut.set_result(None)

    async def buffer(self, capacity: int) -> BlockBuffer:
        """A buffer of exactly `capacity` bytes, counted against the budget until `release`."""
        return await self._acquire(lambda: self._try_buffer(capacity))

    def release(self, buf: BlockBuffer) -> None:
        self._idle.setdefault(len(buf), []).append(buf)
        self._wake()

    def close(self) -> None:
        """The session is done: its idle buffers go to the process's warm ones (dropped where none are kept)."""
        idle, self._idle = self._idle, {}
        WARM.give(buf for bufs in idle.values() for buf in bufs)

    async def reserve(self, size: int) -> int:
        """Count `size` bytes (no buffer) against the budget; pass the result to `unreserve`."""
        return await self._acquire(lambda: self._try_reserve(size))

    def unreserve(self, size: int) -> None:
        self._counted -= size
        self._wake()


class RequestLimiter:
    """Requests in flight across every file of a job, adapting to throttling (AIMD).

    While the service throttles, the limit halves (at most once a second, so one burst of 503s counts once);
    after a limit's worth of successes in a row it grows by one, back up to the target: the configured number,
    or with --concurrency auto the level the tuner (engine/autotune.py) chose, never above `maximum`.
    It also keeps the counters the tuner samples: requests finished, the time they held a slot, and the
    integral of requests in flight over time (its mean over a period, against the limit, says whether the limit
    or something else, such as memory, CPU or the supply of work, was holding the job back).
    """

    def __init__(self, limit: int, maximum: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.maximum = max(limit, maximum or limit)
        self._limit = limit
        self.target = limit  # where additive growth stops
        self._active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()  # in arrival order
        self._woken = 0  # waiters woken for a slot that have not run yet
        self._clock = clock
        self._last_cut = -1e9
        self._streak = 0
        self.throttled = 0  # throttling answers seen
        self.cuts = 0  # times the limit was halved
        self.lowest = limit  # the lowest limit reached
        self.finished = 0  # requests that released their slot (any outcome)
        self.busy = 0.0  # seconds those requests held a slot, summed
        self._changed = clock()
        self._inflight_seconds = 0.0  # integral of active requests over time

    def inflight_seconds(self) -> float:
        """Request-seconds in flight since the start; its slope is the mean number in flight."""
        return self._inflight_seconds + self._active * (self._clock() - self._changed)

    def _account(self, now: float) -> None:
        self._inflight_seconds += self._active * (now - self._changed)
        self._changed = now

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def active(self) -> int:
        return self._active

    def on_throttled(self) -> None:
        self.throttled += 1
        self._streak = 0
        now = self._clock()
        if now - self._last_cut >= 1.0:
            self._last_cut = now
            self.cuts += 1
            self._limit = max(1, self._limit // 2)  # fewer slots: no waiter becomes eligible, no notify
            self.lowest = min(self.lowest, self._limit)

    async def on_success(self) -> None:
        if self._limit >= self.target:
            return
        self._streak += 1
        if self._streak >= self._limit:
            self._streak = 0
            self._limit += 1
            self._wake()

    async def set_target(self, level: int) -> None:
        """Move the limit to `level` at once (the tuner's decision), within 1..maximum."""
        level = max(1, min(self.maximum, level))
        self.target = level
        self._streak = 0
        if level != self._limit:
            self._limit = level
            self._wake()

    def slot(self) -> _Slot:
        """One request's slot, held for the `async with` (waiting, first come first served, while all are taken)."""
        return _Slot(self)

    async def _acquire(self) -> float:
        # One loop thread: the check and the increment cannot be split by another task, so no lock is needed.
        # A waiter that was woken holds its slot until it runs (`_woken`): a newcomer cannot take it meanwhile.
        if self._active + self._woken >= self._limit or self._waiters:
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                while True:
                    await waiter
                    self._woken -= 1
                    if self._active + self._woken < self._limit:
                        break
                    waiter = loop.create_future()  # the slot it was woken for is gone (a limit cut): first in line
                    self._waiters.appendleft(waiter)
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._woken -= 1  # woken for a slot it will not take: pass the turn on
                    self._wake()
                raise
        started = self._clock()
        self._account(started)
        self._active += 1
        return started

    def _release(self, started: float) -> None:
        now = self._clock()
        self.finished += 1
        self.busy += now - started
        self._account(now)
        self._active -= 1
        self._wake()

    def _wake(self) -> None:
        """Wake as many waiters, in order, as there are free slots."""
        free = self._limit - self._active - self._woken
        while free > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._woken += 1
                free -= 1


class _Slot:
    """`async with limiter.slot():` without a generator per request (this runs once per service request)."""

    __slots__ = ("_limiter", "_started")

    def __init__(self, limiter: RequestLimiter) -> None:
        self._limiter = limiter
        self._started = 0.0

    async def __aenter__(self) -> None:
        self._started = await self._limiter._acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._limiter._release(self._started)


class Window:
    """Blocks of one file read (or ranges fetched) ahead of their requests: the current request limit plus two.

    A fixed window sized for the largest limit (`--concurrency auto` may climb to 64) would fill the memory budget
    with blocks that wait for a request slot: more RSS and more page faults for no speed. This one follows the
    limiter's current limit (checked on every acquire; a higher limit takes effect at the next release)."""

    def __init__(self, limit: Callable[[], int], extra: int = 2) -> None:
        self._limit = limit
        self._extra = extra
        self._held = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        while self._held >= self._limit() + self._extra:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self._held += 1

    def release(self) -> None:
        self._held -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break
