"""--concurrency auto: a goodput hill-climber that picks the request limit; AIMD on throttling stays on top."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from blobsync.engine.budget import RequestLimiter
from blobsync.events import Progress

log = logging.getLogger("blobsync")

SATURATED = 0.75  # mean requests in flight / limit at which the limit counts as the bottleneck


@dataclass(frozen=True)
class Sample:
    """What the job did over one sampling period."""

    rate: float  # goodput: bytes acknowledged per second
    latency: float  # mean seconds a request held its slot
    saturated: bool  # requests in flight averaged near the limit: the limit, not memory, CPU or work, held them
    throttled: bool  # the service throttled during the period
    limit: int  # the live limit at the end of the period (AIMD may have cut it)


class ConcurrencyTuner:
    """Chooses the request limit from goodput samples; pure logic, fed by `autotune()` (or by a test).

    Slow start: while the limit is what holds requests back, double it each period as long as goodput grows by
    at least GAIN (16 -> 32 -> 64). The first doubling that does not pay goes back to the level before and
    ends slow start; from then on a probe is +STEP, tried every HOLD periods, and kept only if goodput grows by
    GAIN without latency rising sharply (LATENCY_RISE: more requests queueing in some buffer, not more work
    done). Equal goodput prefers the lower level: fewer connections, less memory in flight, gentler on a
    shared link. A throttled period takes the limit AIMD cut to as the level and probes back up from there.
    A probe is judged on the period right after it, against the period right before it, so a slow drift in
    conditions does not masquerade as a gain; noise can still cost a wrong step, which the next probe undoes.
    """

    GAIN = 0.10
    LATENCY_RISE = 2.0
    STEP = 2
    HOLD = 6

    def __init__(self, start: int, ceiling: int, floor: int = 1) -> None:
        self.ceiling = max(1, ceiling)
        self.floor = max(1, min(floor, self.ceiling))
        self.level = max(self.floor, min(start, self.ceiling))
        self.peak = self.level
        self.slow_start = True
        self._probe_from: tuple[int, Sample] | None = None  # (level, sample) a running probe is judged against
        self._hold = 0

    @property
    def settled(self) -> int:
        """The level the tuner stands by: the current one, or during a probe the one it came from."""
        return self._probe_from[0] if self._probe_from is not None else self.level

    def observe(self, s: Sample) -> int:
        """Take one period's sample; returns the level for the next period."""
        if s.throttled:
            # AIMD has already cut the live limit; adopt it and climb back with probes, not in one jump.
            self.level = max(self.floor, min(self.level, s.limit))
            self.slow_start = False
            self._probe_from = None
            self._hold = self.HOLD
            return self.level
        if self._probe_from is not None:
            before_level, before = self._probe_from
            self._probe_from = None
            if self._pays(before, s):
                return self._maybe_probe(s)  # this level's own sample is the baseline for the next probe
            self.level = before_level
            self.slow_start = False
            self._hold = self.HOLD
            return self.level
        if self._hold:
            self._hold -= 1
            return self.level
        return self._maybe_probe(s)

    def _pays(self, before: Sample, after: Sample) -> bool:
        gained = after.rate >= before.rate * (1 + self.GAIN)
        queued = before.latency > 0 and after.latency > before.latency * self.LATENCY_RISE
        # A sharp latency rise is accepted only if goodput grew well beyond noise.
        return gained and (not queued or after.rate >= before.rate * (1 + 2.5 * self.GAIN))

    def _maybe_probe(self, s: Sample) -> int:
        if not s.saturated or self.level >= self.ceiling:
            return self.level  # requests stayed well under the limit: more slots would change nothing now
        up = self.level * 2 if self.slow_start else self.level + self.STEP
        self._probe_from = (self.level, s)
        self.level = min(self.ceiling, up)
        self.peak = max(self.peak, self.level)
        return self.level


