"""Benchmark blobsync downloads against the Azure SDK and rclone, one fresh in-memory Azurite per run (by hand only)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

# bench/ is sys.path[0] when this file runs as a script, so the upload benchmark's machinery imports directly.
from bench_upload import (
    AZURITE_BIN,
    BLOBSYNC_BIN,
    COLUMNS,
    DEFAULT_CACHE,
    DEFAULT_MEMORY_MB,
    HOST,
    NOISY_OTHER_PCT,
    ORIG_ARGV_ENV,
    RSS_HEADROOM_MIB,
    SERVER_NOTE,
    VENV_PYTHON,
    Azurite,
    BenchError,
    Run,
    Settings,
    Workload,
    _out,
    derived,
    fmt,
    large_workload,
    machine_info,
    medians,
    render,
    run_measured,
    src_state,
    system_busy_seconds,
    tail,
    wait_for_quiet,
)

TOOLS = ("blobsync", "blobsync-nocheck", "sdk", "rclone", "rclone-1stream")
PEERS = ("sdk", "rclone")  # blobsync is judged against the faster of these; rclone-1stream is for information
TARGET_RATIO = 1.0  # issue 4: blobsync download >= 1.0x the faster peer, while checking the whole-file MD5
SDK_CONCURRENCY = 8
CHILD_MODE = "_sdk-download-child"  # hidden first argument: this file doubles as the SDK downloader child
CONTAINER = "bench-download"
OUT_NAME = "out.bin"


# --------------------------------------------------------------------------------------------------
# Settings and runs
# --------------------------------------------------------------------------------------------------
@dataclass
class DownloadSettings(Settings):
    rclone: str
    rclone_streams: int
    rclone_args: list[str]


@dataclass
class DownloadRun(Run):
    leftovers: str = ""  # files next to the download after the tool exited (partial files, temp names)


@dataclass(frozen=True)
class Source:
    workload: Workload
    blob: str
    md5: bytes  # set as the blob's Content-MD5 so blobsync and rclone have something to check
    sha256: str  # what every download is compared with


def hash_source(wl: Workload) -> Source:
    """One pass over the source: MD5 for Content-MD5, SHA-256 to check downloads (also warms the page cache)."""
    md5, sha = hashlib.md5(), hashlib.sha256()
    with wl.src.open("rb") as f:
        while chunk := f.read(16 << 20):
            md5.update(chunk)
            sha.update(chunk)
    return Source(wl, wl.src.name, md5.digest(), sha.hexdigest())


def seed_blob(conn: str, src: Source) -> None:
    """Upload the source with the plain SDK, then set its Content-MD5 (a block-list upload does not get one)."""
    from azure.storage.blob import BlobServiceClient, ContentSettings

    svc = BlobServiceClient.from_connection_string(conn)
    svc.create_container(CONTAINER)
    blob = svc.get_blob_client(CONTAINER, src.blob)
    with src.workload.src.open("rb") as f:
        blob.upload_blob(f, length=src.workload.total_bytes, overwrite=True, max_concurrency=SDK_CONCURRENCY)
    blob.set_http_headers(
        content_settings=ContentSettings(content_type="application/octet-stream", content_md5=bytearray(src.md5))
    )
    props = blob.get_blob_properties()
    got = props.content_settings.content_md5
    if props.size != src.workload.total_bytes or got is None or bytes(got) != src.md5:
        raise BenchError(f"seeding the blob failed: size {props.size}, Content-MD5 {got!r}")


def rclone_config(endpoint: str) -> str:
    # Both settings are needed: use_emulator alone goes to 127.0.0.1:10000, endpoint alone asks for a key.
    return f"[az]\ntype = azureblob\nuse_emulator = true\nendpoint = {endpoint}\n"


def rclone_command(tool: str, cfg: str, blob: str, out: str, tmp: str, st: DownloadSettings) -> list[str]:
    cmd = [st.rclone, "--config", cfg, "--cache-dir", f"{tmp}/rclone-cache", "copyto", f"az:{CONTAINER}/{blob}", out]
    # rclone 1.60 skips its MD5 check after a multi-thread download ("Src hash empty - aborting Dst hash check");
    # rclone-1stream turns multi-thread off (streams 0): one GET, hashed as it arrives and checked.
    streams = 0 if tool == "rclone-1stream" else st.rclone_streams
    cmd += ["--transfers", "16", "--multi-thread-streams", str(streams), "--retries", "1", "--low-level-retries", "1"]
    return [*cmd, *st.rclone_args]


def tool_command(tool: str, src: Source, azurite: Azurite, tmp: Path, st: DownloadSettings) -> list[str]:
    out = str(tmp / "dl" / OUT_NAME)
    if tool.startswith("blobsync"):
        url = f"{azurite.blob_endpoint}/{CONTAINER}/{src.blob}"
        cmd = [str(BLOBSYNC_BIN), "cp", url, out]
        if tool == "blobsync-nocheck":
            cmd += ["--check-md5", "NoCheck"]
        if st.memory_mb is not None:
            cmd += ["--memory-mb", f"{st.memory_mb:g}"]
        # A private journal per run: runs never see each other's jobs or resume each other.
        return [*cmd, *st.blobsync_args, "--quiet", "--journal", str(tmp / "j.db")]
    if tool == "sdk":
        return [str(st.python), str(Path(__file__).resolve()), CHILD_MODE, CONTAINER, src.blob, out]
    if tool.startswith("rclone"):
        cfg = tmp / "rclone.conf"
        cfg.write_text(rclone_config(azurite.blob_endpoint))
        return rclone_command(tool, str(cfg), src.blob, out, str(tmp), st)
    raise ValueError(f"unknown tool {tool!r}")


def check_download(out: Path, src: Source) -> str:
    """Empty if `out` holds exactly the source's bytes, else what is wrong."""
    try:
        size = out.stat().st_size
    except OSError as exc:
        return f"no downloaded file: {exc}"
    if size != src.workload.total_bytes:
        return f"downloaded file has {size} bytes, source has {src.workload.total_bytes}"
    with out.open("rb") as f:
        got = hashlib.file_digest(f, "sha256").hexdigest()
    return "" if got == src.sha256 else f"SHA-256 of the download {got[:16]}... differs from the source's"


