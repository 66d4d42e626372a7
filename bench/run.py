"""The benchmark harness: blobsync against its peers, side by side, one fresh in-memory Azurite per run.

    python bench/run.py WORKLOAD [WORKLOAD ...] [--tools blobsync,sdk,...] [--repeat N] [--markdown] [--out FILE]

Workloads: upload-large (1 GiB up), upload-small (2,000 x 16 KiB up), download-large (1 GiB down; and
download-large-nomd5, a blob stored without a Content-MD5), noop-sync (no-op re-sync of 10,000 files), resume
(1 GiB up, SIGKILL at 50%, run again), slow-link (64 MiB up over a rate-limited veth between two network
namespaces plus per-request latency; needs root), slow-small (1,000 x 16 KiB over the same link), sparse-rss
(blobsync's peak RSS uploading sparse files of 1 and 20 GiB), throttled (1 GiB up with 10% of Put Blocks answered
503 through the fault proxy), delta (1 GiB re-synced after 2 blocks changed), all.

Each run starts Azurite, runs ONE tool in a child process (wall time, its CPU and peak RSS from wait4 rusage,
Azurite's CPU), checks the result independently (listing count + bytes; downloads: size + SHA-256), and stops
Azurite. Tools take turns within each round (order rotated each round); before each run the harness waits for
background load to drop, and a run during which other processes were busy is discarded and run again. Peers that
are not installed are skipped, and the report says so. Run by hand on a quiet machine; never in CI (the smoke test
runs tiny sizes with --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import NoReturn

from harness.azurite import Azurite, BenchError, NullServer
from harness.netns import netns_available
from harness.report import derived, fmt, report, src_state
from harness.tools import REFERENCE_TOOLS, UPLOAD_TOOLS, VENV_PYTHON, Settings, available
from harness.workloads import (
    DEFAULT_CACHE,
    Delta,
    Download,
    DownloadNoMd5,
    NoopSync,
    NullDownload,
    Resume,
    Run,
    SlowLinkUpload,
    SparseRss,
    Throttled,
    Upload,
    Workload,
    large_file,
    size_label,
    small_tree,
)

WORKLOADS = ("upload-large", "upload-small", "download-large", "download-large-nomd5", "noop-sync", "resume",
             "slow-link", "slow-small", "sparse-rss", "null-upload-large", "null-upload-small", "null-download-large",
             "cluster", "throttled", "delta")  # fmt: skip
ORIG_ARGV_ENV = "BLOBSYNC_BENCH_ORIG_ARGV"  # survives the re-exec under the venv so the report shows what was typed


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("workloads", nargs="+", choices=(*WORKLOADS, "all"), metavar="WORKLOAD",
                   help=f"one or more of {', '.join(WORKLOADS)}, or all")  # fmt: skip
    p.add_argument("--tools", default="", help="comma-separated subset (default: every tool the workload has)")
    p.add_argument("--repeat", type=int, default=3, help="rounds; each round runs every tool once (default 3)")
    p.add_argument("--markdown", action="store_true", help="markdown tables (for bench/RESULTS.md)")
    p.add_argument("--out", type=Path, help="also write the report to this file")
    p.add_argument("--json", type=Path, help="also write every run's raw figures to this file")
    p.add_argument("--quick", action="store_true",
                   help="no noise guard (no waiting for a quiet machine, no re-runs): smoke tests only")  # fmt: skip
    g = p.add_argument_group("sizes")
    g.add_argument("--large-mib", type=int, default=1024, help="upload-large/download-large file (default 1024)")
    g.add_argument("--throttle-pct", type=float, default=10.0, help="throttled: share of Put Blocks answered 503")
    g.add_argument("--retry-after", type=float, default=1.0, help="throttled: the 503s' Retry-After (s)")
    g.add_argument("--changed-blocks", type=int, default=2, help="delta: blocks changed before the re-sync")
    g.add_argument("--small-files", type=int, default=2000, help="upload-small file count (default 2000)")
    g.add_argument("--small-kib", type=int, default=16, help="upload-small file size (default 16)")
    g.add_argument("--noop-files", type=int, default=10_000, help="noop-sync tree (default 10000)")
    g.add_argument("--resume-mib", type=int, default=1024, help="resume file (default 1024)")
    g.add_argument("--slow-mib", type=int, default=64, help="slow-link file (default 64)")
    g.add_argument("--slow-files", type=int, default=1000, help="slow-small: files of --small-kib (default 1000)")
    g.add_argument("--rate-mbit", type=float, default=100.0, help="slow link rate, Mbit/s (default 100)")
    g.add_argument("--delay-ms", type=float, default=20.0, help="slow link extra round trip per request (default 20)")
    g.add_argument("--slow-server", choices=("azurite", "null"), default="azurite",
                   help="what answers at the far end of the slow link: Azurite, or the null server (the link and "
                        "the client alone; default azurite)")
    g.add_argument("--cap-mbps", type=float, default=50.0, help="blobsync-cap's --cap-mbps (default 50)")
    g.add_argument("--sparse-gib", default="1,20", help="sparse-rss sizes in GiB (default 1,20)")
    g = p.add_argument_group("tools")
    g.add_argument("--blobsync-args", default="", help="extra blobsync options, one shell-quoted string")
    g.add_argument("--memory-mb", type=float, help="pass --memory-mb to blobsync (default: its own, 256)")
    g.add_argument("--base-src", type=Path,
                   help="add the tool blobsync-base: blobsync run from this src/ (e.g. an older commit's, from "
                   "`git archive COMMIT src | tar -x -C DIR`), for an A/B in the same run")  # fmt: skip
    g.add_argument("--python", type=Path, default=VENV_PYTHON, help="interpreter for the SDK/obstore children")
    g.add_argument("--rclone", default="rclone", help="rclone binary (default: from PATH)")
    g.add_argument("--rclone-streams", type=int, default=8, help="rclone --multi-thread-streams (default 8)")
    g = p.add_argument_group("noise and housekeeping")
    g.add_argument("--max-background", type=float, default=0.25,
                   help="before each run, wait while other processes use more than this many cores (default 0.25)")
    g.add_argument("--noisy-pct", type=float, default=20.0,
                   help="a run while other processes used more than this %% of a core is noisy (default 20)")
    g.add_argument("--noisy-retries", type=int, default=2, help="re-runs of a noisy run (default 2)")
    g.add_argument("--idle-wait", type=float, default=900.0, help="longest wait for a quiet machine, s (default 900)")
    g.add_argument("--timeout", type=float, default=900.0, help="seconds before a tool run is killed (default 900)")
    g.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help=f"generated data (default {DEFAULT_CACHE})")
    g.add_argument("--keep-temp", action="store_true", help="keep each run's temp dir (logs, journal)")
    a = p.parse_args(argv)
    if "all" in a.workloads:
        a.workloads = list(WORKLOADS)
    a.tools = [t.strip() for t in a.tools.split(",") if t.strip()]
    if a.repeat < 1:
        p.error("--repeat must be at least 1")
    return a


def make_workload(name: str, a: argparse.Namespace) -> Workload:
    cache = a.cache_dir
    if name == "upload-large":
        return Upload(name, lambda: large_file(cache, a.large_mib), False,
                      f"one {size_label(a.large_mib)} file of random bytes up",
                      tools=(*UPLOAD_TOOLS, *(t for t in REFERENCE_TOOLS if t in a.tools)))  # fmt: skip
    if name == "upload-small":
        return Upload(name, lambda: small_tree(cache, a.small_files, a.small_kib * 1024), True,
                      f"{a.small_files:,} files of {a.small_kib} KiB (random bytes) up, 20 nested folders",
                      tools=(*UPLOAD_TOOLS, *(t for t in REFERENCE_TOOLS if t in a.tools)))  # fmt: skip
    if name == "download-large":
        return Download(cache, a.large_mib)
    if name == "download-large-nomd5":
        return DownloadNoMd5(cache, a.large_mib)
    # The same against the null server: what each client costs, with no server on the two cores.
    if name == "null-upload-large":
        return Upload(name, lambda: large_file(cache, a.large_mib), False,
                      f"one {size_label(a.large_mib)} file up to the null server (client cost only)",
                      server=NullServer)  # fmt: skip
    if name == "null-upload-small":
        return Upload(name, lambda: small_tree(cache, a.small_files, a.small_kib * 1024), True,
                      f"{a.small_files:,} files of {a.small_kib} KiB up to the null server (client cost only)",
                      server=NullServer)  # fmt: skip
    if name == "null-download-large":
        return NullDownload(cache, a.large_mib)
    if name == "noop-sync":
        return NoopSync(cache, a.noop_files)
    if name == "resume":
        return Resume(cache, a.resume_mib)
    far = (NullServer, " to the null server") if a.slow_server == "null" else (Azurite, "")
    suffix = "-null" if a.slow_server == "null" else ""  # its own rows in the results: another far end
    if name == "slow-link":
        return SlowLinkUpload(name + suffix, lambda: large_file(cache, a.slow_mib), False,
                              f"one {size_label(a.slow_mib)} file up{far[1]} over a {a.rate_mbit:g} Mbit/s link "
                              f"with +{a.delay_ms:g} ms per request", a.rate_mbit, a.delay_ms, far[0])  # fmt: skip
    if name == "slow-small":
        return SlowLinkUpload(name + suffix, lambda: small_tree(cache, a.slow_files, a.small_kib * 1024), True,
                              f"{a.slow_files:,} files of {a.small_kib} KiB up{far[1]} over a {a.rate_mbit:g} Mbit/s "
                              f"link with +{a.delay_ms:g} ms per request", a.rate_mbit, a.delay_ms,
                              far[0])  # fmt: skip
    if name == "cluster":  # one job on 1 and 2 Dask workers here: Azurite-bound, so this shows the overhead
        return Upload(name, lambda: large_file(cache, a.large_mib), False,
                      f"one {size_label(a.large_mib)} file up with `--cluster local:1` and `local:2` (split into "
                      "block ranges over the workers) against the plain engine",
                      tools=("blobsync", "blobsync-cluster1", "blobsync-cluster2"))  # fmt: skip
    if name == "throttled":
        return Throttled(lambda: large_file(cache, a.large_mib), a.throttle_pct, a.retry_after,
                         size_label(a.large_mib))
    if name == "delta":
        return Delta(cache, a.large_mib, a.changed_blocks)
    if name == "sparse-rss":
        return SparseRss(cache, [int(float(x) * 1024) for x in a.sparse_gib.split(",")])
    raise ValueError(name)


def ensure_sdk_importable() -> None:
    """The harness itself needs the SDK (containers, seeding, listings): re-run under the project venv if missing."""
    try:
        import azure.storage.blob  # noqa: F401
    except ImportError:
        # Compare prefixes, not executables: the venv's python is a symlink to the very same interpreter binary.
        if VENV_PYTHON.exists() and Path(sys.prefix).resolve() != VENV_PYTHON.parents[1].resolve():
            os.environ.setdefault(ORIG_ARGV_ENV, shlex.join(sys.orig_argv))
            os.execv(VENV_PYTHON, [str(VENV_PYTHON), str(Path(__file__).resolve()), *sys.argv[1:]])
        raise BenchError("azure-storage-blob is not importable: run scripts/setup.sh, use .venv/bin/python") from None


def _sigterm(signum: int, frame: object) -> NoReturn:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop Azurite, children, namespaces


def run_workload(wl: Workload, a: argparse.Namespace, st: Settings) -> tuple[list[Run], list[str], dict[str, str]]:
    all_tools = (*wl.tools, "blobsync-base") if a.base_src and "blobsync" in wl.tools else wl.tools
    wanted = [t for t in all_tools if not a.tools or t in a.tools or t.split("@")[0] in a.tools]
    skipped: dict[str, str] = {}
    if wl.name.startswith("slow") and (why := netns_available()):
        return [], [], dict.fromkeys(wanted, f"slow link unavailable: {why}")
    tools = []
    for t in wanted:
        if why := available(t, st.python, st.rclone):
            skipped[t] = why
            print(f"bench: {wl.name}: skipping {t}: {why}", file=sys.stderr)
        else:
            tools.append(t)
    runs: list[Run] = []
    if not tools:
        return runs, tools, skipped
    wl.prepare()
    with wl.session(tools, st):
        n = len(tools)
        for rnd in range(1, a.repeat + 1):
            # Round-robin, rotated each round, so slow drift and position effects are shared by all tools.
            for tool in [tools[(i + rnd - 1) % n] for i in range(n)]:
                print(f"bench: {wl.name} round {rnd}/{a.repeat}: {tool} ...", file=sys.stderr, flush=True)
                for attempt in range(st.noisy_retries + 1):
                    run = wl.one(rnd, tool, st)
                    runs.append(run)
                    d = derived(run, wl)
                    extra = "".join(f", {k} {fmt(v, 1)}" for k, v in run.extra.items())
                    print(f"bench:   {'ok' if run.valid else 'INVALID'}: wall {fmt(d['wall_s'])} s, client CPU "
                          f"{fmt(d['cpu_s'])} s, RSS {fmt(d['rss_mib'], 1)} MiB, Azurite CPU {fmt(d['az_cpu_s'])} s, "
                          f"other CPU {fmt(d['other_pct'], 0)}%{extra}", file=sys.stderr, flush=True)  # fmt: skip
                    if run.error:
                        print(f"bench:   {run.error}", file=sys.stderr, flush=True)
                    # Another process stole CPU mid-run (on 2 cores that skews everything): measure again.
                    if run.valid and d["other_pct"] > st.noisy_pct and attempt < st.noisy_retries:
                        run.discarded = True
                        print("bench:   noisy (other processes were busy); discarding and re-running", file=sys.stderr)
                        continue
                    break
    return runs, tools, skipped


def main(argv: Sequence[str]) -> int:
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    st = Settings(
        python=a.python,
        timeout=a.timeout,
        blobsync_args=shlex.split(a.blobsync_args),
        memory_mb=a.memory_mb,
        rclone=a.rclone,
        rclone_streams=a.rclone_streams,
        cap_mbps=a.cap_mbps,
        max_background=0.0 if a.quick else a.max_background,
        noisy_pct=a.noisy_pct,
        noisy_retries=0 if a.quick else a.noisy_retries,
        idle_wait=0.0 if a.quick else a.idle_wait,
        keep_temp=a.keep_temp,
        base_src=a.base_src.resolve() if a.base_src else None,
    )
    argv_list = shlex.split(os.environ.get(ORIG_ARGV_ENV) or shlex.join(sys.orig_argv))
    command = shlex.join(["python", *argv_list[1:]])  # the interpreter by name: its install path is noise
    out: list[str] = []
    raw: dict[str, object] = {}
    failed = interrupted = False
    try:
        ensure_sdk_importable()
        a.cache_dir.mkdir(parents=True, exist_ok=True)
        for name in a.workloads:
            wl = make_workload(name, a)
            code_before = src_state()
            try:
                runs, tools, skipped = run_workload(wl, a, st)
            except KeyboardInterrupt:
                print("bench: interrupted; reporting nothing for this workload", file=sys.stderr)
                interrupted = True
                break
            failed |= any(not r.valid for r in runs) or not runs
            if not runs:
                out.append(f"#### `{name}`: nothing ran ({'; '.join(f'{t}: {w}' for t, w in skipped.items())})\n")
                continue
            text = report(wl, runs, tools, skipped, st, a.markdown, (code_before, src_state()), command)
            out.append(text)
            print(text, flush=True)
            raw[wl.name] = {"tools": tools, "skipped": skipped, "runs": [asdict(r) for r in runs], "kind": wl.kind,
                         "files": wl.files, "total_bytes": wl.total_bytes, "description": wl.description,
                         "command": command, "src": src_state()}
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if a.out and out:
            a.out.write_text("\n".join(out))
        if a.json and raw:
            a.json.write_text(json.dumps(raw, indent=2))
    if interrupted:
        return 130
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
