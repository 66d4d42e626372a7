"""The request-body stall guard: a body that keeps moving lives on however long it takes; one that stops dies."""

from __future__ import annotations

import asyncio

import pytest

from blobsync.backends.aiohttp_body import BodyStalled, _StallGuard


class _Transport:
    """What the guard reads of a transport: the bytes it still holds."""

    def __init__(self) -> None:
        self.pending = 0

    def get_write_buffer_size(self) -> int:
        return self.pending


class _SlowWriter:
    """A writer whose peer takes `step` bytes every `interval` seconds (0: never again once `after` is taken)."""

    def __init__(self, step: int, interval: float, after: int | None = None) -> None:
        self.transport = _Transport()
        self.step = step
        self.interval = interval
        self.after = after
        self.taken = 0

    async def write(self, piece: memoryview) -> None:
        self.transport.pending += piece.nbytes
        while self.transport.pending:
            if self.after is not None and self.taken >= self.after:
                await asyncio.Event().wait()  # the peer stopped reading: blocked for good
            await asyncio.sleep(self.interval)
            moved = min(self.step, self.transport.pending)
            self.transport.pending -= moved
            self.taken += moved


def _send(writer: _SlowWriter, timeout: float, slices: int) -> None:
    async def scenario() -> None:
        guard = _StallGuard(writer, timeout)  # type: ignore[arg-type]
        for _ in range(slices):
            await guard.write(memoryview(bytes(1000)))

    asyncio.run(scenario())


def test_a_slow_write_that_keeps_moving_is_not_a_stall() -> None:
    # Each slice takes 10 x 0.05 s = 0.5 s, longer than the 0.3 s timeout, but bytes move every 0.05 s.
    writer = _SlowWriter(step=100, interval=0.05)
    _send(writer, timeout=0.3, slices=2)
    assert writer.taken == 2000


def test_a_write_that_stops_moving_is_cut_off() -> None:
    writer = _SlowWriter(step=100, interval=0.01, after=1500)
    with pytest.raises(BodyStalled, match=r"no progress sending the body for 0\.3s"):
        _send(writer, timeout=0.3, slices=2)
    assert writer.taken == 1500
