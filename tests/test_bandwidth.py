"""--cap-mbps: one token bucket for the whole job; the cap is never exceeded by more than 10% (slower is fine)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from blobsync.config import MiB
from blobsync.engine.bandwidth import TokenBucket, mbps_to_bytes
from conftest import ContainerHandle
from support.cli import random_file, run

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
