"""Client.read_into of 1 GiB into memory: two source trees of blobsync, A/B in one Azurite, alternating.

    git worktree add /tmp/base <rev>
    python bench/read_into_ab.py /tmp/base/src src [--rounds 5]

Each run is a child process (import and session included in its CPU): two reads of the same 1 GiB blob into one
buffer, the faster counted. Prints per tree the median wall time of a read and the client CPU of the two reads."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.azurite import Azurite

CHILD = r'''
import os, resource, sys, time
sys.path.insert(0, sys.argv[1])
import blobsync
with blobsync.Client(sys.argv[2], blobsync.TransferConfig(journal_path=os.path.join(sys.argv[3], "j.db"))) as c:
    buf = bytearray(1 << 30)
    walls = []
    for _ in range(2):
        t = time.perf_counter()
        c.read_into("big.bin", buf)
        walls.append(time.perf_counter() - t)
r = resource.getrusage(resource.RUSAGE_SELF)
print(f"{min(walls):.3f} {r.ru_utime + r.ru_stime:.2f}")
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, help="two src/ folders (base, then candidate)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Azurite(Path(tmp)) as az:
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(az.connection_string).create_container("bench")
        url = f"{az.blob_endpoint}/bench"
        env = {**os.environ, "AZURE_STORAGE_CONNECTION_STRING": az.connection_string}
        seed = (f"import os, sys; sys.path.insert(0, {args.trees[1]!r}); import blobsync; "
                f"c = blobsync.Client({url!r}, blobsync.TransferConfig(journal_path={tmp + '/up.db'!r})); "
                "c.put(os.urandom(1 << 30), 'big.bin'); c.close()")
        subprocess.run([sys.executable, "-c", seed], env=env, check=True)
        runs: dict[str, list[tuple[float, float]]] = {tree: [] for tree in args.trees}
        for _ in range(args.rounds):
            for tree in args.trees:
                done = subprocess.run([sys.executable, "-c", CHILD, tree, url, tmp], env=env, capture_output=True,
                                      text=True, check=True)
                wall, cpu = map(float, done.stdout.split())
                runs[tree].append((wall, cpu))
    for tree, got in runs.items():
        print(f"{tree}: read {statistics.median(w for w, _ in got):.3f} s (runs {[w for w, _ in got]}), "
              f"client CPU of two reads {statistics.median(c for _, c in got):.2f} s")


if __name__ == "__main__":
    main()