class Sampled(Protocol):
    """What the tuner reads (bytes acknowledged so far) and shows (the limit now)."""

    @property
    def bytes_sent(self) -> int: ...

    concurrency: int


class SharedTuning:
    """The one hill-climber of a request limiter, however many jobs share it (a Client's calls in flight share
    its session's): started by the first job that joins, stopped when the last leaves; it samples the bytes all of
    them send, and every one of them shows the limit it sets. Two tuners on one limiter would fight over it."""

    def __init__(self, limiter: RequestLimiter, start: int, ceiling: int) -> None:
        self.limiter = limiter
        self._start, self._ceiling = start, ceiling
        self._members: list[Progress] = []
        self._left = 0  # bytes of the jobs gone already: the sum never goes back
        self._task: asyncio.Task[None] | None = None
        self.tuner: ConcurrencyTuner | None = None

    @property
    def bytes_sent(self) -> int:
        return self._left + sum(p.bytes_sent for p in self._members)

    @property
    def concurrency(self) -> int:
        return self.limiter.limit

    @concurrency.setter
    def concurrency(self, value: int) -> None:
        for member in self._members:
            member.concurrency = value

    @contextlib.asynccontextmanager
    async def joined(self, progress: Progress) -> AsyncIterator[ConcurrencyTuner]:
        self._members.append(progress)
        if self._task is None or self.tuner is None:
            self.tuner = ConcurrencyTuner(self._start, self._ceiling)
            self._task = asyncio.create_task(autotune(self.tuner, self.limiter, self))
        tuner = self.tuner
        try:
            yield tuner
        finally:
            self._members.remove(progress)
            self._left += progress.bytes_sent
            if not self._members and self._task is not None:
                task, self._task = self._task, None
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


async def autotune(tuner: ConcurrencyTuner, limiter: RequestLimiter, progress: Sampled, *,
                   period: float = 0.5, max_period: float = 10.0,
                   clock: Callable[[], float] = time.monotonic) -> None:
    """Sample the job every `period` seconds (longer until a limit's worth of requests finished, so each sample
    sees whole requests even with big blocks on a slow link) and apply the tuner's level. Runs until cancelled."""
    await limiter.set_target(tuner.level)
    progress.concurrency = limiter.limit

    def mark() -> tuple[float, int, int, float, float, int]:
        return (clock(), progress.bytes_sent, limiter.finished, limiter.busy, limiter.inflight_seconds(),
                limiter.throttled)

    start, sent, finished, busy, inflight, throttled = mark()
    # The first period is a warm-up and is not shown to the tuner: it holds connection set-up, TCP slow start and
    # the job's first requests, so it understates the start level and made the first doubling look like a gain
    # every time (measured: 1 GiB down on loopback climbed to 32-64 in flight for no speed, 300 MiB of buffers).
    warming_up = True
    while True:
        await asyncio.sleep(period)
        now = clock()
        done = limiter.finished - finished
        if done < limiter.limit and now - start < max_period:
            continue
        elapsed = max(now - start, 1e-9)
        sample = Sample(
            rate=(progress.bytes_sent - sent) / elapsed,
            latency=(limiter.busy - busy) / done if done else 0.0,
            saturated=(limiter.inflight_seconds() - inflight) / elapsed >= SATURATED * limiter.limit,
            throttled=limiter.throttled > throttled,
            limit=limiter.limit,
        )
        if warming_up and not sample.throttled:
            warming_up = False
            start, sent, finished, busy, inflight, throttled = mark()
            continue
        warming_up = False
        level = tuner.observe(sample)
        log.debug("autotune: limit %d: %.1f MB/s, %.0f ms per request, %s%s -> %d", limiter.limit,
                  sample.rate / 1e6, sample.latency * 1000, "saturated" if sample.saturated else "not saturated",
                  ", throttled" if sample.throttled else "", level)
        if level != limiter.target or level != limiter.limit:
            await limiter.set_target(level)
        progress.concurrency = limiter.limit
        start, sent, finished, busy, inflight, throttled = mark()
