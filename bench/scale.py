"""Syncs at scale (issue 52): a no-op sync of N objects against the synthetic listing service, blobsync beside
AzCopy and rclone in the same run; wall time, peak RSS and client CPU of each.

    python bench/scale.py [--objects 1000000] [--folders 1000] [--latency-ms 50] [--rounds 1]
                          [--ways b2b,up,down,dry] [--tools blobsync,rclone,azcopy]

The service (bench/harness/listserver.py) holds the same generated blobs in every container, so `b2b` (container
to container), `up` (a local twin made with the same names, sizes and mtime, cached in --cache-dir) and `down` are
no-ops for every tool: what is measured is listing both sides and comparing them. `dry` is blobsync's `--dry-run`
of the blob-to-blob sync. Peak RSS is the tool process's high-water mark (wait4); CPU is the tool's, children
included. One fresh service per run; tools take turns in an order that rotates each round; medians."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))  # appended: bench/profile.py must not shadow the stdlib's
from harness.azurite import ListServer  # noqa: E402
from harness.listserver import make_tree  # noqa: E402
from harness.tools import BLOBSYNC_BIN, Target, _azcopy, env_for, rclone_config, sas_url  # noqa: E402

TOOLS = ("blobsync", "rclone", "azcopy")


def _command(tool: str, way: str, target: Target, tree: Path, tmp: Path) -> list[str]:
    src, dst = f"{target.blob_endpoint}/src", f"{target.blob_endpoint}/dst"
    if tool == "blobsync":
        tail = ["--journal", str(tmp / "journal.db"), "--output-type", "json"]
        pair = {"b2b": [src, dst], "dry": [src, dst], "up": [str(tree), dst], "down": [src, str(tree)]}[way]
        return [str(BLOBSYNC_BIN), "sync", *pair, *tail, *(["--dry-run"] if way == "dry" else [])]
    if tool == "rclone":
        pair = {"b2b": ["az:src", "az:dst"], "up": [str(tree), "az:dst"], "down": ["az:src", str(tree)]}[way]
        return ["rclone", "--config", str(rclone_config(target, tmp)), "sync", *pair, "--retries", "1"]
    pair = {"b2b": [sas_url(target, "src"), sas_url(target, "dst")], "up": [str(tree), sas_url(target, "dst")],
            "down": [sas_url(target, "src"), str(tree)]}[way]
    from_to = {"b2b": "BlobBlob", "up": "LocalBlob", "down": "BlobLocal"}[way]  # emulator URLs: say it
    return _azcopy("sync", *pair, "--recursive", "--delete-destination", "false", "--from-to", from_to)


def run_one(tool: str, way: str, a: argparse.Namespace, tree: Path, tmp: Path) -> tuple[float, float, float]:
    work = Path(tempfile.mkdtemp(dir=tmp))
    try:
        with ListServer(work, a.objects, a.folders, a.latency_ms) as server:
            target = Target(server.blob_endpoint, like_azure=True)
            cmd = _command(tool, way, target, tree, work)
            env = env_for(target, work)
            started = time.perf_counter()
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            try:
                assert proc.stdout is not None
                err = proc.stdout.read()
                _, status, usage = os.wait4(proc.pid, 0)
            finally:
                if proc.returncode is None and proc.poll() is None:
                    proc.kill()
            wall = time.perf_counter() - started
            if os.waitstatus_to_exitcode(status):
                raise RuntimeError(f"{tool} {way} failed: {err.decode(errors='replace')[-1500:]}")
            return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024
    finally:
        shutil.rmtree(work, ignore_errors=True)


def local_tree(cache: Path, objects: int, folders: int) -> Path:
    tree = cache / f"scale-tree-{objects}-{folders}"
    done = tree / ".complete"
    if not done.exists():
        shutil.rmtree(tree, ignore_errors=True)
        print(f"making the local twin of {objects:,} files in {tree} ...", file=sys.stderr, flush=True)
        make_tree(tree / "t", objects, folders)
        done.touch()
    return tree / "t"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--objects", type=int, default=1_000_000)
    p.add_argument("--folders", type=int, default=1000)
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--ways", default="b2b,up,down,dry")
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "blobsync-bench-cache")
    a = p.parse_args()
    tools, ways = a.tools.split(","), a.ways.split(",")
    tree = local_tree(a.cache_dir, a.objects, a.folders) if {"up", "down"} & set(ways) else Path()
    runs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="blobsync-scale-") as tmp:
        for r in range(a.rounds):
            for way in ways:
                for tool in tools[r % len(tools):] + tools[:r % len(tools)]:
                    if way == "dry" and tool != "blobsync":
                        continue
                    got = run_one(tool, way, a, tree, Path(tmp))
                    runs.setdefault((tool, way), []).append(got)
                    print(f"round {r + 1} {way} {tool}: wall {got[0]:.1f} s, CPU {got[1]:.1f} s, "
                          f"peak RSS {got[2]:.0f} MiB", file=sys.stderr, flush=True)
    print(f"No-op sync of {a.objects:,} objects in {a.folders:,} folders, list pages after {a.latency_ms:g} ms, "
          f"medians of {a.rounds}:\n")
    print("| way | tool | wall s | client CPU s | peak RSS MiB | bytes of RSS per object |")
    print("|---|---|---|---|---|---|")
    for (tool, way), done in sorted(runs.items(), key=lambda kv: (ways.index(kv[0][1]), tools.index(kv[0][0]))):
        wall, cpu, rss = (statistics.median(x[i] for x in done) for i in range(3))
        print(f"| {way} | {tool} | {wall:.1f} | {cpu:.1f} | {rss:.0f} | {rss * 1048576 / a.objects:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
