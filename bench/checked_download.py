"""A checked download against an unchecked one (issue 49): one blob blobsync wrote, downloaded with --check-md5
FailIfDifferent and with NoCheck, by this checkout and by another one (--src: e.g. a worktree of the commit before
the whole-blob CRC64), AzCopy (--check-md5 FailIfDifferent) in the same run.

    python bench/checked_download.py [--mib 512] [--rounds 3] [--src /tmp/old/src]

Azurite (in memory) serves the bytes; what is reported is the client's CPU (from wait4) and wall time, medians of
the rounds, tools taking turns. The blob is uploaded once by this checkout (so it carries the composed CRC64)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.azurite import Azurite
from harness.measure import wall_and_cpu
from harness.tools import BLOBSYNC_BIN, Target, _azcopy, env_for, sas_url
from harness.workloads import mkcontainer

MiB = 1024 * 1024
CONTAINER = "checked"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--src", default="", help="another checkout's src/ to compare (PYTHONPATH)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-checked-"))
    data = tmp / "f.bin"
    with open(data, "wb") as f:
        for _ in range(args.mib):
            f.write(os.urandom(MiB))
    with Azurite(tmp) as server:
        target = Target(server.blob_endpoint, like_azure=False)
        mkcontainer(target, CONTAINER, argparse.Namespace())  # type: ignore[arg-type]
        env = env_for(target, tmp)
        url = f"{target.blob_endpoint}/{CONTAINER}/f.bin"
        wall_and_cpu([str(BLOBSYNC_BIN), "cp", str(data), url, "--journal", str(tmp / "up.db")], env)
        runs: dict[str, list[tuple[float, float]]] = {}
        tools = [("blobsync checked", "FailIfDifferent", ""), ("blobsync NoCheck", "NoCheck", "")]
        if args.src:
            tools += [("before checked", "FailIfDifferent", args.src), ("before NoCheck", "NoCheck", args.src)]
        for _ in range(args.rounds):
            for name, mode, src in tools:
                out = tmp / "out.bin"
                out.unlink(missing_ok=True)
                cmd = [str(BLOBSYNC_BIN), "cp", url, str(out), "--check-md5", mode,
                       "--journal", str(tmp / f"j-{time.monotonic_ns()}.db")]
                runs.setdefault(name, []).append(wall_and_cpu(cmd, env | ({"PYTHONPATH": src} if src else {})))
            out = tmp / "out.bin"
            out.unlink(missing_ok=True)
            try:
                got = wall_and_cpu(_azcopy("copy", sas_url(target, CONTAINER, "f.bin"), str(out), "--from-to",
                                       "BlobLocal", "--check-md5", "FailIfDifferent"), env)
                runs.setdefault("azcopy checked", []).append(got)
            except (OSError, RuntimeError) as exc:
                print(f"azcopy skipped: {str(exc)[-300:]}", file=sys.stderr)
    print(f"{args.mib} MiB down from Azurite, medians of {args.rounds} rounds (client CPU from wait4)")
    base = statistics.median(c for _, c in runs["blobsync NoCheck"])
    for name, got in runs.items():
        wall, cpu = statistics.median(w for w, _ in got), statistics.median(c for _, c in got)
        print(f"  {name:18s} wall {wall:6.2f} s  CPU {cpu:6.2f} s  CPU/GiB {cpu * 1024 / args.mib:5.2f} s  "
              f"CPU vs this NoCheck {cpu / base:4.2f}x")


if __name__ == "__main__":
    main()
