"""Whole-file MD5s on every core (issue 41): 8 files of 256 MiB up to and down from the null server (the client's
cost alone), blobsync with its hash lanes (one per core) and with one hash thread (BLOBSYNC_HASH_THREADS=1, the
engine before), AzCopy with --put-md5 up and --check-md5 FailIfDifferent down in the same run:

    python bench/hash_lanes.py [--files 8] [--mib 256] [--rounds 3]

Each run: a fresh null server, one tool in a child process (wall, its CPU from wait4), tools taking turns. Prints
medians, MB/s and CPU s/GiB, and a model of the rate on 16 and 64 cores from the per-core figures measured here."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness.azurite import NullServer  # noqa: E402
from harness.measure import wall_and_cpu  # noqa: E402
from harness.tools import (  # noqa: E402
    BLOBSYNC_BIN,
    Target,
    _azcopy,
    env_for,
    sas_url,
)
from harness.workloads import small_tree  # noqa: E402

MiB = 1024 * 1024
CONTAINER = "bench-lanes"


def _command(tool: str, op: str, tree: Path, out: Path, target: Target, tmp: Path) -> list[str]:
    url = f"{target.blob_endpoint}/{CONTAINER}"
    journal = ["--journal", str(tmp / f"j-{time.monotonic_ns()}.db")]
    if tool.startswith("blobsync"):
        hash_env = ["env", "BLOBSYNC_HASH_THREADS=1"] if tool == "blobsync-1thread" else []
        if op == "up":
            return [*hash_env, str(BLOBSYNC_BIN), "cp", str(tree), f"{url}/", "-r", "--block-check", "crc64",
                    *journal]
        return [*hash_env, str(BLOBSYNC_BIN), "cp", f"{url}/multi", str(out), "-r", *journal]
    if op == "up":
        return _azcopy("copy", str(tree), sas_url(target, CONTAINER), "--recursive", "--from-to", "LocalBlob",
                       "--put-md5", "--block-size-mb", "8")
    return _azcopy("copy", sas_url(target, CONTAINER, "multi"), str(out), "--recursive", "--from-to", "BlobLocal",
                   "--check-md5", "FailIfDifferent", "--block-size-mb", "8")


def one(tool: str, op: str, tree: Path, files: int, size: int, tmp: Path) -> tuple[float, float]:
    seeds = tuple(f"{CONTAINER}/multi/f{i}.bin:{size}" for i in range(files)) if op == "down" else ()
    work = Path(tempfile.mkdtemp(dir=tmp))
    with NullServer(work, seeds=seeds) as server:
        target = Target(server.blob_endpoint, like_azure=True)
        if op == "up":
            from azure.storage.blob import BlobServiceClient

            BlobServiceClient.from_connection_string(target.connection_string).create_container(CONTAINER)
        out = work / "down"
        out.mkdir()
        return wall_and_cpu(_command(tool, op, tree, out, target, work), env_for(target, work))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "blobsync-bench-cache")
    a = p.parse_args()
    tree = small_tree(a.cache_dir, a.files, a.mib * MiB)
    tools = ("blobsync", "blobsync-1thread", "azcopy")
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="blobsync-lanes-") as tmp:
        for r in range(a.rounds):
            for op in ("up", "down"):
                for tool in tools[r % 3:] + tools[:r % 3]:
                    runs.setdefault((tool, op), []).append(one(tool, op, tree, a.files, a.mib * MiB, Path(tmp)))
                    print(f"round {r + 1} {op} {tool}: {runs[(tool, op)][-1]}", file=sys.stderr, flush=True)
    gib = a.files * a.mib / 1024
    print(f"{a.files} x {a.mib} MiB to the null server, {len(os.sched_getaffinity(0))} cores, medians of {a.rounds}:")
    print("| way | tool | wall s | MB/s | CPU s | CPU s/GiB |")
    print("|---|---|---|---|---|---|")
    for (tool, op), done in runs.items():
        wall, cpu = statistics.median(w for w, _ in done), statistics.median(c for _, c in done)
        print(f"| {op} | {tool} | {wall:.2f} | {gib * 1024 * MiB / 1e6 / wall:.0f} | {cpu:.2f} | {cpu / gib:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
