"""`--processes N` on a small-file upload: 1 process against N, the client's CPU split between the parent (listing,
planning, journal, report) and its worker processes, the service's apart; and a model of files/s on more cores.

    python bench/processes.py [--files 8000] [--size-kib 16] [--processes 1,2] [--repeat 3] [--server null,azurite]

Each run: a fresh server (the null server, which keeps no bytes, or Azurite), `blobsync cp -r` of the tree into an
empty container, checked by listing (count and bytes). CPU per process comes from /proc, sampled every 20 ms
while the job runs (a process's last 20 ms may be missed: < 1% here). On 2 cores the server and the client share
the machine, so the measured files/s are a floor; the model uses the measured CPU per file of each part:

    files/s on C cores ~= min(1 / parent CPU per file, (C - 1) / worker CPU per file, the service's rate)

(one core for the parent and the service's share left out: a model, stated as such in RESULTS.md)."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.azurite import Azurite, NullServer
from harness.tools import BLOBSYNC_BIN, Target, env_for
from harness.workloads import DEFAULT_CACHE, listing, mkcontainer, small_tree, tree_stats, warm

_TICK = 100  # /proc/<pid>/stat counts in clock ticks (USER_HZ)


def _cpu_of(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def one_run(server_kind: str, tree: Path, processes: int, tmp: Path, src: str = "") -> dict[str, float]:
    server = NullServer(tmp) if server_kind == "null" else Azurite(tmp)
    with server:
        target = Target(server.blob_endpoint, like_azure=server_kind == "null")
        mkcontainer(target, "procs", argparse.Namespace())  # type: ignore[arg-type]
        cmd = [str(BLOBSYNC_BIN), "cp", str(tree), f"{target.blob_endpoint}/procs/", "-r", "--quiet",
               "--journal", str(tmp / "j.db"), *(["--block-check", "crc64"] if server_kind == "null" else []),
               *(["--processes", str(processes)] if processes > 1 else [])]
        server0 = server.cpu_seconds()
        started = time.perf_counter()
        env = env_for(target, tmp) | ({"PYTHONPATH": src} if src else {})  # --src: another checkout's code
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        seen: dict[int, float] = {}
        while proc.poll() is None:
            for pid in (proc.pid, *_children(proc.pid)):
                cpu = _cpu_of(pid)
                if cpu is not None:
                    seen[pid] = cpu
            time.sleep(0.02)
        wall = time.perf_counter() - started
        err = proc.stderr.read().decode() if proc.stderr else ""
        if proc.returncode != 0:
            raise SystemExit(f"blobsync failed ({proc.returncode}): {err[-2000:]}")
        files, nbytes = tree_stats(tree)
        got = listing(target, "procs", argparse.Namespace())  # type: ignore[arg-type]
        if got != (files, nbytes):
            raise SystemExit(f"listing has {got}, the tree {files, nbytes}")
        parent = seen.get(proc.pid, 0.0)
        return {"wall": wall, "files_per_s": files / wall, "parent_cpu": parent,
                "workers_cpu": sum(v for k, v in seen.items() if k != proc.pid), "server_cpu": server.cpu_seconds()
                - server0, "files": float(files)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=8000)
    p.add_argument("--size-kib", type=int, default=16)
    p.add_argument("--processes", default="1,2")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--server", default="null,azurite")
    p.add_argument("--src", default="", help="run blobsync from this src/ folder (an A/B against another commit)")
    a = p.parse_args()
    tree = small_tree(DEFAULT_CACHE, a.files, a.size_kib * 1024)
    warm(tree)
    counts = [int(x) for x in a.processes.split(",")]
    rows = []
    for server in a.server.split(","):
        results: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
        for rnd in range(a.repeat):
            for n in counts if rnd % 2 == 0 else reversed(counts):
                with tempfile.TemporaryDirectory(prefix="blobsync-procs-") as tmp:
                    results[n].append(one_run(server, tree, n, Path(tmp), a.src))
                print(f"bench: {server} round {rnd + 1} processes {n}: {results[n][-1]}", file=sys.stderr)
        for n in counts:
            med = {k: statistics.median(r[k] for r in results[n]) for k in results[n][0]}
            rows.append((server, n, med))
    print(f"`python bench/processes.py --files {a.files} --size-kib {a.size_kib} --processes {a.processes} "
          f"--repeat {a.repeat} --server {a.server}`, medians:\n")
    print("| Server | Processes | Wall s | files/s | Parent CPU ms/file | Workers CPU ms/file | Server CPU s |\n"
          "|---|---|---|---|---|---|---|")
    for server, n, med in rows:
        per = 1000 / med["files"]
        workers = med["workers_cpu"] * per if n > 1 else 0.0
        print(f"| {server} | {n} | {med['wall']:.2f} | {med['files_per_s']:.0f} | {med['parent_cpu'] * per:.3f} | "
              f"{workers:.3f} | {med['server_cpu']:.2f} |")
    null = [(n, med) for server, n, med in rows if server == "null" and n > 1]
    if null:
        _model(*null[-1], _fixed_cost(null[-1][0], a.repeat))
    return 0


def _fixed_cost(n: int, repeat: int) -> dict[str, float]:
    """What starting N workers costs: a job of two tiny files with N processes against one (null server)."""
    with tempfile.TemporaryDirectory(prefix="blobsync-procs-tiny-") as tiny:
        tree = Path(tiny) / "tree"
        for i in range(2):
            (tree / f"d{i}").mkdir(parents=True)
            (tree / f"d{i}" / "f.bin").write_bytes(b"x" * 100)
        runs: dict[int, list[dict[str, float]]] = {1: [], n: []}
        for _ in range(repeat):
            for count in (1, n):
                with tempfile.TemporaryDirectory(prefix="blobsync-procs-") as tmp:
                    runs[count].append(one_run("null", tree, count, Path(tmp)))
    one = {k: statistics.median(r[k] for r in runs[1]) for k in runs[1][0]}
    many = {k: statistics.median(r[k] for r in runs[n]) for k in runs[n][0]}
    return {"wall": many["wall"] - one["wall"], "workers_cpu": many["workers_cpu"],
            "parent_cpu": many["parent_cpu"] - one["parent_cpu"]}


def _model(n: int, med: dict[str, float], fixed: dict[str, float]) -> None:
    print(f"\nFixed cost of {n} worker processes (two tiny files, against 1 process): +{fixed['wall']:.2f} s wall, "
          f"{fixed['workers_cpu']:.2f} s of the workers' CPU (start-up and imports), parent "
          f"{fixed['parent_cpu']:+.2f} s.\n")
    parent = med["parent_cpu"] / med["files"]
    workers = max(1e-9, med["workers_cpu"] - fixed["workers_cpu"]) / med["files"]
    print(f"Model (the client alone; the service and its share of the cores not counted): parent {parent * 1000:.3f} "
          f"ms/file, workers {workers * 1000:.3f} ms/file once started, from the null server's {n}-process runs.\n")
    print("| Cores | Workers | files/s (model) | bounded by |\n|---|---|---|---|")
    for cores in (2, 4, 16, 64):
        by_workers, by_parent = (cores - 1) / workers, 1 / parent
        bound = "the parent process (listing, plan, journal, report)" if by_parent < by_workers \
            else "the workers' CPU"
        print(f"| {cores} | {cores - 1} | {min(by_parent, by_workers):,.0f} | {bound} |")


if __name__ == "__main__":
    sys.exit(main())
