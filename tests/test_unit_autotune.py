"""--concurrency auto: the tuner, fed synthetic goodput samples (no I/O, a hand-moved clock), and its config."""

from __future__ import annotations

import asyncio

import pytest

from blobsync.config import AUTO_CEILING, AUTO_START, TransferConfig, parse_concurrency
from blobsync.engine.autotune import ConcurrencyTuner, Sample, autotune
from blobsync.engine.budget import RequestLimiter
from blobsync.errors import UsageError
from blobsync.events import Progress


def s(rate: float, latency: float = 0.1, *, saturated: bool = True, throttled: bool = False,
      limit: int = 0) -> Sample:
    return Sample(rate=rate, latency=latency, saturated=saturated, throttled=throttled, limit=limit)


def _hold(tuner: ConcurrencyTuner, rate: float) -> None:
    """Feed the periods a tuner waits after a failed probe; the level must not move meanwhile."""
    level = tuner.level
    for _ in range(ConcurrencyTuner.HOLD):
        assert tuner.observe(s(rate)) == level


def test_slow_start_doubles_while_goodput_grows_then_settles_on_the_last_level_that_paid() -> None:
    t = ConcurrencyTuner(8, 64)
    assert t.observe(s(100)) == 16
    assert t.observe(s(190)) == 32
    assert t.observe(s(350)) == 64
    assert t.settled == 32  # judging the probe to 64
    assert t.observe(s(360)) == 32  # +3%: not worth twice the connections
    assert (t.settled, t.peak, t.slow_start) == (32, 64, False)


def test_after_slow_start_probes_are_additive_and_kept_only_when_they_pay() -> None:
    t = ConcurrencyTuner(8, 64)
    t.observe(s(100))
    assert t.observe(s(100)) == 8  # 16 did not help: back to 8, hold
    _hold(t, 100)
    assert t.observe(s(100)) == 8 + ConcurrencyTuner.STEP
    assert t.observe(s(120)) == 8 + 2 * ConcurrencyTuner.STEP  # +20%: kept, and the next probe starts
    assert t.observe(s(121)) == 8 + ConcurrencyTuner.STEP  # flat: back
    assert t.settled == 10


def test_a_probe_that_only_builds_a_queue_is_refused() -> None:
    t = ConcurrencyTuner(8, 64)
    assert t.observe(s(100, latency=0.1)) == 16
    # +15% goodput but latency x3: requests are waiting in some buffer, not getting more done
    assert t.observe(s(115, latency=0.3)) == 8
    t2 = ConcurrencyTuner(8, 64)
    t2.observe(s(100, latency=0.1))
    assert t2.observe(s(180, latency=0.3)) == 32  # a large gain is worth the latency


def test_no_probe_while_the_limit_is_not_what_holds_requests_back() -> None:
    # e.g. the memory budget or the supply of work limits bytes in flight: more slots would change nothing
    t = ConcurrencyTuner(8, 64)
    for rate in (100, 200, 400):
        assert t.observe(s(rate, saturated=False)) == 8
    assert t.observe(s(400)) == 16


def test_throttling_takes_the_cut_limit_and_climbs_back_additively() -> None:
    t = ConcurrencyTuner(8, 64)
    t.observe(s(100))
    t.observe(s(190))
    assert t.level == 32
    assert t.observe(s(150, throttled=True, limit=16)) == 16  # AIMD halved 32 -> 16
    assert not t.slow_start
    _hold(t, 150)
    assert t.observe(s(150)) == 16 + ConcurrencyTuner.STEP


def test_never_above_the_ceiling_nor_below_the_floor() -> None:
    t = ConcurrencyTuner(8, 12)
    assert t.observe(s(100)) == 12
    assert t.observe(s(200)) == 12
    assert t.observe(s(400)) == 12 and t.peak == 12
    t = ConcurrencyTuner(8, 64, floor=4)
    assert t.observe(s(100, throttled=True, limit=1)) == 4


def test_concurrency_option_and_journal_round_trip() -> None:
    assert parse_concurrency("auto") == "auto" and parse_concurrency("AUTO") == "auto"
    assert parse_concurrency("16") == 16
    with pytest.raises(UsageError, match="--concurrency"):
        parse_concurrency("lots")
    with pytest.raises(UsageError, match="concurrency"):
        TransferConfig(concurrency=513)
    auto = TransferConfig()
    assert auto.auto_concurrency and (auto.start_concurrency, auto.max_concurrency) == (AUTO_START, AUTO_CEILING)
    fixed = TransferConfig(concurrency=16)
    assert not fixed.auto_concurrency and (fixed.start_concurrency, fixed.max_concurrency) == (16, 16)
    for cfg in (auto, fixed):
        assert TransferConfig.from_journal(cfg.journal_options()).concurrency == cfg.concurrency
    # A journal written before "auto" existed stored a number; it is read back as that fixed ceiling.
    old = {k: v for k, v in fixed.journal_options().items()}
    old["concurrency"] = 12
    assert TransferConfig.from_journal(old).max_concurrency == 12


def test_the_first_sampling_period_is_a_warm_up_the_tuner_never_sees() -> None:
    """Connection set-up and TCP slow start fill the first period: judged, it made the first doubling always pay."""
    seen: list[Sample] = []

    class Recording(ConcurrencyTuner):
        def observe(self, sample: Sample) -> int:
            seen.append(sample)
            return self.level  # hold the level: this test is about which periods are judged

    now = [0.0]  # the tuner's clock, moved by hand: each period lasts exactly one second

    async def main() -> None:
        limiter, progress = RequestLimiter(16, 64), Progress()
        task = asyncio.create_task(autotune(Recording(16, 64), limiter, progress, period=0.005,
                                            clock=lambda: now[0]))
        await asyncio.sleep(0.02)  # autotune takes its starting marks
        for period in range(4):  # period 0 (the warm-up) moves 1 MB, each later one 10 MB
            progress.bytes_sent += 1_000_000 if period == 0 else 10_000_000
            limiter.finished += 16  # a limit's worth of requests finished: the period counts
            now[0] += 1.0
            await asyncio.sleep(0.03)  # autotune wakes, samples this period once
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert [x.rate for x in seen] == [10_000_000.0] * 3  # three judged periods; the 1 MB warm-up is not one


def test_jobs_sharing_a_limiter_share_one_tuner() -> None:
    """Two calls in flight on one Client: one hill-climber on the session's limiter, started by the first job,
    sampling both jobs' bytes, stopped with the last (issue 39, point 1)."""
    import asyncio

    from blobsync.engine.autotune import SharedTuning
    from blobsync.engine.budget import RequestLimiter
    from blobsync.events import Progress

    def climbers() -> int:
        return sum(1 for t in asyncio.all_tasks() if getattr(t.get_coro(), "__name__", "") == "autotune")

    async def scenario() -> None:
        tuning = SharedTuning(RequestLimiter(16, 64), 16, 64)
        one, two = Progress(), Progress()
        async with tuning.joined(one) as first:
            one.bytes_sent = 100
            async with tuning.joined(two) as second:
                assert first is second and climbers() == 1
                two.bytes_sent = 50
                assert tuning.bytes_sent == 150
                tuning.concurrency = 24
                assert one.concurrency == two.concurrency == 24
            assert tuning.bytes_sent == 150 and climbers() == 1  # a job that leaves keeps its bytes counted
        await asyncio.sleep(0)
        assert climbers() == 0

    asyncio.run(scenario())
