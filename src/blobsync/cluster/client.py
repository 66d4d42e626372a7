"""A job's transfers run on a cluster, from the client: shards submitted as they are cut (a bounded window in
flight), their outcomes journaled and reported as they come back, progress relayed into the client's display."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from blobsync.backends.base import NO_CONDITIONS, BlobHeaders
from blobsync.cluster.shards import BlockSizer, SplitFile, cut, sizing
from blobsync.cluster.spec import FileOutcome, ShardReport, ShardSpec, WorkerJob, file_nonce
from blobsync.config import Overwrite
from blobsync.engine.blocks import block_count
from blobsync.engine.commit import clear_foreign
from blobsync.engine.context import EngineContext
from blobsync.engine.digest import may_hash_whole, whole_check
from blobsync.engine.download import LandedHash, shared_part
from blobsync.engine.fetching import Refetches
from blobsync.engine.mtime import MTIME_KEY, format_mtime
from blobsync.engine.upload import OCTET_STREAM
from blobsync.errors import BlobsyncError, ExitCode, Scope, TransientError, UsageError
from blobsync.jobs.ops import FileOp, OpKind
from blobsync.jobs.runner import RemoteRunner, Settle, WorkItem
from blobsync.jobs.spec import Processes
from blobsync.journal import RESUMABLE, CommittedBlob, FileRow
from blobsync.local.files import FileIdentity, clamp_ns
from blobsync.local.target import current_boot_id, part_path, safe_join
from blobsync.report import FileResult, FileStatus, Report, ShardRow, blob_url

if TYPE_CHECKING:
    from blobsync.jobs.spec import RemoteOpener

log = logging.getLogger("blobsync")
WATCH = 2.0  # seconds between looks at the cluster while no result comes back
GRACE = 60.0  # seconds with no worker at all before the job stops
REBALANCE = 1.0  # seconds between splits of a --cluster job's cap among its busy workers
LOST_SCHEDULER = ("lost the Dask scheduler or a worker process: the job stops; run the same command again (with "
                  "--cluster or --processes, or without them) to finish it")


class Executor(Protocol):
    """What the client needs of a cluster (the Dask adapter is one): any scheduler that runs the specs' work."""

    async def workers(self) -> list[str]:
        """The workers there are (waiting a little for the first one)."""
        ...

    def worker_count(self) -> int:
        """How many workers the scheduler knows now (no waiting)."""
        ...

    def connected(self) -> bool:
        """Whether the scheduler is still there."""
        ...

    async def blind_workers(self, path: str, marker: str) -> list[str]:
        """The workers that do not see file `marker` (holding its own name) under `path`."""
        ...

    def run_shard(self, spec: ShardSpec) -> Awaitable[ShardReport]: ...

    def run_split(self, split: SplitFile, upload: bool, digest: Any = "",
                  on_part: Callable[[ShardReport], None] | None = None) -> Awaitable[list[ShardReport]]: ...

    def follow(self, topic: str, handler: Callable[[dict[str, Any]], None]) -> None: ...

    async def close(self) -> None: ...