def one_run(rnd: int, tool: str, src: Source, st: DownloadSettings) -> DownloadRun:
    run = DownloadRun(round=rnd, tool=tool)
    tmp = Path(tempfile.mkdtemp(prefix=f"blobsync-bench-dl-{tool}-"))
    (tmp / "dl").mkdir()
    azurite = Azurite(tmp)
    try:
        azurite.start()
        seed_blob(azurite.connection_string, src)
        env = dict(os.environ)
        env.update(
            AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string,
            XDG_STATE_HOME=str(tmp / "state"),  # nothing lands in the user's real state dir
            NO_PROXY=HOST,  # a proxy from the environment must never sit between client and Azurite
            no_proxy=HOST,
        )
        cmd = tool_command(tool, src, azurite, tmp, st)
        wait_for_quiet(st.max_background, st.idle_wait)  # also lets Azurite's GC after the upload settle
        az0, sys0 = azurite.cpu_seconds(), system_busy_seconds()
        res = run_measured(cmd, env, tmp, tmp / "child.log", st.timeout)
        run.azurite_cpu_s = azurite.cpu_seconds() - az0
        run.other_cpu_s = max(0.0, system_busy_seconds() - sys0 - run.azurite_cpu_s - res.user_s - res.sys_s)
        run.azurite_rss_mib = azurite.peak_rss_mib()
        run.wall_s, run.user_s, run.sys_s = res.wall_s, res.user_s, res.sys_s
        run.cpu_s = res.user_s + res.sys_s
        run.rss_mib = res.maxrss_kib / 1024 if res.maxrss_kib else float("nan")
        run.returncode = res.returncode
        problems: list[str] = []
        if res.timed_out:
            problems.append(f"timed out after {st.timeout:g} s and was killed")
        elif res.returncode != 0:
            problems.append(f"exit code {res.returncode}")
        if bad := check_download(tmp / "dl" / OUT_NAME, src):
            problems.append(bad)
        run.leftovers = ", ".join(sorted(p.name for p in (tmp / "dl").iterdir() if p.name != OUT_NAME))
        if problems:
            output = tail(tmp / "child.log")
            run.error = "; ".join(problems) + (f"\n--- {tool} output ---\n{output}" if output else "")
        run.valid = not problems
    except BenchError:
        raise
    except Exception as exc:
        run.error = f"benchmark harness error: {exc!r}"
    finally:
        azurite.stop()
        if st.keep_temp:
            print(f"bench: kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)  # its dirty pages go with it, so no writeback hits the next run
    return run


# --------------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------------
def faster_peer(med: dict[str, dict[str, float] | None]) -> str | None:
    have = [(m["mb_s"], p) for p in PEERS if (m := med.get(p)) is not None]
    return max(have)[1] if have else None


def target_rows(med: dict[str, dict[str, float] | None], runs: Sequence[Run], st: DownloadSettings) -> list[list[str]]:
    rows: list[list[str]] = []
    peer = faster_peer(med)
    for tool, label in (
        ("blobsync", "blobsync (checks whole-file MD5) / faster peer, MB/s"),
        ("blobsync-nocheck", "blobsync --check-md5 NoCheck / faster peer, MB/s (info)"),
    ):
        m = med.get(tool)
        if m is None or peer is None:
            why = f"no valid {tool} runs" if m is None else "no valid sdk or rclone runs"
            rows.append([label, "n/a", f">= {TARGET_RATIO:.2f}x", "n/a", why])
            continue
        p = med[peer]
        assert p is not None
        each = "; ".join(f"vs {q} {m['mb_s'] / pm['mb_s']:.2f}x" for q in PEERS if (pm := med.get(q)) is not None)
        note = (
            f"{fmt(m['mb_s'], 1)} vs {peer} {fmt(p['mb_s'], 1)} MB/s ({each}); "
            f"Azurite CPU {m['az_pct']:.0f}% vs {p['az_pct']:.0f}%"
        )
        r = m["mb_s"] / p["mb_s"]
        rows.append([label, f"{r:.2f}x", f">= {TARGET_RATIO:.2f}x", "PASS" if r >= TARGET_RATIO else "FAIL", note])
    m, one = med.get("blobsync"), med.get("rclone-1stream")
    if m is not None and one is not None:
        r = m["mb_s"] / one["mb_s"]
        rows.append(
            [
                "blobsync / rclone-1stream (the only peer that also checks MD5), MB/s (info)",
                f"{r:.2f}x",
                f">= {TARGET_RATIO:.2f}x",
                "PASS" if r >= TARGET_RATIO else "FAIL",
                f"{fmt(m['mb_s'], 1)} vs {fmt(one['mb_s'], 1)} MB/s",
            ]
        )
    budget = st.memory_mb if st.memory_mb is not None else DEFAULT_MEMORY_MB
    limit = RSS_HEADROOM_MIB + budget
    for tool in ("blobsync", "blobsync-nocheck"):
        rss = [r.rss_mib for r in runs if r.tool == tool and r.rss_mib == r.rss_mib]  # r == r drops NaN
        if rss:
            ok = "PASS" if max(rss) <= limit else "FAIL"
            label = f"{tool} client peak RSS MiB (max of runs; the upload issue's bound, info)"
            rows.append([label, fmt(max(rss), 1), f"<= {limit:.0f}", ok, f"100 MiB + --memory-mb {budget:g}"])
    return rows


def report(src: Source, runs: Sequence[DownloadRun], tools: Sequence[str], st: DownloadSettings, markdown: bool,
           code: tuple[str, str]) -> str:  # fmt: skip
    wl = src.workload
    cols = COLUMNS["large"]
    argv_list = shlex.split(os.environ.get(ORIG_ARGV_ENV) or shlex.join(sys.orig_argv))
    argv = shlex.join([Path(argv_list[0]).name, *argv_list[1:]])  # interpreter by name: its install path is noise
    parts: list[str] = []
    if markdown:
        parts += [f"#### Download: {wl.description}", "", "Command:", "", "```", argv, "```", ""]
        parts += machine_info(st, *code)
        shown = rclone_command("rclone", "<tmp>/rclone.conf", src.blob, f"<tmp>/dl/{OUT_NAME}", "<tmp>", st)
        rclone_cmd = shlex.join(["rclone", *shown[1:]])  # the binary by name: its install path is noise
        rclone_ver = _out([st.rclone, "version"]).splitlines()[0] if any(t.startswith("rclone") for t in tools) else ""
        parts += [
            f"- rclone: {rclone_ver or 'not run'} (Debian package)",
            f"- Blob: uploaded once per fresh Azurite with the plain SDK (default 4 MiB blocks), then its Content-MD5 "
            f"set with `set_http_headers`; every tool downloads it to `{OUT_NAME}` in a fresh temp dir on ext4.",
            "- blobsync: `blobsync cp URL <tmp>/dl/out.bin --quiet --journal <tmp>/j.db` (default: whole-file MD5 "
            "checked against Content-MD5; fsync + rename at the end); `blobsync-nocheck` adds `--check-md5 NoCheck`"
            + (f"; extra args `{shlex.join(st.blobsync_args)}`" if st.blobsync_args else ""),
            f"- sdk: sync `BlobClient.download_blob(max_concurrency={SDK_CONCURRENCY}).readinto(file)`, SDK defaults "
            "(first GET 32 MiB, then 4 MiB ranges; no MD5 check, no fsync)",
            f"- rclone: `{rclone_cmd}` with a config of `type = azureblob`, `use_emulator = true`, "
            "`endpoint = http://127.0.0.1:PORT/devstoreaccount1`; multi-thread (the blob is above the 250 MiB "
            "cutoff), each stream writing its own part of a preallocated file; rclone 1.60 does NOT check the MD5 "
            "after a multi-thread download (its debug log: `Src hash empty - aborting Dst hash check`); no fsync",
            "- rclone-1stream: the same with `--multi-thread-streams 0`: one GET, MD5 computed as the bytes arrive "
            "and checked against Content-MD5 (a wrong Content-MD5 fails it); no fsync",
            "- Every download is compared with the source by SHA-256 after the tool exits (not timed); a mismatch "
            "makes the run invalid.",
            "- Wall time runs from fork to exit of the tool's process (start-up included). Client CPU and peak RSS "
            "are the tool process's own wait4 rusage, via a ~8 MiB launcher; Azurite CPU is from /proc/<pid>/stat "
            "before/after the run.",
            "",
        ]
    else:
        parts += [f"Download: {wl.description}", f"Command: {argv}", f"blobsync code: {code[0]}", SERVER_NOTE]
        if code[0] != code[1]:
            parts += [f"WARNING: blobsync's code changed during the runs, now {code[1]}"]
        parts += [""]

    med: dict[str, dict[str, float] | None] = {t: medians(runs, wl, t) for t in tools}
    rows = []
    for t in tools:
        m = med[t]
        kept = [r for r in runs if r.tool == t and not r.discarded]
        dropped = sum(r.discarded for r in runs if r.tool == t)
        counts = f"{sum(r.valid for r in kept)}/{len(kept)}" + (f" (+{dropped} noisy re-run)" if dropped else "")
        rows.append([t, counts, *(fmt(m[k], d) if m else "n/a" for k, _, d in cols)])
    heads = ["Tool", "Valid runs", *(h for _, h, _ in cols)]
    parts += ["Medians per tool (each column's own median over the valid runs; every figure partly server-bound):"]
    parts += ["", render(heads, rows, markdown), ""]
    peer = faster_peer(med)
    parts += [f"Against the target (ratios are of the medians; faster peer: {peer or 'n/a'}):", ""]
    parts += [render(["Check", "Measured", "Target", "Verdict", "Context"], target_rows(med, runs, st), markdown), ""]

    heads = ["Round", "Tool", *(h for _, h, _ in cols), "Azurite peak RSS MiB", "Valid"]
    rows = []
    for r in runs:
        d = derived(r, wl)
        if not r.valid:
            d |= dict.fromkeys(("mb_s", "mib_s", "cpu_s_gib"), float("nan"))  # the bytes did not all arrive
        valid = "yes" if r.valid else "NO"
        if r.discarded:
            valid = "discarded (noisy)"
        elif d["other_pct"] > st.noisy_pct:
            valid += " (noisy)"
        rows.append([str(r.round), r.tool, *(fmt(d[k], p) for k, _, p in cols), fmt(r.azurite_rss_mib, 0), valid])
    parts += ["All runs, in the order they ran (tool order rotates each round):", "", render(heads, rows, markdown), ""]
    for r in runs:
        if not r.valid:
            parts += [f"- Run {r.round} {r.tool} INVALID: {r.error.splitlines()[0] if r.error else '?'}"]
        if r.leftovers:
            parts += [f"- Run {r.round} {r.tool} left other files next to the download: {r.leftovers}"]
    if markdown:
        parts += ["", f"_{SERVER_NOTE}_"]
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------------
# SDK child (runs in its own process, started by run_measured)
# --------------------------------------------------------------------------------------------------
def sdk_child(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog=f"bench_download.py {CHILD_MODE}")
    p.add_argument("container")
    p.add_argument("blob")
    p.add_argument("out", type=Path)
    a = p.parse_args(argv)
    from azure.storage.blob import BlobClient

    client = BlobClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"], a.container, a.blob)
    with a.out.open("wb") as f:
        client.download_blob(max_concurrency=SDK_CONCURRENCY).readinto(f)
    return 0


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench_download.py",
        description=(
            "Download benchmark: blobsync vs the azure-storage-blob SDK vs rclone, one 1 GiB blob, a fresh "
            "in-memory Azurite per run (127.0.0.1 only). Each run: start Azurite, upload the blob with the SDK and "
            "set its Content-MD5, run ONE tool in a child process to download it into a fresh temp dir, measure wall "
            "time, the child's CPU and peak RSS (wait4) and Azurite's CPU, compare the download with the source by "
            "SHA-256, stop Azurite. Run by hand; never in CI. " + SERVER_NOTE
        ),
    )
    p.add_argument("--repeat", type=int, default=3, help="rounds; each round runs every tool once (default 3)")
    p.add_argument(
        "--tools", default=",".join(TOOLS), help=f"comma-separated subset of {','.join(TOOLS)} (default: all)"
    )  # fmt: skip
    p.add_argument("--markdown", action="store_true", help="print tables ready for bench/RESULTS.md")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a tool run is killed (default 600)")
    p.add_argument("--memory-mb", type=float, help="pass --memory-mb to blobsync (default: its own, 256)")
    p.add_argument(
        "--blobsync-args",
        default="",
        help="extra blobsync cp options for experiments, one shell-quoted string (e.g. '--concurrency 8')",
    )
    p.add_argument("--rclone", default=shutil.which("rclone") or "rclone", help="rclone binary (default: from PATH)")
    p.add_argument(
        "--rclone-streams",
        type=int,
        default=8,
        help="rclone --multi-thread-streams (default 8: fastest of 4/8/16 here)",
    )
    p.add_argument("--rclone-args", default="", help="extra rclone options, one shell-quoted string")
    p.add_argument(
        "--cache-dir", type=Path, default=DEFAULT_CACHE, help=f"generated source file (default {DEFAULT_CACHE})"
    )
    p.add_argument("--size-mib", type=int, default=1024, help="size of the blob in MiB (default 1024)")
    p.add_argument("--python", type=Path, default=VENV_PYTHON, help="interpreter for the SDK child (default .venv)")
    p.add_argument("--json", type=Path, help="also write every run's raw measurements to this file")
    p.add_argument(
        "--max-background",
        type=float,
        default=0.25,
        help="before each run, wait while other processes use more than this many cores (default 0.25)",
    )
    p.add_argument(
        "--noisy-pct",
        type=float,
        default=NOISY_OTHER_PCT,
        help=f"a run while other processes used more than this %% of a core is noisy (default {NOISY_OTHER_PCT:g})",
    )
    p.add_argument("--noisy-retries", type=int, default=2, help="re-runs of a noisy run before keeping it (default 2)")
    p.add_argument("--idle-wait", type=float, default=900.0, help="longest wait for a quiet machine, s (default 900)")
    p.add_argument("--keep-temp", action="store_true", help="keep each run's temp dir (logs, journal) for debugging")
    a = p.parse_args(argv)
    a.tools = [t.strip() for t in a.tools.split(",") if t.strip()]
    if bad := [t for t in a.tools if t not in TOOLS]:
        p.error(f"unknown tool(s) {', '.join(bad)}; choose from {', '.join(TOOLS)}")
    if a.repeat < 1:
        p.error("--repeat must be at least 1")
    return a


