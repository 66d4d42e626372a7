"""The jobs (upload, download, sync, remove, put, and the watcher that repeats syncs) and `run_job`, the one way
each is run: inside a session, on this machine or on a cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from blobsync.backends.base import Capabilities, Location
from blobsync.config import Overwrite, TransferConfig
from blobsync.engine.prompt import OverwritePrompt
from blobsync.engine.session import Session
from blobsync.errors import UsageError
from blobsync.events import Progress
from blobsync.jobs.runner import RemoteRunner
from blobsync.jobs.spec import (
    CopySpec,
    DownloadSpec,
    Hooks,
    JobSpec,
    PutSpec,
    RemoveSpec,
    SyncSpec,
    UploadSpec,
)
from blobsync.journal import JobRow
from blobsync.report import Report

__all__ = ["CopySpec", "DownloadSpec", "Hooks", "JobSpec", "PutSpec", "RemoveSpec", "SyncSpec", "UploadSpec", "run_job"]


def check_writes(config: TransferConfig, caps: Capabilities, where: str) -> None:
    """Refuse, before anything moves, a write option the destination store cannot keep (a flag is never dropped
    in silence): its access tiers, header properties, tags and metadata names are its own."""
    if not caps.writes:
        raise UsageError(f"{where}: this kind of URL is a source only: blobsync writes to Azure Blob Storage (or "
                         "memory://)")
    if caps.write_rules is not None:
        caps.write_rules(config.metadata, config.blob_tags)
    if config.tier is not None and config.tier not in caps.tiers:
        offered = f"it takes {', '.join(caps.tiers)}" if caps.tiers else "it has no access tiers"
        raise UsageError(f"--block-blob-tier {config.tier}: {where} cannot keep it ({offered})")
    for name in config.properties:
        if name not in caps.properties:
            raise UsageError(f"--{name.replace('_', '-')}: {where} does not keep that property")
    if config.blob_tags and not caps.tags:
        raise UsageError(f"--blob-tags: {where} does not keep tags")
    bad = [k for k in config.metadata if caps.metadata_name is not None and not caps.metadata_name(k)]
    if bad:
        raise UsageError(f"--metadata: {where} does not take the name {bad[0]!r}")


async def run_job(spec: JobSpec, session: Session, config: TransferConfig, *, progress: Progress,
                  hooks: Hooks | None = None, job: JobRow | None = None) -> Report:
    """Run the job `spec` describes with `config`, in `session` (its stores, journal and budgets); `job` is the
    journal's record of the run to resume (None: the journal finds an unfinished one for the same folders)."""
    hooks = hooks or Hooks()
    written = _written(spec)
    if written is not None:
        check_writes(config, session.store(written).capabilities, written.display)
    # Each job's code is imported with its first run: a no-op sync never loads the upload or download code.
    if isinstance(spec, RemoveSpec):
        from blobsync.jobs.remove import RemoveJob

        store = session.store(spec.target)  # rm keeps no journal: it never opens one
        return await RemoveJob(spec, store, session.requests(config, progress), on_action=hooks.on_action).run()
    if isinstance(spec, PutSpec):
        from blobsync.jobs.put import PutJob

        return await PutJob(spec, session.context(spec.dest, config, progress=progress)).run()
    prompt = OverwritePrompt(hooks.confirm_overwrite) if hooks.confirm_overwrite is not None else None
    if isinstance(spec, SyncSpec) and spec.source is not None:
        from blobsync.engine.list_process import flat_lister
        from blobsync.jobs.sync_blobs import BlobSyncJob

        ctx = session.context(spec.remote, config, progress=progress)
        return await BlobSyncJob(spec, ctx, session.store(spec.source), on_action=hooks.on_action,
                                 confirm=hooks.confirm_delete,
                                 source_apart=flat_lister(session, spec.source, ctx.config)).run()
    if isinstance(spec, SyncSpec):
        from blobsync.jobs.sync import SyncJob

        ctx = session.context(spec.remote, config, progress=progress, overwrite_prompt=prompt)
        async with _cluster(hooks, spec.upload, config, spec.dry_run, session.credential_for(spec.remote)) as cluster:
            return await SyncJob(spec, ctx, on_action=hooks.on_action, confirm=hooks.confirm_delete,
                                 cluster=cluster).run()
    from blobsync.jobs.transfer import TransferJob

    remote = spec.source if isinstance(spec, DownloadSpec) else spec.dest
    ctx = session.context(remote, config, progress=progress, overwrite_prompt=prompt)
    source = session.store(spec.source) if isinstance(spec, CopySpec) else None
    async with _cluster(hooks, not isinstance(spec, DownloadSpec), config, spec.dry_run,
                        session.credential_for(remote)) as cluster:
        return await TransferJob(spec, ctx, source, job=job, on_action=hooks.on_action, cluster=cluster).run()


def _written(spec: JobSpec) -> Location | None:
    """The location a job writes to (None: it writes only local files)."""
    if isinstance(spec, UploadSpec | CopySpec | PutSpec):
        return spec.dest
    if isinstance(spec, RemoveSpec):
        return spec.target
    if isinstance(spec, SyncSpec) and spec.upload:
        return spec.remote
    return None


@asynccontextmanager
async def _cluster(hooks: Hooks, upload: bool, config: TransferConfig, dry_run: bool, credential: object
                   ) -> AsyncIterator[RemoteRunner | None]:
    """Where a job's files run (None: this process), opened for the job and closed after it (the caller's
    opener: the cluster sits above the jobs); the workers sign with `credential`, the Client's, where it has one
    for the remote side (never the workers' environment instead)."""
    if hooks.remote is None or dry_run:
        yield None
        return
    if config.overwrite is Overwrite.PROMPT:
        raise UsageError("--overwrite prompt cannot be used with --cluster or --processes: use true, false or "
                         "ifSourceNewer")
    async with hooks.remote(upload, credential) as runner:
        yield runner