class ClusterTransfer:
    """Runs the files of a job on an Executor instead of the local file pool (JobRunner hands them over)."""

    def __init__(self, executor: Executor, url: str, upload: bool, *, source_url: str = "",
                 grace: float = GRACE, credential: object = None) -> None:
        self.executor = executor
        self.credential = credential  # the Client's, for the remote side: what the workers sign with
        self.url = url  # as the user gave it (a SAS goes to the workers, never to the journal)
        self.upload = upload  # the workers write blobs (uploads and blob-to-blob copies)
        self.source_url = source_url  # a blob-to-blob copy's source, as the user gave it: no local side
        self.grace = grace  # how long the job waits with no worker left before it stops
        self.local_root = Path()
        self.base = Path()  # the folder the user named: downloads follow no link below it
        self._rows: dict[str, FileRow] = {}  # files of the units in flight, by local path
        self._mismatched: dict[str, Refetches] = {}  # split downloads: whole digests that differed from the blob's
        self._hashers: dict[str, LandedHash] = {}  # split downloads checked by the MD5: hashed here as ranges land
        self._settle: Settle = lambda report, row, result: None  # the JobRunner's: it records each outcome

    async def run(self, ctx: EngineContext, job_id: str, local_root: Path, report: Report,
                  items: Iterable[WorkItem], totals: tuple[int, int], settle: Settle, base: Path) -> None:
        self.local_root = local_root
        self.base = base
        self._settle = settle
        workers = await self._workers()
        if not self.source_url:
            await self._check_shared(workers)
        topic = f"blobsync-{job_id}-{uuid.uuid4().hex[:8]}"
        self.executor.follow(topic, lambda event: self._event(ctx, event))
        job = self._job_spec(ctx, job_id, topic, len(workers))
        split = ctx.config.overwrite is Overwrite.TRUE and self._split_pays(ctx)
        sizer = BlockSizer(ctx.config.block_size, ctx.store.capabilities)
        units = cut(self._files(ctx, job_id, items, sizer), job, sizing(*totals, len(workers)),
                    block_size_of=sizer, split=split)
        rebalancing = self._rebalance(ctx, job_id)
        try:
            await self._drain(ctx, report, units, window=max(2, 3 * len(workers)))
        finally:
            if rebalancing is not None:
                rebalancing.cancel()
                await asyncio.gather(rebalancing, return_exceptions=True)

    def _split_pays(self, ctx: EngineContext) -> bool:
        """Whether a file too big for one shard is cut over the workers. Workers of a cluster have cores of their
        own; workers on this machine (--processes) share its cores: one process keeps one busy with its loop, and
        a second with a file's serial MD5 where the job takes one. A split runs beside those and pays only with a
        core more; on fewer it is slower (bench/RESULTS.md), and the file goes whole to one worker."""
        cores = getattr(self.executor, "cores", None)
        if cores is None or self.source_url:
            return True  # a copy's ranges are the service's work
        hashed = ctx.config.put_md5 if self.upload else may_hash_whole(ctx.config.check_md5)
        return int(cores) > (2 if hashed else 1)

    def _rebalance(self, ctx: EngineContext, job_id: str) -> asyncio.Task[None] | None:
        """Where the workers cannot share one bucket (Dask, several machines), the cap is split among those busy
        with the job's tasks, again every REBALANCE seconds: a worker left alone at the end gets all of it."""
        share = getattr(self.executor, "share_cap", None)
        if share is None or not ctx.config.cap_bytes or getattr(self.executor, "cap_state", None) is not None:
            return None
        cap = ctx.config.cap_bytes

        async def every() -> None:
            while True:
                await asyncio.sleep(REBALANCE)
                try:
                    await share(job_id, cap)
                except Exception as exc:  # the next round tries again; the shares stand meanwhile
                    log.debug("cap shares not rebalanced: %s", exc)

        return asyncio.create_task(every())

    async def _workers(self) -> list[str]:
        workers = await self.executor.workers()
        if not workers:
            raise TransientError("the cluster has no workers: start some (dask worker <scheduler>), then run the "
                                 "same command again")
        return workers

    async def _check_shared(self, workers: list[str]) -> None:
        """Every worker must see the local folder as this machine does (NFS, Azure Files, BlobFuse, Lustre)."""
        folder = self.local_root if self.upload or self.local_root.is_dir() else self.local_root.parent
        folder.mkdir(parents=True, exist_ok=True)
        marker = folder / f".blobsync-cluster-{uuid.uuid4().hex}"
        marker.write_text(marker.name, encoding="utf-8")
        try:
            blind = await self.executor.blind_workers(str(folder), marker.name)
        finally:
            marker.unlink(missing_ok=True)
        if blind:
            raise UsageError(f"worker {blind[0]} cannot see {str(folder)!r}"
                             + (f" (nor can {len(blind) - 1} more)" if len(blind) > 1 else ""),
                             hint="the local folder must be the same path on every worker: a shared file system")

    def _job_spec(self, ctx: EngineContext, job_id: str, topic: str, workers: int) -> WorkerJob:
        options = ctx.config.worker_options()
        shared_cap = getattr(self.executor, "cap_state", None)
        if ctx.bandwidth is not None and shared_cap is not None:
            ctx.bandwidth.move_to(shared_cap)  # one bucket in shared memory: every worker draws on the job's cap
        elif ctx.config.cap_mbps:
            options["cap_mbps"] = ctx.config.cap_mbps / workers  # each machine's worker its share of the cap
        if getattr(self.executor, "shares_machine", False):  # one machine's memory budget, shared by its workers
            options["memory"] = max(ctx.config.memory // workers, ctx.config.block_size)
        return WorkerJob(job_id, self.upload, str(self.local_root), self.url, options, ctx.config.proxy, topic,
                         self.source_url, self.credential, str(self.base))

    def _files(self, ctx: EngineContext, job_id: str, items: Iterable[WorkItem], sizer: BlockSizer
               ) -> Iterator[FileOp]:
        for item in items:
            op = item.op
            ctx.progress.queued(op.rel, op.blob, op.size, counted=True)
            self._rows[op.rel] = item.row
            op = replace(op, nonce=file_nonce(job_id, op.rel, op.size, op.mtime_ns))
            if op.kind is OpKind.UPLOAD and op.size > ctx.config.single_put_limit:
                op = replace(op, delta=self._delta_base(ctx, op.blob))
                self._journal_nonce(ctx, item.row, op, sizer(op))
            yield op

    def _delta_base(self, ctx: EngineContext, blob: str) -> CommittedBlob | None:
        """The blob as blobsync last committed it, from this journal: the worker that uploads the file's new version
        sends only the blocks that changed (it checks the blob is still that version first)."""
        if not ctx.store.capabilities.keeps_parts:
            return None
        record = ctx.journal.committed_blob(ctx.store.container_url, blob)
        return record if record is not None and record.blocks else None

    def _journal_nonce(self, ctx: EngineContext, row: FileRow, op: FileOp, block_size: int) -> None:
        """The client's journal keeps the nonce the workers stage under: the same command run later without a
        cluster resumes from the blocks they staged instead of sending the file again."""
        rel, size, nonce = op.rel, op.size, op.nonce
        if row.nonce == nonce:
            return
        try:
            ident = FileIdentity.of(os.stat(self.local_root / rel))
        except OSError:
            return  # the worker that takes the file reports why it cannot be read
        ctx.journal.start_file(row.id, nonce=nonce, block_size=block_size, n_blocks=block_count(size, block_size),
                               size=ident.size, mtime_ns=ident.mtime_ns, inode=ident.inode, reset=True,
                               ctime_ns=ident.ctime_ns)

    async def _drain(self, ctx: EngineContext, report: Report, units: Iterator[ShardSpec | SplitFile],
                     window: int) -> None:
        pending: set[asyncio.Task[tuple[ShardSpec | SplitFile, list[ShardReport] | BaseException]]] = set()
        try:
            for unit in units:
                while len(pending) >= window:
                    pending = await self._collect(ctx, report, pending)
                ctx.journal.flush()  # the unit's nonces are durable before any worker stages under them
                pending.add(asyncio.ensure_future(self._submit(ctx, unit)))
            while pending:
                pending = await self._collect(ctx, report, pending)
        except BaseException:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            raise

    async def _submit(self, ctx: EngineContext, unit: ShardSpec | SplitFile, *, fresh: bool = False
                      ) -> tuple[ShardSpec | SplitFile, list[ShardReport] | BaseException]:
        try:
            if isinstance(unit, ShardSpec):
                return unit, [await self.executor.run_shard(unit)]
            if self.upload:
                await self._clear_left_parts(ctx, unit)
                return unit, await self.executor.run_split(unit, self.upload)
            unit = self._prepare_download(ctx, unit, fresh)
            return unit, await self._run_download(ctx, unit)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being stopped
            return unit, exc  # the scheduler cancelled it (it went away)
        except Exception as exc:  # the unit's files fail with it; _failed decides how far it reaches
            return unit, exc

    async def _clear_left_parts(self, ctx: EngineContext, unit: SplitFile) -> None:
        """Parts another writer left refuse every part of ours: cleared here, once, before the range tasks stage
        (on several workers at once, none of them could clear them without dropping the others' parts)."""
        writer = ctx.store.writer(unit.file.blob, unit.file.nonce)
        await clear_foreign(ctx, writer, BlobHeaders(OCTET_STREAM, None, {}), NO_CONDITIONS)

    def _event(self, ctx: EngineContext, event: dict[str, Any]) -> None:
        """What a worker published: bytes moved, or a split download's range written into the partial file (journaled
        at once, as the plain download journals its ranges: the only record of what a rerun may keep)."""
        if "landed" in event:
            rel = str(event["landed"])
            hasher = self._hashers.get(rel)
            if hasher is not None:
                hasher.landed(int(event["idx"]))
            row = self._rows.get(rel)
            if row is not None:
                boot = event.get("boot")
                ctx.journal.block_done(row.id, int(event["idx"]), int(event["size"]), "", durable=True,
                                       boot=str(boot) if boot is not None else None)
            return
        nbytes = int(event.get("bytes", 0))
        ctx.progress.advanced(str(event.get("shard", "")), nbytes, nbytes)

    async def _run_download(self, ctx: EngineContext, unit: SplitFile) -> list[ShardReport]:
        """A split download's tasks; where its whole check is the MD5, taken here in order as the ranges land
        (engine/download.LandedHash, on a core of its own beside the fetches) and handed to the finish."""
        f = unit.file
        if whole_check(ctx.config.check_md5, f.blob, f.listed()) != "md5":
            return await self.executor.run_split(unit, self.upload)
        size = unit.ranges[0].block_size
        hasher = LandedHash(ctx, safe_join(self.local_root, f.rel), f.size, size, self.base,
                            {i for r in unit.ranges for i in r.done})
        self._hashers[f.rel] = hasher

        def on_part(report: ShardReport) -> None:
            for block in report.blocks:
                hasher.landed(block[0])

        try:
            return await self.executor.run_split(unit, self.upload, hasher.digest, on_part)
        finally:
            self._hashers.pop(f.rel, None)
            await hasher.close()

    def _prepare_download(self, ctx: EngineContext, unit: SplitFile, fresh: bool) -> SplitFile:
        """The shared partial file, sized, before several workers write their ranges into it: the one an earlier run
        of this job left, with the ranges it journaled as written (this boot, or fsynced), where that run fetched
        this very version in these blocks; else a new one, its plan journaled first."""
        f, size = unit.file, unit.ranges[0].block_size
        row, target = self._rows[f.rel], safe_join(self.local_root, f.rel)
        part = part_path(target)
        done: set[int] = set()
        if (not fresh and row.state in RESUMABLE and row.nonce == f.nonce and row.etag == f.etag and f.etag
                and row.block_size == size and os.path.exists(part) and os.path.getsize(part) == f.size):
            boot = current_boot_id()
            done = {b.idx for b in ctx.journal.blocks(row.id) if b.boot is None or b.boot == boot}
        else:
            ctx.journal.start_file(row.id, nonce=f.nonce, block_size=size, n_blocks=block_count(f.size, size),
                                   size=f.size, mtime_ns=f.mtime_ns, inode=0, reset=True, etag=f.etag)
            ctx.journal.flush()
        shared_part(target, f.size, self.base, keep=bool(done)).close()
        if done:
            ctx.progress.advanced(f.rel, sum(min(size, f.size - i * size) for i in done), 0)
        return SplitFile(tuple(replace(r, done=tuple(sorted(i for i in done if r.first <= i < r.last)))
                               for r in unit.ranges))

    async def _collect(self, ctx: EngineContext, report: Report, pending: set[asyncio.Task[Any]]) -> set[Any]:
        alone_since: float | None = None
        while True:
            done, rest = await asyncio.wait(pending, timeout=WATCH, return_when=asyncio.FIRST_COMPLETED)
            if done:
                break
            alone_since = self._watch(alone_since)
        for task in done:
            unit, outcome = task.result()
            files = unit.files if isinstance(unit, ShardSpec) else (unit.file,)
            if isinstance(outcome, BaseException):
                await self._failed(ctx, report, files, outcome)
            elif isinstance(unit, SplitFile) and self._fetch_again(ctx, report, unit, outcome):
                rest.add(asyncio.ensure_future(self._submit(ctx, unit, fresh=True)))  # nothing of it kept
            else:
                self._apply(ctx, report, files, outcome)
        return rest

    def _fetch_again(self, ctx: EngineContext, report: Report, unit: SplitFile, reports: list[ShardReport]) -> bool:
        """A split download whose whole MD5 differed from the blob's is fetched again, as a plain download is,
        until the same bytes come twice (then the stored MD5 is what is wrong, and the file fails)."""
        digest = next((o.digest for r in reports for o in r.outcomes if o.digest), "")
        again = self._mismatched.setdefault(unit.file.rel, Refetches(ctx.config.max_retries))
        if self.upload or not again.after(bytes.fromhex(digest) if digest else None):
            return False
        report.retries += 1
        log.info("%s: the MD5 of the bytes fetched differs from the blob's; fetching it again", unit.file.rel)
        return True

    def _apply(self, ctx: EngineContext, report: Report, files: Iterable[FileOp], reports: list[ShardReport]
               ) -> None:
        by_rel = {f.rel: f for f in files}
        for shard in reports:
            report.shards.append(ShardRow(shard.label, shard.worker, shard.files, shard.bytes, shard.duration,
                                          shard.retries))
            report.retries += shard.retries
            for outcome in shard.outcomes:
                f = by_rel.get(outcome.rel)
                row = self._rows.pop(outcome.rel, None)
                if f is None or row is None:
                    continue
                sent = sum(r.sent for r in reports) if len(by_rel) == 1 else outcome.sent
                self._record(ctx, report, row, f, outcome, sent)

    def _watch(self, alone_since: float | None) -> float | None:
        """Between results: stop the job (resumable) once the scheduler is gone or no worker is left for long."""
        if not self.executor.connected():
            raise TransientError(LOST_SCHEDULER)
        if self.executor.worker_count():
            return None
        now = time.monotonic()
        if alone_since is not None and now - alone_since >= self.grace:
            raise TransientError(f"no Dask worker left for {self.grace:.0f}s: the job stops; run the same command "
                                 "again to finish it")
        return alone_since if alone_since is not None else now

    async def _failed(self, ctx: EngineContext, report: Report, files: Iterable[FileOp], error: BaseException
                      ) -> None:
        if isinstance(error, BlobsyncError) and error.scope is Scope.RUN:
            raise error  # no other shard fares better: bad credentials, a missing container
        if not self.executor.connected() or _lost_cluster(error):
            raise TransientError(f"{LOST_SCHEDULER} ({type(error).__name__})") from error
        reason = f"failed on the cluster after its retries: {type(error).__name__}: {error}"
        log.warning("%s", reason)
        for f in files:
            row = self._rows.pop(f.rel, None)
            if row is None:
                continue
            # The shard failed as a whole, but some of its files may have been completed by a try of it.
            done = await self._completed(ctx, f)
            self._record(ctx, report, row, f, FileOutcome(f.rel, done, 0, "" if done else reason,
                                                          int(ExitCode.PARTIAL)), 0)

    async def _completed(self, ctx: EngineContext, f: FileOp) -> bool:
        """Whether the planned version of `f` is at its destination (an upload verifies before it is visible
        with its source's mtime; a download has its name only once checked, and only its mtime, when it keeps
        the blob's, tells it from an older file of the same size that was there before: without that, no)."""
        if not self.upload:
            target = self.local_root / f.rel
            if not ctx.config.preserve_last_modified_time or not target.is_file():
                return False
            st = target.stat()
            return st.st_size == f.size and clamp_ns(st.st_mtime_ns) == f.mtime_ns
        try:
            props = await ctx.request(lambda: ctx.store.stat(f.blob))
        except BlobsyncError:
            return False
        if props is None or props.size != f.size:
            return False
        if self.source_url:  # a copy carries the source's MD5 (unknown: it cannot be told from an older copy)
            return f.md5 is not None and props.content_md5 == f.md5
        return props.metadata.get(MTIME_KEY) == format_mtime(f.mtime_ns)

    def _record(self, ctx: EngineContext, report: Report, row: FileRow, f: FileOp, outcome: FileOutcome, sent: int
                ) -> None:
        """A file's outcome, recorded as the plain job records it: its result (version, MD5, URL) and, for an upload
        in blocks, the commit record the next run's delta builds on."""
        if outcome.ok and outcome.skipped:
            result = FileResult(f.rel, f.blob, f.size, FileStatus.SKIPPED, reason=outcome.reason)
        elif outcome.ok:
            result = FileResult(f.rel, f.blob, f.size, FileStatus.TRANSFERRED, bytes_sent=sent, reason=outcome.reason,
                                bytes_delta=outcome.delta, etag=outcome.etag or None,
                                content_md5=bytes.fromhex(outcome.md5) if outcome.md5 else None,
                                url=blob_url(ctx.store.container_url, f.blob), bytes_copied=outcome.copied)
            if self.upload and not self.source_url:
                if outcome.commit is not None:
                    ctx.journal.remember_commit(ctx.store.container_url, f.blob, outcome.commit)
                else:
                    ctx.journal.forget_commit(ctx.store.container_url, f.blob)
        else:
            result = FileResult(f.rel, f.blob, f.size, FileStatus.FAILED, reason=outcome.reason,
                                exit_code=ExitCode(outcome.exit_code) if outcome.exit_code else ExitCode.PARTIAL)
        self._settle(report, row, result)


def _lost_cluster(error: BaseException) -> bool:
    """The scheduler (or the connection to it) is gone: no other shard can run either."""
    names = {type(e).__name__ for e in (error, error.__cause__, error.__context__) if e is not None}
    return bool(names & {"CommClosedError", "StreamClosedError", "CancelledError", "FutureCancelledError",
                         "BrokenProcessPool"})


def remote(target: object, url: str, source_url: str = "") -> RemoteOpener:
    """How a job runs its files on `target` (Processes, or a Dask cluster: a distributed.Client, an address,
    'local:N'): `url` is the remote side as the user gave it (SAS included: what the workers open), `source_url` a
    blob-to-blob copy's source."""

    @contextlib.asynccontextmanager
    async def opened(upload: bool, credential: object) -> AsyncIterator[RemoteRunner]:
        _sendable(credential)
        executor: Executor
        if isinstance(target, Processes):
            from blobsync.cluster.processes import ProcessExecutor

            executor = await ProcessExecutor.open(target.count, target.started)
        else:
            from blobsync.cluster.dask_adapter import DaskExecutor

            executor = await DaskExecutor.open(target)
        try:
            yield ClusterTransfer(executor, url, upload, source_url=source_url, credential=credential)
        finally:
            await executor.close()

    return opened


def _sendable(credential: object) -> None:
    """A Client's credential goes to the workers with each task; one that cannot is refused here, before any
    work starts (the workers would otherwise sign with whatever their environment holds)."""
    if credential is None:
        return
    try:
        pickle.dumps(credential)
    except Exception:
        raise UsageError(f"the Client's credential ({type(credential).__name__}) cannot be sent to the workers of "
                         "a cluster or of processes", hint="give the Client a SAS or an account key, or a "
                         "credential that pickles, or run without cluster") from None