def ensure_sdk_importable() -> None:
    """The parent needs the SDK (seeding the blob): re-run this file under the project venv if it is missing."""
    try:
        import azure.storage.blob  # noqa: F401
    except ImportError:
        # Compare prefixes, not executables: the venv's python is a symlink to the very same interpreter binary.
        if VENV_PYTHON.exists() and Path(sys.prefix).resolve() != VENV_PYTHON.parents[1].resolve():
            os.environ.setdefault(ORIG_ARGV_ENV, shlex.join(sys.orig_argv))
            os.execv(VENV_PYTHON, [str(VENV_PYTHON), str(Path(__file__).resolve()), *sys.argv[1:]])
        raise BenchError(
            "azure-storage-blob is not importable; run scripts/setup.sh and use .venv/bin/python"
        ) from None


def preflight(tools: Sequence[str], st: DownloadSettings) -> None:
    if not os.access(AZURITE_BIN, os.X_OK):
        raise BenchError(f"Azurite not found at {AZURITE_BIN}: run scripts/setup.sh to install it project-locally")
    if any(t.startswith("blobsync") for t in tools) and not os.access(BLOBSYNC_BIN, os.X_OK):
        raise BenchError(f"blobsync CLI not found at {BLOBSYNC_BIN}: run scripts/setup.sh")
    if "sdk" in tools and not os.access(st.python, os.X_OK):
        raise BenchError(f"no Python at {st.python} for the SDK child: run scripts/setup.sh or pass --python")
    if any(t.startswith("rclone") for t in tools) and not shutil.which(st.rclone):
        raise BenchError(f"rclone not found ({st.rclone}): apt-get install -y rclone, or pass --rclone")


