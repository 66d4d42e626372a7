"""One large file up to and down from the null server (the client's cost alone; issue 53): wall, client CPU and
CPU per GiB of blobsync (with and without the whole-file MD5, one process and `--processes N`) beside AzCopy and
rclone in the same run.

    python bench/large_file.py [--mib 1024] [--rounds 3] [--ways up,up-md5,down,down-md5] [--tools ...]
                               [--taskset 0 | 0,1] [--server-processes N]

Each run: a fresh null server, one tool in a child process (wall, its CPU from wait4; the server's CPU beside it, the
share of the machine the tool did not have), tools taking turns in an order
that rotates each round. `--taskset` pins the tool (not the null server) to those cores: the scaling from 1 to 2
cores. Prints medians."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness.azurite import NullServer  # noqa: E402
from harness.measure import wall_and_cpu  # noqa: E402
from harness.tools import BLOBSYNC_BIN, Target, _azcopy, env_for, rclone_config, sas_url  # noqa: E402
from harness.workloads import large_file, warm  # noqa: E402

MiB = 1024 * 1024
CONTAINER = "bench-large"
TOOLS = ("blobsync", "blobsync-p2", "azcopy", "rclone")


def _blobsync(tool: str, way: str, src: Path, out: Path, target: Target, tmp: Path) -> list[str]:
    url = f"{target.blob_endpoint}/{CONTAINER}"
    extra = ["--journal", str(tmp / f"j-{time.monotonic_ns()}.db")]
    if tool.startswith("blobsync-p"):
        extra += ["--processes", tool.removeprefix("blobsync-p")]
    if way.startswith("up"):
        md5 = [] if way == "up-md5" else ["--no-put-md5"]
        return [str(BLOBSYNC_BIN), "cp", str(src), f"{url}/", "--block-check", "crc64", *md5, *extra]
    check = ["--check-md5", "FailIfDifferent"] if way == "down-md5" else ["--check-md5", "NoCheck"]
    return [str(BLOBSYNC_BIN), "cp", f"{url}/big.bin", str(out / "big.bin"), *check, *extra]


def _rclone(way: str, src: Path, out: Path, target: Target, tmp: Path) -> list[str]:
    # One file's blocks on 16 streams each way (rclone's own multi-part concurrency for one file).
    common = ["rclone", "--config", str(rclone_config(target, tmp)), "--azureblob-chunk-size", "8Mi",
              "--azureblob-upload-concurrency", "16", "--multi-thread-streams", "16", "--multi-thread-cutoff", "8Mi"]
    if way.startswith("up"):  # rclone always stores the MD5 it computes of a file it uploads
        return [*common, "copyto", str(src), f"az:{CONTAINER}/big.bin"]
    return [*common, "copyto", f"az:{CONTAINER}/big.bin", str(out / "big.bin"),
            *([] if way == "down-md5" else ["--ignore-checksum"])]


def _command(tool: str, way: str, src: Path, out: Path, target: Target, tmp: Path) -> list[str]:
    if tool.startswith("blobsync"):
        return _blobsync(tool, way, src, out, target, tmp)
    if tool == "rclone":
        return _rclone(way, src, out, target, tmp)
    if way.startswith("up"):
        return _azcopy("copy", str(src), sas_url(target, CONTAINER, "big.bin"), "--from-to", "LocalBlob",
                       "--block-size-mb", "8", *(["--put-md5"] if way == "up-md5" else []))
    return _azcopy("copy", sas_url(target, CONTAINER, "big.bin"), str(out / "big.bin"), "--from-to", "BlobLocal",
                   "--block-size-mb", "8", "--check-md5", "FailIfDifferent" if way == "down-md5" else "NoCheck")


def one(tool: str, way: str, src: Path, size: int, tmp: Path, cores: str | None, servers: int = 1
        ) -> tuple[float, float, float]:
    """Wall, the tool's CPU and the null server's CPU of one run."""
    seeds = (f"{CONTAINER}/big.bin:{size}",) if way.startswith("down") else ()
    work = Path(tempfile.mkdtemp(dir=tmp))
    try:
        with NullServer(work, seeds=seeds, processes=servers) as server:
            target = Target(server.blob_endpoint, like_azure=True)
            out = work / "down"
            out.mkdir()
            cmd = _command(tool, way, src, out, target, work)
            before = server.cpu_seconds()
            wall, cpu = wall_and_cpu(["taskset", "-c", cores, *cmd] if cores else cmd, env_for(target, work))
            return wall, cpu, server.cpu_seconds() - before
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ways", default="up,up-md5,down,down-md5")
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--taskset", default=None, help="cores for the tool (taskset -c), e.g. 0 or 0,1")
    p.add_argument("--server-processes", type=int, default=1,
                   help="null server processes sharing the port (one drains ~3-4 GiB/s on a core like the bench's)")
    p.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "blobsync-bench-cache")
    a = p.parse_args()
    src = large_file(a.cache_dir, a.mib)
    warm(src)
    tools, ways = a.tools.split(","), a.ways.split(",")
    runs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="blobsync-large-") as tmp:
        for r in range(a.rounds):
            for way in ways:
                for tool in tools[r % len(tools):] + tools[:r % len(tools)]:
                    got = one(tool, way, src, a.mib * MiB, Path(tmp), a.taskset, a.server_processes)
                    runs.setdefault((tool, way), []).append(got)
                    print(f"round {r + 1} {way} {tool}: wall {got[0]:.2f} s, CPU {got[1]:.2f} s, server CPU "
                          f"{got[2]:.2f} s", file=sys.stderr, flush=True)
    gib = a.mib / 1024
    cores = a.taskset or ",".join(map(str, sorted(os.sched_getaffinity(0))))
    print(f"One file of {a.mib} MiB, null server ({a.server_processes} process(es)), tool on cores {cores}, medians "
          f"of {a.rounds}:\n")
    print("| way | tool | wall s | MiB/s | client CPU s | CPU s/GiB | server CPU s/GiB |")
    print("|---|---|---|---|---|---|---|")
    for (tool, way), done in sorted(runs.items(), key=lambda kv: (ways.index(kv[0][1]), tools.index(kv[0][0]))):
        wall, cpu, served = (statistics.median(run[i] for run in done) for i in range(3))
        print(f"| {way} | {tool} | {wall:.2f} | {a.mib / wall:.0f} | {cpu:.2f} | {cpu / gib:.2f} | "
              f"{served / gib:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
