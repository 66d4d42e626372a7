"""Delta upload: a 1 GiB file with 1% of its blocks changed, synced as a delta against a plain re-upload."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_upload import DEFAULT_CACHE, REPO, Azurite, large_workload, run_measured, wait_for_quiet

BLOBSYNC = REPO / ".venv" / "bin" / "blobsync"
MiB = 1 << 20


def _sync(src: Path, url: str, journal: Path, tmp: Path, block_mb: float, name: str) -> dict[str, float]:
    cmd = [str(BLOBSYNC), "sync", str(src), url, "--create-container", "--output-type", "json",
           "--journal", str(journal), "--block-size-mb", f"{block_mb:g}"]
    log = tmp / f"{name}.log"
    r = run_measured(cmd, dict(os.environ), tmp, log, 900)
    out = log.read_text()
    if r.returncode != 0:
        raise SystemExit(f"blobsync failed ({name}):\n{out[-2000:]}")
    summary = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return {"wall": r.wall_s, "cpu": r.user_s + r.sys_s, "sent": summary["bytes_sent"],
            "delta": summary["bytes_delta"]}


def one_run(delta: bool, cached: Path, block_mb: float, pct: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=cached.parent) as tmpdir:
        tmp = Path(tmpdir)
        src = tmp / "src"
        src.mkdir()
        path = src / "model.pt"
        shutil.copyfile(cached, path)
        az = Azurite(tmp)
        az.start()
        try:
            url = f"{az.blob_endpoint}/bench"
            wait_for_quiet(0.25, 60)
            _sync(src, url, tmp / "j.db", tmp, block_mb, "v1")
            block = int(block_mb * MiB)
            n = -(-path.stat().st_size // block)
            changed = max(1, round(n * pct / 100))
            with open(path, "r+b") as f:  # one byte per chosen block, spread over the file, in place
                for i in range(changed):
                    offset = (i * n // changed) * block + 4096
                    f.seek(offset)
                    byte = f.read(1)
                    f.seek(offset)
                    f.write(bytes([byte[0] ^ 0xFF]))
            time.sleep(0.01)  # a later mtime than the stored one, whatever the clock's resolution
            os.utime(path)
            # The plain re-upload forgets the journal's block memory (a fresh journal): a full upload.
            journal = tmp / ("j.db" if delta else "fresh.db")
            wait_for_quiet(0.25, 60)
            result = _sync(src, url, journal, tmp, block_mb, "v2")
            result["changed_blocks"] = changed
            result["blocks"] = n
            result["azurite_cpu"] = az.cpu_seconds()
            return result
        finally:
            az.stop()


def hash_cost(path: Path, block_mb: float) -> tuple[float, float]:
    """CPU seconds of MD5 and of xxh3-128 over the file in blocks (page-cached), as the reader thread does."""
    block = int(block_mb * MiB)
    md5_s = xxh_s = 0.0
    with open(path, "rb", buffering=0) as f:
        while data := f.read(block):
            t0 = time.process_time()
            hashlib.md5(data).digest()
            t1 = time.process_time()
            xxhash.xxh3_128_digest(data)
            xxh_s += time.process_time() - t1
            md5_s += t1 - t0
    return md5_s, xxh_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--block-size-mb", type=float, default=4.0)
    parser.add_argument("--pct", type=float, default=1.0, help="share of blocks changed (default 1)")
    args = parser.parse_args()
    cached = large_workload(DEFAULT_CACHE, 1024).src
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for rnd in range(args.repeat):
        for delta in ((True, False) if rnd % 2 == 0 else (False, True)):
            runs[delta].append(one_run(delta, cached, args.block_size_mb, args.pct))
            print(f"bench: round {rnd + 1} {'delta' if delta else 'plain'}: {runs[delta][-1]}", file=sys.stderr)
    md5_s, xxh_s = hash_cost(cached, args.block_size_mb)
    first = runs[True][0]
    print(f"1 GiB file, {args.block_size_mb:g} MiB blocks, {first['changed_blocks']:.0f} of {first['blocks']:.0f} "
          f"blocks changed; second sync timed; fresh Azurite per run; {args.repeat} run(s) each, medians "
          "(partly server-bound: Azurite shares the 2 cores):\n")
    print("| Second sync | Wall s | Client CPU s | MiB sent | MiB reused by delta | Azurite CPU s (whole run) |\n"
          "|---|---|---|---|---|---|")
    med = {}
    for label, key in (("delta", True), ("plain re-upload", False)):
        med[key] = {k: statistics.median(r[k] for r in runs[key]) for k in ("wall", "cpu", "sent", "delta",
                                                                              "azurite_cpu")}
        m = med[key]
        print(f"| {label} | {m['wall']:.2f} | {m['cpu']:.2f} | {m['sent'] / MiB:.0f} | {m['delta'] / MiB:.0f} | "
              f"{m['azurite_cpu']:.1f} |")
    print(f"\ndelta / plain: wall {med[True]['wall'] / med[False]['wall']:.2f}x, bytes sent "
          f"{med[True]['sent'] / med[False]['sent']:.3f}x")
    print(f"per-block hashing over 1 GiB (client CPU, page-cached): MD5 {md5_s:.2f} s, xxh3-128 {xxh_s:.3f} s "
          f"({100 * xxh_s / md5_s:.1f}% of the MD5 the reader computes anyway)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
