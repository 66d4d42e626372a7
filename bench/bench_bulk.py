"""Bulk operations on many small blobs: rm -r with Blob Batch vs one request per blob, and the peak RSS of rm -r,
cp -r down and a sync that deletes them all, at several counts (RSS should not grow with the count).

    python bench/bench_bulk.py [--counts 2000,10000] [--ops rm,down,sync] [--out FILE]

Each count gets a fresh in-memory Azurite, filled by an upload of a tree of 1-byte files (blobsync cp -r); every
measured command runs under the wait4 launcher (exact peak RSS and CPU) and is checked by listing afterwards.
Azurite runs on the same 2 cores: its CPU is reported beside each figure, and it bounds the delete rates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.azurite import Azurite
from harness.measure import run_measured
from harness.tools import VENV_PYTHON


def tree(root: Path, count: int) -> Path:
    """`count` 1-byte files in folders of 1,000 (made once per count, kept in the temp dir)."""
    for i in range(count):
        folder = root / f"d{i // 1000:04d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:07d}.bin").write_bytes(b"x")
    return root


def blobsync(env: dict[str, str], tmp: Path, name: str, *args: str, timeout: float = 3600) -> dict[str, float]:
    log = tmp / f"{name}.log"
    res = run_measured([str(VENV_PYTHON), "-m", "blobsync", *args, "--quiet"], env, tmp, log, timeout)
    if res.returncode != 0:
        raise SystemExit(f"{name} failed ({res.returncode}):\n{log.read_text()[-2000:]}")
    return {"wall_s": round(res.wall_s, 2), "cpu_s": round(res.user_s + res.sys_s, 2),
            "peak_rss_mib": round(res.maxrss_kib / 1024, 1)}


def count_blobs(az: Azurite, container: str) -> int:
    from azure.storage.blob import ContainerClient

    client = ContainerClient.from_connection_string(az.connection_string, container)
    return sum(1 for _ in client.list_blobs())


def one_count(count: int, tmp: Path, ops: set[str]) -> dict[str, object]:
    src = tree(tmp / f"tree{count}", count)
    empty = tmp / "empty"
    (empty / "keep").mkdir(parents=True, exist_ok=True)
    (empty / "keep" / "one.bin").write_bytes(b"k")
    figures: dict[str, object] = {"count": count}
    (tmp / f"az{count}").mkdir()
    with Azurite(tmp / f"az{count}") as az:
        env = {**os.environ, "AZURE_STORAGE_CONNECTION_STRING": az.connection_string}
        url = f"{az.blob_endpoint}/bulk"
        journal = str(tmp / f"j{count}.db")

        def fill() -> None:
            blobsync(env, tmp, "fill", "cp", "-r", str(src), url, "--create-container", "--journal", journal)
            assert count_blobs(az, "bulk") == count

        for label, extra in (("rm -r, Blob Batch", {}), ("rm -r, one request per blob", {"BLOBSYNC_BLOB_BATCH": "0"})):
            if "rm" not in ops:
                break
            fill()
            cpu0 = az.cpu_seconds()
            figures[label] = blobsync({**env, **extra}, tmp, "rm", "rm", "-r", url)
            figures[label]["azurite_cpu_s"] = round(az.cpu_seconds() - cpu0, 2)  # type: ignore[index]
            assert count_blobs(az, "bulk") == 0
        if ops & {"down", "sync"}:
            fill()
        if "down" in ops:
            down = tmp / f"down{count}"
            figures["cp -r down"] = blobsync(env, tmp, "down", "cp", "-r", url, str(down), "--journal", journal)
            assert sum(1 for p in down.rglob("*.bin")) == count
        if "sync" in ops:
            figures["sync deleting all but one"] = blobsync(
                env, tmp, "sync", "sync", str(empty), url, "--delete-destination", "true", "--journal", journal)
            assert count_blobs(az, "bulk") == 1
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", default="2000,10000", help="comma-separated blob counts")
    parser.add_argument("--ops", default="rm,down,sync", help="which of rm, down, sync to measure")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="blobsync-bulk-") as tmp:
        for count in (int(c) for c in args.counts.split(",")):
            t0 = time.monotonic()
            results.append(one_count(count, Path(tmp), set(args.ops.split(","))))
            print(json.dumps(results[-1]), f"({time.monotonic() - t0:.0f} s)", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
