"""One token bucket for the bandwidth cap (--cap-mbps), shared by every request of a job, both directions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class TokenBucket:
    """Lets `rate` bytes per second through on average, in bursts of at most `burst` bytes.

    Callers take tokens for each slice of a body before sending it (or after receiving it), so the cap holds
    across all connections together and the flow stays smooth: a slice is 256 KiB, never a whole block.
    Waiters are served in order (an asyncio.Lock is FIFO), so no request starves.
    """

    def __init__(self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self._fixed_burst = burst
        self.burst = burst if burst is not None else _default_burst(rate)
        self._clock = clock
        self._tokens = self.burst
        self._stamp = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def set_rate(self, rate: float) -> None:
        """Change the rate of a running bucket (`blobsync jobs cap`): tokens earned so far stay earned, none
        are granted for the change, and the burst follows the new rate, so the flow bends without a spike."""
        if rate <= 0:
            raise ValueError("rate must be positive")
        self._refill()
        self.rate = rate
        self.burst = self._fixed_burst if self._fixed_burst is not None else _default_burst(rate)
        self._tokens = min(self._tokens, self.burst)

    async def take(self, amount: int) -> None:
        """Wait until `amount` bytes may pass (amounts above the burst pass once the bucket is full)."""
        async with self._lock:
            self._refill()
            while self._tokens < min(float(amount), self.burst):
                # In short naps, so a rate raised meanwhile takes effect at once, not after a long wait.
                await asyncio.sleep(min(_NAP, (min(float(amount), self.burst) - self._tokens) / self.rate))
                self._refill()
            self._tokens -= amount  # may go negative for a big amount: the next caller waits it off


_NAP = 0.25


def _default_burst(rate: float) -> float:
    return max(256 * 1024, rate / 10)

