"""The sync comparison alone (no server, no peer): N local vs N remote synthetic entries through the real index
and decide(); time and peak RSS."""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from blobsync.jobs.compare import CompareMode, decide
from blobsync.journal.index import Entry, SyncIndex


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def entries(n: int, *, remote: bool, changed_every: int) -> Iterator[Entry]:
    # Realistic shapes: nested folders, names of a few dozen characters; every k-th file differs in size.
    for i in range(n):
        rel = f"dataset/shard-{i % 1000:04d}/part-{i:09d}.parquet"
        size = 1_000_000 + i % 997 + (1 if remote and changed_every and i % changed_every == 0 else 0)
        mtime = 1_700_000_000_000_000_000 + i * 1_000
        yield Entry(rel, size, mtime, True, b"\x01" * 16 if remote else None, '"0x8D"' if remote else None,
                    f"prefix/{rel}" if remote else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=1_000_000, help="entries per side (default 1,000,000)")
    parser.add_argument("--changed-every", type=int, default=1000, help="every k-th file differs (default 1000)")
    args = parser.parse_args()
    start_rss = rss_mib()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        index = SyncIndex(Path(tmp))
        index.add("src", entries(args.entries, remote=False, changed_every=args.changed_every))
        t1 = time.perf_counter()
        index.add("dst", entries(args.entries, remote=True, changed_every=args.changed_every))
        t2 = time.perf_counter()
        todo = sum(1 for src, dst in index.pairs() if decide(src, dst, CompareMode.SIZE_AND_MTIME).transfer)
        t3 = time.perf_counter()
        index.close()
    print(f"entries per side: {args.entries:,}; to transfer: {todo:,}")
    print(f"index local: {t1 - t0:.1f}s, index remote: {t2 - t1:.1f}s, compare: {t3 - t2:.1f}s, "
          f"total {t3 - t0:.1f}s")
    print(f"peak RSS: {rss_mib():.0f} MiB (interpreter and imports before the run: {start_rss:.0f} MiB)")


if __name__ == "__main__":
    main()