def _sigterm(signum: int, frame: object) -> NoReturn:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop Azurite and the child


def main(argv: Sequence[str]) -> int:
    if argv[:1] == [CHILD_MODE]:
        return sdk_child(argv[1:])
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    st = DownloadSettings(
        python=a.python,
        timeout=a.timeout,
        sdk_mode="threads",  # unused here: one blob, the sync client's own max_concurrency
        memory_mb=a.memory_mb,
        blobsync_args=shlex.split(a.blobsync_args),
        keep_temp=a.keep_temp,
        max_background=a.max_background,
        noisy_pct=a.noisy_pct,
        noisy_retries=a.noisy_retries,
        idle_wait=a.idle_wait,
        rclone=a.rclone,
        rclone_streams=a.rclone_streams,
        rclone_args=shlex.split(a.rclone_args),
    )
    runs: list[DownloadRun] = []
    interrupted = False
    try:
        ensure_sdk_importable()
        preflight(a.tools, st)
        a.cache_dir.mkdir(parents=True, exist_ok=True)
        wl = large_workload(a.cache_dir, a.size_mib)
        src = hash_source(wl)  # also puts the source in the page cache for the uploads that seed each Azurite
        code_before = src_state()
        n = len(a.tools)
        for rnd in range(1, a.repeat + 1):
            # Round-robin, rotated each round, so slow drift and position effects are shared by all tools.
            for tool in [a.tools[(i + rnd - 1) % n] for i in range(n)]:
                print(f"bench: round {rnd}/{a.repeat}: {tool} downloads {wl.description} ...", file=sys.stderr)
                for attempt in range(st.noisy_retries + 1):
                    run = one_run(rnd, tool, src, st)
                    runs.append(run)
                    d = derived(run, wl)
                    print(
                        f"bench:   {'ok' if run.valid else 'INVALID'}: wall {fmt(d['wall_s'])} s,"
                        f" {fmt(d['mb_s'], 1)} MB/s, client CPU {fmt(d['cpu_s'])} s, RSS {fmt(d['rss_mib'], 1)} MiB,"
                        f" Azurite CPU {fmt(d['az_cpu_s'])} s, other CPU {fmt(d['other_pct'], 0)}%"
                        + (f", left behind: {run.leftovers}" if run.leftovers else ""),
                        file=sys.stderr,
                        flush=True,
                    )
                    if run.error:
                        print(f"bench:   {run.error}", file=sys.stderr, flush=True)
                    # Another process stole CPU mid-run (on 2 cores that skews everything): measure again.
                    if run.valid and d["other_pct"] > st.noisy_pct and attempt < st.noisy_retries:
                        run.discarded = True
                        print("bench:   noisy (other processes were busy); discarding and re-running", file=sys.stderr)
                        continue
                    break
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Azurite and the child are already stopped by the finally blocks; still report what was measured.
        print("bench: interrupted; reporting the runs completed so far", file=sys.stderr)
        interrupted = True
    if not runs:
        return 130 if interrupted else 2
    if a.json:
        meta = asdict(wl) | {"src": str(wl.src), "sha256": src.sha256, "content_md5": src.md5.hex()}
        a.json.write_text(json.dumps({"workload": meta, "runs": [asdict(r) for r in runs]}, indent=2))
    print(report(src, runs, a.tools, st, a.markdown, (code_before, src_state())))
    if interrupted:
        return 130
    return 0 if all(r.valid for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
