"""Follows what another process asks of a running job through the journal: today its bandwidth cap."""

from __future__ import annotations

import asyncio
import logging
import time

from blobsync.config import mbps_to_bytes
from blobsync.engine.bandwidth import TokenBucket
from blobsync.journal import Journal

log = logging.getLogger("blobsync")


async def follow_cap(journal: Journal, job_id: str, bucket: TokenBucket, *, every: float = 1.0) -> None:
    """Apply caps set with `blobsync jobs cap` after this run started (the run's own --cap-mbps wins over
    older ones); polls the journal every `every` seconds until cancelled."""
    seen = time.time()
    while True:
        await asyncio.sleep(every)
        asked = journal.job_cap(job_id)
        if asked is not None and asked[1] > seen:
            mbps, seen = asked
            bucket.set_rate(mbps_to_bytes(mbps))
            log.info("bandwidth cap changed to %g Mbit/s", mbps)
