"""The client's planning cost for a job run on a cluster, per file: index, compare, journal, cut into shards.

    python bench/cluster_plan.py --files 1000000 10000000 [--workers 32]

For each count N it builds what a `sync --cluster` of N new files builds on the client, with the real code: the
files' entries go into the SQLite scratch index (as the local walk puts them; the walk's own stat() calls are not
in it: see RESULTS.md for those), every one is compared with an empty destination and marked, journaled as a file
row of the job, turned into its FileOp (with its nonce), and cut into shards that are pickled as they would be
sent to the scheduler (then dropped: no cluster is needed). It prints seconds, peak RSS and shard figures, one
markdown row per N. Each N runs in a fresh process so the peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))


def plan(n: int, workers: int) -> dict[str, float]:
    from blobsync.backends.base import Capabilities
    from blobsync.cluster.shards import BlockSizer, cut, sizing
    from blobsync.cluster.spec import ShardSpec, WorkerJob, file_nonce
    from blobsync.jobs.ops import FileOp, OpKind
    from blobsync.jobs.runner import batches
    from blobsync.journal import JobKind, Journal
    from blobsync.journal.index import Entry, SyncIndex

    size = 1024 * 1024  # 1 MiB a file: 10^8 files of it is the 100 TB job of the model
    with tempfile.TemporaryDirectory(prefix="blobsync-plan-") as tmp:
        started = time.monotonic()
        index = SyncIndex(Path(tmp))
        for first in range(0, n, 5000):
            index.add("src", [Entry(f"d{i // 1000:05d}/f{i:08d}.bin", size, 1_700_000_000_000_000_000 + i)
                              for i in range(first, min(n, first + 5000))])
        indexed = time.monotonic()
        batch: list[tuple[str, str]] = []
        for src, _ in index.pairs():
            batch.append((src.rel, "new"))
            if len(batch) >= 5000:
                index.mark(batch)
                batch = []
        index.mark(batch)
        compared = time.monotonic()
        journal = Journal(Path(tmp) / "j.db")
        job = journal.create_job(JobKind.SYNC_UP, "/src", "memory://c", {})
        spec = WorkerJob(job.id, True, "/src", "memory://c", {})

        def files() -> object:
            for rows_batch in batches(index.todo()):
                rows = journal.add_files(job.id, ((e.rel, e.rel, e.size, e.mtime_ns, 0) for e, _ in rows_batch))
                for e, _ in rows_batch:
                    assert rows[e.rel].id
                    yield FileOp(OpKind.UPLOAD, e.rel, e.rel, e.size, e.mtime_ns,
                                 nonce=file_nonce(job.id, e.rel, e.size, e.mtime_ns))

        shards = 0
        largest = 0
        sizer = BlockSizer(8 * 1024 * 1024, Capabilities())
        for unit in cut(files(), spec, sizing(n, n * size, workers), block_size_of=sizer,
                        split=True):
            assert isinstance(unit, ShardSpec)
            largest = max(largest, len(pickle.dumps(unit)))
            shards += 1
        journal.flush()
        done = time.monotonic()
        journal.close()
        index.close()
    return {"files": n, "index_s": indexed - started, "compare_s": compared - indexed, "plan_s": done - compared,
            "total_s": done - started, "us_per_file": (done - started) / n * 1e6, "shards": shards,
            "largest_shard_kib": largest / 1024,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child: one count, JSON out
    a = p.parse_args()
    if a.one:
        print(json.dumps(plan(a.one, a.workers)))
        return
    print(f"command: python bench/cluster_plan.py --files {' '.join(map(str, a.files))} --workers {a.workers}")
    print("| files | index s | compare s | journal + cut s | total s | µs/file | shards | largest shard KiB | "
          "peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in a.files:
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--workers", str(a.workers)],
                             capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        r = json.loads(out.stdout)
        print(f"| {r['files']:,} | {r['index_s']:.1f} | {r['compare_s']:.1f} | {r['plan_s']:.1f} | "
              f"{r['total_s']:.1f} | {r['us_per_file']:.1f} | {r['shards']:,} | {r['largest_shard_kib']:.0f} | "
              f"{r['peak_rss_mib']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
