"""The Dask adapter: an Executor over a Dask scheduler (`tcp://host:8786`) or a LocalCluster (`local:N`).

Each shard, range, hash and commit is one Dask task (retried up to twice where it raised; a worker that dies takes
its tasks to another worker, as Dask does); progress comes back as Dask events under the job's topic."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Callable
from typing import Any

from blobsync.cluster import tasks
from blobsync.cluster.shards import SplitFile
from blobsync.cluster.spec import ShardReport, ShardSpec
from blobsync.errors import TransientError, UsageError

log = logging.getLogger("blobsync")
TASK_RETRIES = 2  # a task that raised runs at most three times in all
EXTRA_HINT = "pip install 'blobsync[dask]'"


def require_dask() -> None:
    """--cluster without the extra installed is a usage error naming it."""
    try:
        import distributed  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"--cluster needs Dask distributed, which is not installed: {EXTRA_HINT}") from exc


def _local_workers(where: str) -> int:
    try:
        n = int(where.split(":", 1)[1])
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"invalid --cluster {where!r}: local:N takes a number of workers, e.g. local:4")
    return n


class DaskExecutor:
    """Runs the client's units on Dask workers."""

    # distributed's asynchronous API is typed for its blocking use: held as Any here.
    def __init__(self, client: Any, cluster: Any = None) -> None:
        self.client = client
        self.cluster = cluster

    @classmethod
    async def open(cls, where: str | Any) -> DaskExecutor:
        require_dask()
        import distributed

        client_type: Any = distributed.Client
        if not isinstance(where, str):  # a Client of the caller's: ours talks to the same scheduler
            where = where.scheduler.address
        if where.startswith("local:"):
            local_type: Any = distributed.LocalCluster
            # No dashboard, and the scheduler's HTTP routes on a free port: a second local cluster (another job
            # here) must not find 8787 taken and warn about it. Its workers share our stderr: a task's failure
            # (Dask logs "Compute Failed" with a traceback at ERROR) reaches the user as the job's one line.
            cluster = await local_type(n_workers=_local_workers(where), processes=True, threads_per_worker=1,
                                         asynchronous=True, dashboard_address=None, silence_logs=logging.CRITICAL,
                                         scheduler_kwargs={"dashboard_address": ":0"})
            return cls(await client_type(cluster, asynchronous=True), cluster)
        try:
            client = await client_type(where, asynchronous=True, timeout=10)
        except (TimeoutError, OSError) as exc:
            raise TransientError(f"cannot reach the Dask scheduler at {where}: {exc}") from exc
        return cls(client)

    async def workers(self) -> list[str]:
        if not self.worker_count():
            with contextlib.suppress(TimeoutError):
                await self.client.wait_for_workers(1, timeout=30)
        identity = await self.client.scheduler.identity(n_workers=-1)
        return sorted(identity.get("workers", {}))

    def worker_count(self) -> int:
        """From the client's cache, which the scheduler keeps current (an asynchronous client's cache carries
        the totals, not the workers)."""
        return int(self.client.scheduler_info().get("n_workers", 0))

    def connected(self) -> bool:
        return bool(self.client.status == "running")

    async def blind_workers(self, path: str, marker: str) -> list[str]:
        seen = await self.client.run(_sees, path, marker, on_error="return")
        return sorted(worker for worker, ok in seen.items() if ok is not True)

    def run_shard(self, spec: ShardSpec) -> Any:
        return self._submit(tasks.SHARD, spec, n=spec.shard)

    def _submit(self, kind: str, spec: Any, *rest: Any, n: int | None = None) -> Any:
        return self.client.submit(_task, kind, spec, *rest, key=_key(kind, n), retries=TASK_RETRIES, pure=False)

    async def run_split(self, split: SplitFile, upload: bool, digest: Any = "",
                        on_part: Callable[[ShardReport], None] | None = None) -> list[ShardReport]:
        def submit(kind: str, spec: Any, *rest: Any, n: int | None = None) -> Any:
            if any(isinstance(a, asyncio.Future) for a in rest):  # a value the client is still making
                return asyncio.ensure_future(self._submit_after(kind, spec, *rest, n=n))
            return self._submit(kind, spec, *rest, n=n)

        parts, last = tasks.split_graph(submit, split, upload, digest)  # Dask passes each task its inputs' results
        # One await per future, not client.gather: a cancelled gather leaves Dask tasks that later fail unseen
        # (AllExit tracebacks on stderr when the user stops the job).
        try:
            return await tasks.gather_split(parts, last, on_part)
        finally:
            if isinstance(last, asyncio.Future) and not last.done():
                last.cancel()
                await asyncio.gather(last, return_exceptions=True)

    async def _submit_after(self, kind: str, spec: Any, *rest: Any, n: int | None = None) -> Any:
        """The task submitted once the client's own values among its arguments are made."""
        resolved = [await a if isinstance(a, asyncio.Future) else a for a in rest]
        return await self._submit(kind, spec, *resolved, n=n)

    async def share_cap(self, job: str, cap_bytes: float) -> None:
        """The job's cap split among the workers running tasks now (each its equal share), so a worker that alone
        still works gets the whole cap, not 1/N of it; an idle one goes back to 1/N of it, what a task it takes
        next may draw until the next split (the cap is then exceeded by at most that share, for one period)."""
        processing = await self.client.processing()
        busy = sorted(worker for worker, keys in processing.items() if keys)
        idle = sorted(worker for worker in processing if worker not in busy)
        if busy:
            await self.client.run(_set_share, job, cap_bytes / len(busy), workers=busy, on_error="ignore")
        if idle:
            await self.client.run(_set_share, job, cap_bytes / len(processing), workers=idle, on_error="ignore")

    def follow(self, topic: str, handler: Callable[[dict[str, Any]], None]) -> None:
        self.client.subscribe_topic(topic, lambda event: handler(event[1]))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.close(), 10)
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.cluster.close(), 20)


def _key(kind: str, n: int | None = None) -> str:
    return f"blobsync-{kind}-{'' if n is None else f'{n}-'}{uuid.uuid4().hex[:12]}"


# --- what runs on a worker (module level: Dask ships these by reference) ------------------------------------


def _sees(path: str, marker: str) -> bool:
    try:
        with open(os.path.join(path, marker), encoding="utf-8") as f:
            return f.read() == marker
    except OSError:
        return False


def _set_share(job: str, rate: float) -> None:
    from blobsync.cluster.work import MACHINE_CAP

    MACHINE_CAP.set_share(job, rate)


def _task(kind: str, spec: Any, *rest: Any) -> Any:
    from distributed import get_worker

    from blobsync.cluster.tasks import run

    worker = get_worker()
    return run(kind, lambda msg: worker.log_event(spec.job.topic, msg), str(worker.address), spec, *rest)
