"""One token bucket for the bandwidth cap (--cap-mbps), shared by every request of a job, both directions, and by
every worker process of the job on this machine (its state can live in shared memory)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, MutableSequence
from typing import Any

# The bucket's numbers, as offsets into its state: cumulative bytes, so a reservation is one addition and a rate
# change reaches every waiter at once (each compares the bytes earned so far with the point it waits for).
_EARNED, _RESERVED, _PASSED, _STAMP, _RATE, _BURST, _FIXED_BURST = range(7)
_NAP = 0.25


class BucketState:
    """The numbers of a bucket and the lock that guards them: in this process's memory, or (`shared()`) in shared
    memory that spawned worker processes inherit, so that they all draw on one cap."""

    def __init__(self, values: MutableSequence[float], lock: Any) -> None:
        self.values = values
        self.lock = lock

    @classmethod
    def local(cls, rate: float, burst: float | None, now: float) -> BucketState:
        fixed = -1.0 if burst is None else burst
        start = burst if burst is not None else _default_burst(rate)
        return cls([start, 0.0, 0.0, now, rate, start, fixed], threading.Lock())

    @classmethod
    def shared(cls) -> BucketState:
        """A state in shared memory, for worker processes made by the spawn context (the lock and the array travel
        to them as the pool starts them); a bucket moves its numbers into it with `TokenBucket.move_to`."""
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        return cls(context.RawArray("d", [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, -1.0]), context.Lock())

    def __getstate__(self) -> dict[str, Any]:
        return {"values": self.values, "lock": self.lock}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.values, self.lock = state["values"], state["lock"]


class TokenBucket:
    """Lets `rate` bytes per second through on average, in bursts of at most `burst` bytes.

    Callers take tokens for each slice of a body before sending it (or after receiving it), so the cap holds
    across all connections together and the flow stays smooth: a slice is 256 KiB, never a whole block.
    Takers are served in the order they asked (each reserves its place in the byte count), so no request starves;
    the bucket is safe across threads, event loops and (with a shared state) processes.
    """

    def __init__(self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic,
                 *, state: BucketState | None = None) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self._clock = clock
        self.state = state or BucketState.local(rate, burst, clock())

    @property
    def rate(self) -> float:
        return self.state.values[_RATE]

    @property
    def burst(self) -> float:
        return self.state.values[_BURST]

    @property
    def tokens(self) -> float:
        """Bytes that may pass now without waiting (negative: a debt the next taker waits off)."""
        with self.state.lock:
            self._refill()
            return self.state.values[_EARNED] - self.state.values[_PASSED]

    def move_to(self, state: BucketState) -> None:
        """Keep this bucket's numbers in `state` from now on (a shared one: buckets made over it in worker
        processes then draw on this one cap, and `set_rate` here reaches them)."""
        with self.state.lock, state.lock:
            state.values[:] = list(self.state.values)
        self.state = state

    def _refill(self) -> None:
        v = self.state.values
        now = self._clock()
        # Bytes earned never run more than a burst ahead of those let through: a bucket holds at most `burst`.
        v[_EARNED] = min(v[_PASSED] + v[_BURST], v[_EARNED] + max(0.0, now - v[_STAMP]) * v[_RATE])
        v[_STAMP] = now

    def set_rate(self, rate: float) -> None:
        """Change the rate of a running bucket (`blobsync jobs cap`): tokens earned so far stay earned, none
        are granted for the change, and the burst follows the new rate, so the flow bends without a spike."""
        if rate <= 0:
            raise ValueError("rate must be positive")
        with self.state.lock:
            v = self.state.values
            self._refill()
            v[_RATE] = rate
            v[_BURST] = v[_FIXED_BURST] if v[_FIXED_BURST] >= 0 else _default_burst(rate)
            v[_EARNED] = min(v[_EARNED], v[_PASSED] + v[_BURST])

    async def take(self, amount: int) -> None:
        """Wait until `amount` bytes may pass (amounts above the burst pass once the bucket is full)."""
        with self.state.lock:
            v = self.state.values
            self._refill()
            start = max(v[_RESERVED], v[_PASSED])
            v[_RESERVED] = start + amount
            wanted = start + min(float(amount), v[_BURST])
        try:
            while True:
                with self.state.lock:
                    self._refill()
                    short = wanted - v[_EARNED]
                    rate = v[_RATE]
                if short <= 0:
                    return
                # In short naps, so a rate raised meanwhile takes effect at once, not after a long wait.
                await asyncio.sleep(min(_NAP, short / rate))
        finally:
            with self.state.lock:
                # Counted as let through even when cancelled in the queue: those behind it never wait for it.
                v[_PASSED] = max(v[_PASSED], start + amount)

def _default_burst(rate: float) -> float:
    return max(256 * 1024, rate / 10)
