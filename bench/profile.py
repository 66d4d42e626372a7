"""Where blobsync's client CPU goes: py-spy samples of one `blobsync cp` upload or download of a large file.

    python bench/profile.py upload|download [--size-mib 1024] [--rate 250] [--native] [--out DIR]

Starts a fresh in-memory Azurite (download: seeds the blob with the SDK first), runs blobsync under
`py-spy record --format raw --threads` and prints a markdown summary: samples per thread, the top functions by
self time (leaf frames) and by inclusive time. Keeps the raw collapsed stacks in DIR for a flame graph
(e.g. speedscope). Sampling costs the client a few percent: use it for shares, not for throughput.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.azurite import REPO, Azurite, NullServer
from harness.tools import BLOBSYNC_BIN, Settings, Target, env_for
from harness.workloads import DEFAULT_CACHE, Download, MiB, large_file, mkcontainer, small_tree, warm

PY_SPY = REPO / ".venv/bin/py-spy"


def summarise(raw: Path, top: int) -> str:
    self_t: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        count = int(n)
        total += count
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith(("thread", "process")) else "?"
        name = thread.split(": ", 1)[1] if ": " in thread else "unnamed thread (start-up)"
        threads[name] += count
        funcs = [re.sub(r" \((.*?):\d+\)$", r" (\1)", f) for f in frames[1:]]
        funcs = [re.sub(r"^(.*?) \(.*/(site-packages|src|lib/python3\.\d+)/", r"\1 (", f) for f in funcs]
        if funcs:
            self_t[f"{name}: {funcs[-1]}"] += count
            for f in set(funcs):
                incl[f] += count
    out = [f"Samples: {total:,} (idle threads excluded; a C call such as hashlib's MD5 or a socket send shows as "
           "the Python frame that made it)", "", "| Thread | Share of samples |", "|---|---|"]
    out += [f"| {t} | {100 * c / total:.1f}% |" for t, c in threads.most_common(8)]
    out += ["", "| Thread: self (leaf) Python function | Share |", "|---|---|"]
    out += [f"| `{f}` | {100 * c / total:.1f}% |" for f, c in self_t.most_common(top)]
    out += ["", "| Inclusive function | Share |", "|---|---|"]
    out += [f"| `{f}` | {100 * c / total:.1f}% |" for f, c in incl.most_common(top)]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("direction", choices=("upload", "download", "upload-small", "noop-sync"))
    p.add_argument("--files", type=int, default=2000, help="upload-small: files of 16 KiB (default 2000)")
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--rate", type=int, default=250, help="samples per second (default 250)")
    p.add_argument("--native", action="store_true", help="also sample C frames (hashlib, ssl, socket)")
    p.add_argument("--gil", action="store_true", help="only samples of the thread holding the GIL")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--blobsync-args", default="", help="extra blobsync options")
    p.add_argument("--null", action="store_true", help="uploads to the null server (the client's cost alone; blocks "
                   "then carry what --block-check auto sends to Azure, a CRC64)")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "blobsync-profile")
    a = p.parse_args()
    if not os.access(PY_SPY, os.X_OK):
        print(f"py-spy not found at {PY_SPY}: pip install py-spy into .venv", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    if a.direction == "noop-sync":
        src = small_tree(DEFAULT_CACHE, 10_000, 64, vary=True)
    elif a.direction == "upload-small":
        src = small_tree(DEFAULT_CACHE, a.files, 16 * 1024)
    else:
        src = large_file(DEFAULT_CACHE, a.size_mib)
    warm(src)
    tmp = Path(tempfile.mkdtemp(prefix="blobsync-profile-"))
    if a.null and not a.direction.startswith("upload"):
        print("--null profiles uploads only", file=sys.stderr)
        return 2
    az = NullServer(tmp) if a.null else Azurite(tmp)
    try:
        az.start()
        target = Target(az.blob_endpoint)
        if a.direction == "noop-sync":
            cmd = [str(BLOBSYNC_BIN), "sync", str(src), f"{az.blob_endpoint}/prof", "--create-container"]
            seed = [*cmd, "--quiet", "--journal", str(tmp / "j.db")]
            subprocess.run(seed, env=env_for(target, tmp), check=True, capture_output=True)  # not profiled
        elif a.direction.startswith("upload"):
            mkcontainer(target, "prof", Settings())
            cmd = [str(BLOBSYNC_BIN), "cp", str(src), f"{az.blob_endpoint}/prof/"]
            cmd += ["-r"] if a.direction == "upload-small" else []
            cmd += ["--block-check", "crc64"] if a.null else []
        else:
            dl = Download(DEFAULT_CACHE, a.size_mib)
            dl.prepare()
            dl.seed(target)
            cmd = [str(BLOBSYNC_BIN), "cp", f"{az.blob_endpoint}/{dl.container}/{src.name}", str(tmp / "out.bin")]
        cmd += [*a.blobsync_args.split(), "--quiet", "--journal", str(tmp / "j.db")]
        what = {"upload-small": f"{a.files}files", "noop-sync": "10000files"}.get(a.direction, f"{a.size_mib}MiB")
        raw = a.out / f"{a.direction}-{what}{'-gil' if a.gil else ''}{'-null' if a.null else ''}.txt"
        spy = [str(PY_SPY), "record", "--format", "raw", "--threads", "--rate", str(a.rate), "-o", str(raw)]
        spy += ["--native"] if a.native else []
        spy += ["--gil"] if a.gil else []
        r = subprocess.run([*spy, "--", *cmd], env=env_for(target, tmp), capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
            return 1
        what = {"upload-small": f"{a.files:,} files of 16 KiB", "noop-sync": "10,000 files (nothing to do)"}.get(
            a.direction, f"{a.size_mib * MiB / 2**30:g} GiB"
        )
        print(f"### py-spy: blobsync {a.direction} of {what}{' to the null server' if a.null else ''}\n")
        print(f"```\n{' '.join(spy)} -- blobsync {' '.join(cmd[1:])}\n```\n")
        print(summarise(raw, a.top))
        print(f"\n(raw collapsed stacks: {raw})")
    finally:
        az.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
