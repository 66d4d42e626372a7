"""What one task runs on a worker, by name: the one entry both executors (Dask's workers, blobsync's worker
processes) ship by reference; the work it names is imported there, on the worker."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from blobsync.cluster.shards import SplitFile
    from blobsync.cluster.spec import ShardReport
    from blobsync.cluster.work import Publish

SHARD, STAGE, FETCH, MD5, COMMIT, FINISH = "shard", "stage", "fetch", "md5", "commit", "finish"


def run(kind: str, publish: Publish | None, worker: str | None, spec: Any, *rest: Any) -> Any:
    """Task `kind` on `spec` (a ShardSpec, or a RangeSpec of a split file with what its earlier tasks gave), in an
    event loop of its own; `worker` names this worker in the reports (None: host:pid)."""
    from blobsync.cluster import split, work

    if kind == MD5:
        return split.hash_file(spec)
    name = worker or work.worker_name()
    if kind == SHARD:
        return asyncio.run(work.run_shard(spec, publish, name))
    works: dict[str, Callable[..., Coroutine[Any, Any, Any]]] = {
        STAGE: split.stage_range, FETCH: split.fetch_range, COMMIT: split.commit_split, FINISH: split.finish_download}
    return asyncio.run(works[kind](spec, *rest, publish=publish, worker=name))


def split_graph(submit: Callable[..., Any], split: SplitFile, upload: bool, digest: Any = "") -> tuple[list[Any], Any]:
    """The tasks of a file split over workers, as every executor runs them: a task per range (stage, or fetch into
    the shared partial file), then the one task that ends the file (commit, or finish) with the ranges' reports;
    an upload read here is hashed in order by one more task beside the ranges, where the job stores an MD5
    (--put-md5, the default; a copy's MD5 is the source's).
    `submit(kind, *args, n=...)` starts a task whose arguments may be the handles of earlier ones; returns the
    ranges' handles and the last one's. A download's `digest`: the whole MD5 (hex) the client takes as the ranges
    land (an awaitable the finish waits for; "" where the finish checks something else)."""
    whole = split.whole
    # The hash first: it is the longest task (serial, the whole file), and a worker takes it up only when free. Sent
    # after the ranges, it began once they were done: ranges' time plus the hash's, not the larger of the two.
    hashed = upload and not whole.job.source_url and whole.job.options.get("put_md5", True)
    md5 = submit(MD5, whole) if hashed else ""
    parts = [submit(STAGE if upload else FETCH, r, n=r.first) for r in split.ranges]
    if not upload:
        return parts, submit(FINISH, whole, digest, *parts)
    return parts, submit(COMMIT, whole, md5, *parts)


async def gather_split(parts: list[Any], last: Any, on_part: Callable[[ShardReport], None] | None
                       ) -> list[ShardReport]:
    """The reports of a split file's tasks, the ranges' in order (each told to `on_part` as it comes: the client
    learns which blocks are in, whatever its events said), then the last one's."""
    reports = []
    for part in parts:
        reports.append(await part)
        if on_part is not None:
            on_part(reports[-1])
    reports.append(await last)
    return reports
