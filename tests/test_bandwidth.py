"""--cap-mbps: one token bucket for the whole job; the cap is never exceeded by more than 10% (slower is fine)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from blobsync.config import MiB, mbps_to_bytes
from blobsync.engine.bandwidth import TokenBucket
from conftest import ContainerHandle
from support.cli import random_file, run, start

CAP_MBPS = 16  # 2,000,000 bytes/s


def test_bucket_paces_concurrent_takers() -> None:
    async def scenario() -> float:
        bucket = TokenBucket(rate=4 * MiB, burst=256 * 1024)
        start = time.monotonic()

        async def taker() -> None:
            for _ in range(8):
                await bucket.take(256 * 1024)

        await asyncio.gather(*(taker() for _ in range(4)))  # 8 MiB through a 4 MiB/s bucket
        return time.monotonic() - start

    elapsed = asyncio.run(scenario())
    assert elapsed >= (8 * MiB - 256 * 1024) / (4 * MiB) / 1.1


def _rate(nbytes: int, started: float) -> float:
    return nbytes / (time.monotonic() - started)


def test_upload_and_download_stay_under_the_cap(container: ContainerHandle, tmp_path: Path) -> None:
    size = 6 * MiB
    data = random_file(tmp_path / "f.bin", size)
    cap = mbps_to_bytes(CAP_MBPS)
    common = ["--journal", str(tmp_path / "j.db"), "--block-size-mb", "1", "--concurrency", "8",
              "--cap-mbps", str(CAP_MBPS), "--quiet"]
    started = time.monotonic()
    up = run(["cp", str(tmp_path / "f.bin"), f"{container.url}/f.bin", *common])
    up_rate = _rate(size, started)
    assert up.returncode == 0, up.stderr
    assert up_rate <= cap * 1.1, f"{up_rate:.0f} B/s over a cap of {cap:.0f}"
    started = time.monotonic()
    down = run(["cp", f"{container.url}/f.bin", str(tmp_path / "back.bin"), *common])
    down_rate = _rate(size, started)
    assert down.returncode == 0, down.stderr
    assert down_rate <= cap * 1.1, f"{down_rate:.0f} B/s over a cap of {cap:.0f}"
    assert container.download("f.bin") == data and (tmp_path / "back.bin").read_bytes() == data


def test_rate_change_keeps_earned_tokens_and_grants_none() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=10 * MiB, clock=lambda: now[0])  # burst: a tenth of a second's worth
    assert bucket.burst == MiB
    bucket.set_rate(1 * MiB)
    assert bucket.burst == 256 * 1024  # burst follows the rate: no spike at the old rate's size
    assert bucket.tokens == 256 * 1024
    asyncio.run(bucket.take(256 * 1024))  # the bucket is empty now
    assert bucket.tokens == 0
    now[0] = 0.1
    bucket.set_rate(2 * MiB)  # 0.1 s at the old 1 MiB/s was earned; the change itself grants nothing
    assert bucket.tokens == pytest.approx(0.1 * MiB)


def test_raised_rate_releases_a_waiting_taker() -> None:
    async def scenario() -> bool:
        bucket = TokenBucket(rate=100_000, burst=256 * 1024)
        await bucket.take(256 * 1024)  # empty now: the next slice would wait ~2.6 s at this rate
        waiter = asyncio.create_task(bucket.take(256 * 1024))
        await asyncio.sleep(0.05)
        bucket.set_rate(100 * MiB)
        done, _ = await asyncio.wait([waiter], timeout=2.0)
        return waiter in done

    assert asyncio.run(scenario())


def test_cap_of_a_running_job_is_changed_with_jobs_cap(container: ContainerHandle, tmp_path: Path) -> None:
    size = 4 * MiB  # at 2 Mbit/s this takes about 17 s; raised to 2000 Mbit/s, a moment
    data = random_file(tmp_path / "f.bin", size)
    journal = str(tmp_path / "j.db")
    started = time.monotonic()
    proc = start(["cp", str(tmp_path / "f.bin"), f"{container.url}/f.bin", "--journal", journal,
                  "--block-size-mb", "1", "--cap-mbps", "2", "--quiet", "--log-level", "INFO"])
    try:
        job_id = ""
        deadline = time.monotonic() + 30
        while not job_id and time.monotonic() < deadline:  # the job row appears once the run has started
            listed = run(["jobs", "list", "--journal", journal]).stdout.split()
            job_id = listed[0] if len(listed) > 1 and listed[1] == "running" else ""
        assert job_id, "the job never showed up as running"
        changed = run(["jobs", "cap", job_id, "2000", "--journal", journal])
        assert changed.returncode == 0 and "applies within a second" in changed.stdout, changed
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (out, err)
    assert "bandwidth cap changed to 2000 Mbit/s" in err
    assert time.monotonic() - started < size / mbps_to_bytes(2) * 0.8  # well before the old cap allowed
    assert container.download("f.bin") == data
    shown = run(["jobs", "cap", job_id, "0", "--journal", journal])
    assert shown.returncode == 2 and "out of range: 0.001 to 1,000,000 Mbit/s" in shown.stderr


def test_progress_under_a_low_cap_is_true_from_the_first_seconds(container: ContainerHandle, tmp_path: Path) -> None:
    data = random_file(tmp_path / "f.bin", 24 * MiB, seed=21)
    done = run(["cp", str(tmp_path / "f.bin"), f"{container.url}/f.bin", "--cap-mbps", "40", "--block-size-mb", "4",
                "--journal", str(tmp_path / "j.db"), "--output-type", "json", "--progress-interval", "0.5"])
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    progress = [r for r in records if r["type"] == "progress"]
    duration = next(r for r in records if r["type"] == "summary")["duration"]
    assert duration > 3  # 24 MiB at 5 MB/s
    early = [r for r in progress if 1.0 <= r["elapsed"] <= 2.0]
    assert early and all(r["bytes_on_wire"] > 0 and r["rate_bytes_per_second"] > 0 for r in early), early
    # Few blocks share the cap, so each is acknowledged soon, not all of them at the end.
    first_acked = min(r["elapsed"] for r in progress if r["bytes_done"] > 0)
    assert first_acked < duration / 2, (first_acked, duration)
    assert container.download("f.bin") == data
