"""What one task runs on a worker, by name: the one entry both executors (Dask's workers, blobsync's worker
processes) ship by reference; the work it names is imported there, on the worker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from blobsync.cluster.work import Publish

SHARD, STAGE, FETCH, MD5, COMMIT, FINISH = "shard", "stage", "fetch", "md5", "commit", "finish"


def run(kind: str, publish: Publish | None, worker: str | None, spec: Any, *rest: Any) -> Any:
    """Task `kind` on `spec` (a ShardSpec, or a RangeSpec of a split file with what its earlier tasks gave)."""
    if kind == SHARD:
        from blobsync.cluster.work import run_shard

        return run_shard(spec, publish, worker)
    from blobsync.cluster import split

    if kind == MD5:
        return split.hash_file(spec)
    works: dict[str, Callable[..., Any]] = {STAGE: split.stage_range, FETCH: split.fetch_range,
                                            COMMIT: split.commit_split, FINISH: split.finish_download}
    return works[kind](spec, *rest, publish=publish, worker=worker)
