"""One job's store and engine context, opened together for a URL and closed together."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from blobsync.backends.base import Location
from blobsync.backends.registry import Wire, open_store
from blobsync.config import TransferConfig
from blobsync.engine.bandwidth import TokenBucket, mbps_to_bytes
from blobsync.engine.context import EngineContext, Progress, RemoteRunner, open_engine
from blobsync.engine.prompt import OverwritePrompt
from blobsync.journal import Journal


@asynccontextmanager
async def open_session(location: str | Location, config: TransferConfig, env: Mapping[str, str], journal: Journal,
                       *, progress: Progress | None = None, overwrite_prompt: OverwritePrompt | None = None,
                       cluster: RemoteRunner | None = None) -> AsyncIterator[EngineContext]:
    """The store for `location`, its wire obeying the job's bandwidth cap and feeding its progress, and the engine
    context around it."""
    progress = progress or Progress()
    bucket = TokenBucket(mbps_to_bytes(config.cap_mbps)) if config.cap_mbps else None
    store = open_store(location, config, env, Wire(bucket.take if bucket else None, progress.on_wire))
    try:
        async with open_engine(config, store, journal, progress=progress, bandwidth=bucket,
                               overwrite_prompt=overwrite_prompt, cluster=cluster) as ctx:
            yield ctx
    finally:
        await store.close()
