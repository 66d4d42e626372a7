"""Benchmark blobsync uploads against the Azure SDK, one fresh in-memory Azurite per run (run by hand, never in CI)."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[1]
AZURITE_BIN = REPO / ".tools/azurite/node_modules/.bin/azurite-blob"
VENV_PYTHON = REPO / ".venv/bin/python"
BLOBSYNC_BIN = REPO / ".venv/bin/blobsync"
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "blobsync-bench-cache"

# Azurite's well-known development account (public, documented, not a secret).
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
HOST = "127.0.0.1"  # the only address this benchmark ever talks to

MB = 1_000_000
MiB = 1 << 20
GiB = 1 << 30
TOOLS = ("blobsync", "blobsync-nomd5", "sdk")
SDK_CONCURRENCY = 8
DEFAULT_MEMORY_MB = 256.0  # blobsync's default --memory-mb; the RSS target is 100 MiB above the budget
CHILD_MODE = "_sdk-child"  # hidden first argument: this file doubles as the SDK uploader child
ORIG_ARGV_ENV = "BLOBSYNC_BENCH_ORIG_ARGV"  # survives the re-exec under the venv so --markdown shows what was typed
SERVER_NOTE = (
    "Every figure is partly server-bound: Azurite (Node.js: one JavaScript thread plus a little GC/IO help) runs on "
    "the same 2-core machine and uses up to about one core, so client and server compete for CPU; see the Azurite "
    "CPU columns. "
    "Other CPU % is everything else on the machine during the run (ideally ~0)."
)

# Targets from the issue.
TARGET_NOMD5_RATIO = 1.15
TARGET_MD5_RATIO = 0.95
TARGET_CPU_S_PER_GIB = 3.0
TARGET_SMALL_RATIO = 2.0
RSS_HEADROOM_MIB = 100.0

# A run during which other processes used more than this share of a core is noisy: measured again, by default.
NOISY_OTHER_PCT = 20.0

_PR_SET_PDEATHSIG = 1
_CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    """A set-up problem the user must fix (missing Azurite, missing venv, ...)."""


# --------------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    name: str
    src: Path  # what the tools are pointed at: a file, or a folder uploaded recursively
    recursive: bool
    files: int
    total_bytes: int
    description: str


def _write_random(path: Path, size: int) -> None:
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 16 * MiB)
            f.write(os.urandom(n))  # random so no layer (Azurite, page cache, TCP) can compress or dedupe
            left -= n


def _publish(tmp: Path, final: Path) -> None:
    # Generate into a temp name and rename: an interrupted generation is never mistaken for a finished one.
    if final.exists():
        shutil.rmtree(final) if final.is_dir() else final.unlink()
    tmp.rename(final)


def large_workload(cache: Path, size_mib: int) -> Workload:
    label = "1GiB" if size_mib == 1024 else f"{size_mib}MiB"
    folder = cache / f"large-{label}"
    path = folder / f"large-{label}.bin"
    size = size_mib * MiB
    if not (path.is_file() and path.stat().st_size == size):
        print(f"bench: generating {path} ({size_mib} MiB of random bytes, once)", file=sys.stderr)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{path.name}.partial"
        _write_random(tmp, size)
        _publish(tmp, path)
    return Workload("large", path, False, 1, size, f"one {label} file of random bytes")


def small_workload(cache: Path, count: int, size_kib: int) -> Workload:
    folder = cache / f"small-{count}x{size_kib}KiB"
    marker = cache / f"small-{count}x{size_kib}KiB.complete"  # outside the folder so it is never uploaded
    size = size_kib * 1024
    if not marker.exists():
        print(f"bench: generating {folder} ({count} files of {size_kib} KiB, once)", file=sys.stderr)
        tmp = cache / f".small-{count}x{size_kib}KiB.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        for i in range(count):
            # A few nested folders (a/b/, 4 x 5 of them) so blob names carry real relative paths.
            sub = tmp / f"dir{i % 4}" / f"sub{(i // 4) % 5}"
            sub.mkdir(parents=True, exist_ok=True)
            _write_random(sub / f"file{i:05d}.bin", size)
        _publish(tmp, folder)
        marker.touch()
    return Workload(
        "small", folder, True, count, count * size, f"{count:,} files of {size_kib} KiB in 20 nested folders"
    )


# --------------------------------------------------------------------------------------------------
# Azurite
# --------------------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    # Runs between fork and exec: the kernel SIGKILLs the child if this benchmark dies without cleaning up
    # (e.g. it is SIGKILLed itself), so no node or uploader process is ever left behind.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def system_busy_seconds() -> float:
    """CPU seconds all cores have spent not idle since boot (from /proc/stat), to expose background load."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]  # guest time is already inside user
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK


def background_cores(sample_s: float = 1.0) -> float:
    t0, b0 = time.monotonic(), system_busy_seconds()
    time.sleep(sample_s)  # a sampling window, not a synchronisation sleep
    return (system_busy_seconds() - b0) / (time.monotonic() - t0)


def wait_for_quiet(max_cores: float, patience_s: float) -> None:
    """Hold the next run while something else (a test suite, a build) keeps the 2 cores busy."""
    deadline = time.monotonic() + patience_s
    busy = background_cores()
    warned = False
    while busy > max_cores and time.monotonic() < deadline:
        if not warned:
            print(f"bench:   background load {busy:.2f} cores > {max_cores:.2f}; waiting for it", file=sys.stderr)
            warned = True
        time.sleep(4.0)  # re-check interval
        busy = background_cores()
    if busy > max_cores:
        print(f"bench:   still {busy:.2f} cores busy after {patience_s:.0f} s; measuring anyway", file=sys.stderr)


def group_cpu_seconds(pgid: int) -> float:
    """User+system CPU seconds of every live process in a process group (plus reaped children of each)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # the process went away between listdir and read
        # The command name (field 2) may contain spaces and parentheses, so split after the last ')'.
        rest = raw[raw.rindex(")") + 2 :].split()
        if int(rest[2]) != pgid:  # rest[0] is field 3 (state): pgrp is field 5, utime..cstime are fields 14..17
            continue
        total += int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
    return total / _CLK_TCK


class Azurite:
    """One fresh, in-memory Azurite blob service on 127.0.0.1, in its own process group."""

    def __init__(self, workdir: Path, startup_timeout: float = 60.0) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def blob_endpoint(self) -> str:
        return f"http://{HOST}:{self.port}/{DEV_ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};"
            f"BlobEndpoint={self.blob_endpoint};"
        )

    @property
    def log(self) -> Path:
        return self.workdir / "azurite.log"

    def start(self) -> None:
        cmd = [
            str(AZURITE_BIN),
            "--blobHost", HOST,
            "--blobPort", str(self.port),
            "--inMemoryPersistence",  # nothing touches the disk, so the disk is never the bottleneck
            "--skipApiVersionCheck",  # the SDK may be newer than this Azurite release
            "--loose",  # ignore headers Azurite does not implement instead of failing the request
            "--silent",  # an access log line per request would cost Azurite CPU
            "--disableTelemetry",  # telemetry would try to reach the internet
        ]  # fmt: skip
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.workdir,  # Azurite's default location; it may write its debug/log files there
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: stop() kills node and anything it spawned
                preexec_fn=_die_with_parent,
            )
        try:
            self._wait_until_listening()
        except BaseException:
            self.stop()
            raise

    def _wait_until_listening(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"Azurite exited with code {self.proc.returncode}:\n{tail(self.log)}")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(1.0)
                if s.connect_ex((HOST, self.port)) == 0:
                    return
            if time.monotonic() > deadline:
                raise BenchError(f"Azurite did not listen on {HOST}:{self.port} within {self.startup_timeout:.0f} s")
            time.sleep(0.05)  # port polling interval

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return group_cpu_seconds(self.proc.pid)

    def peak_rss_mib(self) -> float:
        """Azurite's high-water RSS (VmHWM), to show how much the in-memory store holds."""
        assert self.proc is not None
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        _kill_group(proc.pid)  # SIGKILL whatever is left, including stragglers if the leader already exited
        proc.wait()


def tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:].strip()
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------------
# Measured child
# --------------------------------------------------------------------------------------------------
@dataclass
class ChildResult:
    returncode: int
    wall_s: float
    user_s: float
    sys_s: float
    maxrss_kib: int
    timed_out: bool


# Forks and execs the measured command, reaps it with wait4 and writes wall time and rusage as JSON. It runs as
# `python -S -I -c` and imports almost nothing, so it stays a few MiB: see run_measured for why it exists.
LAUNCHER = """
import ctypes, json, os, sys, time
out, cmd = sys.argv[1], sys.argv[2:]
libc = ctypes.CDLL(None)
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: the uploader dies with the launcher
    try:
        os.execv(cmd[0], cmd)
    except BaseException as exc:
        sys.stderr.write(f"launcher: cannot run {cmd[0]}: {exc}\\n")
    os._exit(127)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
with open(out, "w") as f:
    json.dump({"status": status, "wall": wall, "utime": ru.ru_utime, "stime": ru.ru_stime, "maxrss": ru.ru_maxrss}, f)
"""


def run_measured(cmd: Sequence[str], env: dict[str, str], cwd: Path, log: Path, timeout: float) -> ChildResult:
    """Run `cmd` under the tiny launcher, which reaps it with wait4 (exact CPU and peak RSS); kill it after `timeout`.

    Why a launcher instead of wait4 here: Linux seeds a process's ru_maxrss with the high-water RSS of the memory
    image it replaced at exec, i.e. the RSS of whoever forked it. Forked straight from this benchmark (the SDK
    imported, listings done: 60-200 MiB) even /bin/true reports the benchmark's RSS. Forked from a ~10 MiB
    launcher, that floor sits far below any Python uploader's own peak, so ru_maxrss is the uploader's.
    """
    result = log.with_suffix(".rusage.json")
    result.unlink(missing_ok=True)  # a stale file must never pass for this run's figures
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-S", "-I", "-c", LAUNCHER, str(result), *cmd],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own group (launcher + uploader): a timeout kills everything in it
            preexec_fn=_die_with_parent,
        )
    timed_out = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        # Also on Ctrl-C/SIGTERM, and after a normal exit: grandchildren that outlived the uploader must not
        # skew the next run or outlive the benchmark.
        _kill_group(proc.pid)
        proc.wait()
    try:
        r = json.loads(result.read_text())
    except (OSError, ValueError):
        # Killed (timeout) or the launcher itself failed: no usage figures, only the exit status.
        return ChildResult(proc.returncode or -1, float("nan"), float("nan"), float("nan"), 0, timed_out)
    return ChildResult(
        returncode=os.waitstatus_to_exitcode(r["status"]),
        wall_s=r["wall"],  # from just before fork to the uploader's exit, excluding the launcher's own start
        user_s=r["utime"],
        sys_s=r["stime"],
        maxrss_kib=r["maxrss"],  # kilobytes on Linux
        timed_out=timed_out,
    )


# --------------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------------
@dataclass
class Run:
    round: int
    tool: str
    wall_s: float = float("nan")
    cpu_s: float = float("nan")
    user_s: float = float("nan")
    sys_s: float = float("nan")
    rss_mib: float = float("nan")
    azurite_cpu_s: float = float("nan")
    azurite_rss_mib: float = float("nan")
    other_cpu_s: float = float("nan")  # everything else on the machine during the run (should be ~0)
    returncode: int | None = None
    valid: bool = False
    discarded: bool = False  # valid but noisy (other processes busy), replaced by a re-run; not in the medians
    error: str = ""
    blobs: int = 0
    blob_bytes: int = 0


@dataclass
class Settings:
    python: Path
    timeout: float
    sdk_mode: str  # only for many files: one large file always uses the sync client's own max_concurrency
    memory_mb: float | None
    blobsync_args: list[str]
    keep_temp: bool
    max_background: float
    noisy_pct: float
    noisy_retries: int
    idle_wait: float


def tool_command(tool: str, wl: Workload, url: str, tmp: Path, st: Settings) -> list[str]:
    if tool.startswith("blobsync"):
        cmd = [str(BLOBSYNC_BIN), "cp", str(wl.src), url]
        if wl.recursive:
            cmd.append("-r")
        if tool == "blobsync-nomd5":
            cmd.append("--no-put-md5")
        if st.memory_mb is not None:
            cmd += ["--memory-mb", f"{st.memory_mb:g}"]
        cmd += st.blobsync_args
        # A private journal per run: runs never see each other's jobs or resume each other.
        return [*cmd, "--quiet", "--journal", str(tmp / "journal.db")]
    if tool == "sdk":
        container = url.rstrip("/").rsplit("/", 1)[1]
        cmd = [str(st.python), str(Path(__file__).resolve()), CHILD_MODE, str(wl.src), container, "--mode", st.sdk_mode]
        return [*cmd, "--recursive"] if wl.recursive else cmd
    raise ValueError(f"unknown tool {tool!r}")


def verify(conn: str, container: str, wl: Workload) -> tuple[int, int]:
    """Count the blobs and sum their sizes with an independent SDK listing."""
    from azure.storage.blob import BlobServiceClient

    client = BlobServiceClient.from_connection_string(conn).get_container_client(container)
    count = size = 0
    for blob in client.list_blobs():
        count += 1
        size += int(blob.size)
    return count, size


def one_run(rnd: int, tool: str, wl: Workload, st: Settings) -> Run:
    from azure.storage.blob import BlobServiceClient

    run = Run(round=rnd, tool=tool)
    tmp = Path(tempfile.mkdtemp(prefix=f"blobsync-bench-{tool}-"))
    azurite = Azurite(tmp)
    try:
        azurite.start()
        container = f"bench-{wl.name}"
        BlobServiceClient.from_connection_string(azurite.connection_string).create_container(container)
        url = f"{azurite.blob_endpoint}/{container}/"  # trailing slash: the blob keeps the file's name
        env = dict(os.environ)
        env.update(
            AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string,
            XDG_STATE_HOME=str(tmp / "state"),  # nothing lands in the user's real state dir
            NO_PROXY=HOST,  # a proxy from the environment must never sit between client and Azurite
            no_proxy=HOST,
        )
        cmd = tool_command(tool, wl, url, tmp, st)
        wait_for_quiet(st.max_background, st.idle_wait)
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
        try:
            run.blobs, run.blob_bytes = verify(azurite.connection_string, container, wl)
        except Exception as exc:  # the check itself failing must not abort the other runs
            problems.append(f"verification listing failed: {exc!r}")
        else:
            if (run.blobs, run.blob_bytes) != (wl.files, wl.total_bytes):
                problems.append(
                    f"listing has {run.blobs} blobs / {run.blob_bytes} bytes, source has {wl.files} / {wl.total_bytes}"
                )
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
            shutil.rmtree(tmp, ignore_errors=True)
    return run


# --------------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------------
def fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x != x else f"{x:,.{digits}f}"  # x != x is the NaN test


def derived(run: Run, wl: Workload) -> dict[str, float]:
    w = run.wall_s
    return {
        "wall_s": w,
        "mb_s": wl.total_bytes / w / MB,
        "mib_s": wl.total_bytes / w / MiB,
        "files_s": wl.files / w,
        "cpu_s": run.cpu_s,
        "cpu_s_gib": run.cpu_s / (wl.total_bytes / GiB),
        "cpu_ms_file": run.cpu_s * 1000 / wl.files,
        "client_pct": 100 * run.cpu_s / w,
        "rss_mib": run.rss_mib,
        "az_cpu_s": run.azurite_cpu_s,
        "az_pct": 100 * run.azurite_cpu_s / w,
        "az_rss_mib": run.azurite_rss_mib,
        "other_pct": 100 * run.other_cpu_s / w,
    }


# (key, header, digits) per workload; the primary rate comes first so it reads left to right.
COLUMNS: dict[str, list[tuple[str, str, int]]] = {
    "large": [
        ("wall_s", "Wall s", 2),
        ("mb_s", "MB/s", 1),
        ("mib_s", "MiB/s", 1),
        ("cpu_s", "Client CPU s", 2),
        ("cpu_s_gib", "Client CPU s/GiB", 2),
        ("client_pct", "Client CPU %", 0),
        ("rss_mib", "Client peak RSS MiB", 1),
        ("az_cpu_s", "Azurite CPU s", 2),
        ("az_pct", "Azurite CPU %", 0),
        ("other_pct", "Other CPU %", 0),
    ],
    "small": [
        ("wall_s", "Wall s", 2),
        ("files_s", "files/s", 0),
        ("mb_s", "MB/s", 2),
        ("cpu_s", "Client CPU s", 2),
        ("cpu_ms_file", "Client CPU ms/file", 3),
        ("client_pct", "Client CPU %", 0),
        ("rss_mib", "Client peak RSS MiB", 1),
        ("az_cpu_s", "Azurite CPU s", 2),
        ("az_pct", "Azurite CPU %", 0),
        ("other_pct", "Other CPU %", 0),
    ],
}


def render(headers: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def medians(runs: Sequence[Run], wl: Workload, tool: str) -> dict[str, float] | None:
    ok = [derived(r, wl) for r in runs if r.tool == tool and r.valid and not r.discarded]
    if not ok:
        return None
    # Each metric's own median (not "the median run"), over valid runs only.
    return {k: statistics.median(d[k] for d in ok) for k in ok[0]}


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def target_rows(
    wl: Workload, med: dict[str, dict[str, float] | None], runs: Sequence[Run], st: Settings
) -> list[list[str]]:
    rows: list[list[str]] = []
    sdk = med.get("sdk")
    rate, unit = ("mb_s", "MB/s") if wl.name == "large" else ("files_s", "files/s")

    def ratio_row(tool: str, target: float, label: str) -> None:
        m = med.get(tool)
        if m is None or sdk is None:
            missing = [t for t in (tool, "sdk") if t not in med]
            why = f"{' and '.join(missing)} not run" if missing else "no valid runs to compare"
            rows.append([label, "n/a", f">= {target:.2f}x", "n/a", why])
            return
        r = m[rate] / sdk[rate]
        note = (
            f"{fmt(m[rate], 1)} vs {fmt(sdk[rate], 1)} {unit}; Azurite CPU {m['az_pct']:.0f}% vs {sdk['az_pct']:.0f}%"
        )
        rows.append([label, f"{r:.2f}x", f">= {target:.2f}x", verdict(r >= target), note])

    if wl.name == "large":
        ratio_row("blobsync-nomd5", TARGET_NOMD5_RATIO, f"blobsync --no-put-md5 / sdk, {unit}")
        ratio_row("blobsync", TARGET_MD5_RATIO, f"blobsync (whole-file MD5) / sdk, {unit}")
        m = med.get("blobsync")
        if m is None:
            rows.append(["blobsync client CPU s/GiB", "n/a", f"<= {TARGET_CPU_S_PER_GIB:.1f}", "n/a", ""])
        else:
            ok = m["cpu_s_gib"] <= TARGET_CPU_S_PER_GIB
            rows.append(
                [
                    "blobsync (whole-file MD5) client CPU s/GiB",
                    fmt(m["cpu_s_gib"]),
                    f"<= {TARGET_CPU_S_PER_GIB:.1f}",
                    verdict(ok),
                    f"Azurite CPU {m['az_pct']:.0f}% of wall",
                ]
            )
    else:
        ratio_row("blobsync", TARGET_SMALL_RATIO, f"blobsync / sdk, {unit}")
        ratio_row("blobsync-nomd5", TARGET_SMALL_RATIO, f"blobsync --no-put-md5 / sdk, {unit} (info)")
    budget = st.memory_mb if st.memory_mb is not None else DEFAULT_MEMORY_MB
    limit = RSS_HEADROOM_MIB + budget  # blobsync reads --memory-mb as MiB (config.memory = 256 * MiB)
    for tool in ("blobsync", "blobsync-nomd5"):
        # Judge the worst run (valid or not), not the median: a memory ceiling must hold every time.
        rss = [r.rss_mib for r in runs if r.tool == tool and r.rss_mib == r.rss_mib]
        if not rss:
            continue
        rows.append(
            [
                f"{tool} client peak RSS MiB (max of runs)",
                fmt(max(rss), 1),
                f"<= {limit:.0f}",
                verdict(max(rss) <= limit),
                f"100 MiB + --memory-mb {budget:g}",
            ]
        )
    return rows


def _out(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def src_state() -> str:
    """Which blobsync code ran: the commit, plus a digest of uncommitted changes under src/ (read-only git)."""
    commit = _out(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    diff = _out(["git", "-C", str(REPO), "diff", "HEAD", "--", "src"])
    untracked = _out(["git", "-C", str(REPO), "ls-files", "--others", "--exclude-standard", "--", "src"])
    if not diff and not untracked:
        return commit
    digest = hashlib.sha1((diff + untracked).encode()).hexdigest()[:8]
    return f"{commit} + uncommitted changes in src/ (digest {digest})"


def machine_info(st: Settings, code_before: str, code_after: str) -> list[str]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = "unknown"
    with contextlib.suppress(OSError, IndexError, ValueError):
        kib = int(Path("/proc/meminfo").read_text().splitlines()[0].split()[1])
        mem = f"{kib / 1024 / 1024:.1f} GiB"
    nproc = len(os.sched_getaffinity(0))

    py = _out([str(st.python), "-c", "import platform; print(platform.python_version())"])
    # blobsync is installed editable and src/ is being worked on: say if the code changed mid-benchmark.
    code = code_before if code_before == code_after else f"{code_before}, CHANGED during the runs to {code_after}"

    def ver(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return [
        f"- Machine: nproc={nproc}, CPU: {model}, RAM {mem}, Linux {platform.release()}",
        f"- Python {py} ({st.python}), azure-storage-blob {ver('azure-storage-blob')}, aiohttp {ver('aiohttp')}",
        f"- blobsync {ver('blobsync')} at commit {code}",
        f"- Azurite {_out([str(AZURITE_BIN), '--version'])} (in-memory, fresh per run), Node.js {_out(['node', '-v'])}",
        f"- Note: {SERVER_NOTE}",
    ]


def report(
    wl: Workload, runs: list[Run], tools: Sequence[str], st: Settings, markdown: bool, code: tuple[str, str]
) -> str:
    cols = COLUMNS[wl.name]
    parts: list[str] = []
    argv_list = shlex.split(os.environ.get(ORIG_ARGV_ENV) or shlex.join(sys.orig_argv))
    argv = shlex.join([Path(argv_list[0]).name, *argv_list[1:]])  # interpreter by name: its install path is noise
    if markdown:
        parts += [f"#### Workload `{wl.name}`: {wl.description}", "", "Command:", "", "```", argv, "```", ""]
        parts += machine_info(st, *code)
        sdk_how = (
            "one sync `BlobClient.upload_blob(stream, overwrite=True, max_concurrency=8, validate_content=True)`"
            if wl.name == "large"
            else (
                "sync `upload_blob(data, overwrite=True, validate_content=True)` per file on a thread pool of 8"
                if st.sdk_mode == "threads"
                else "aio `upload_blob(data, overwrite=True, validate_content=True)` per file under a semaphore of 8"
            )
        )
        parts += [
            f"- SDK child: {sdk_how}, SDK default block sizes",
            "- Wall time runs from fork to exit of the tool's process, so it includes interpreter start-up and imports "
            "(about 0.3 s of wall and CPU for either tool here); the source is read once beforehand so it is in the "
            "page cache.",
            "- Client CPU and peak RSS are the tool process's own wait4 rusage, taken by a ~8 MiB launcher (forked "
            "from the benchmark itself, ru_maxrss would start at the benchmark's RSS); Azurite CPU is from "
            "/proc/<pid>/stat before/after the run.",
            "",
        ]
    else:
        parts += [f"Workload {wl.name}: {wl.description}", f"Command: {argv}", f"blobsync code: {code[0]}", SERVER_NOTE]
        if code[0] != code[1]:
            parts += [f"WARNING: blobsync's code changed during the runs, now {code[1]}"]
        parts += [""]

    heads = ["Tool", "Valid runs", *(h for _, h, _ in cols)]
    med: dict[str, dict[str, float] | None] = {t: medians(runs, wl, t) for t in tools}
    rows = []
    for t in tools:
        m = med[t]
        kept = [r for r in runs if r.tool == t and not r.discarded]
        dropped = sum(r.discarded for r in runs if r.tool == t)
        counts = f"{sum(r.valid for r in kept)}/{len(kept)}" + (f" (+{dropped} noisy re-run)" if dropped else "")
        rows.append([t, counts, *(fmt(m[k], d) if m else "n/a" for k, _, d in cols)])
    parts += ["Medians per tool (each column's own median over the valid runs):", "", render(heads, rows, markdown), ""]

    parts += ["Against the targets (ratios are of the medians):", ""]
    parts += [
        render(["Check", "Measured", "Target", "Verdict", "Context"], target_rows(wl, med, runs, st), markdown),
        "",
    ]

    heads = ["Round", "Tool", *(h for _, h, _ in cols), "Azurite peak RSS MiB", "Valid"]
    rows = []
    for r in runs:
        d = derived(r, wl)
        if not r.valid:
            # Per-byte and per-file rates assume the whole workload arrived, which an invalid run did not.
            d |= dict.fromkeys(("mb_s", "mib_s", "files_s", "cpu_s_gib", "cpu_ms_file"), float("nan"))
        rows.append(
            [
                str(r.round),
                r.tool,
                *(fmt(d[k], p) for k, _, p in cols),
                fmt(r.azurite_rss_mib, 0),
                "discarded (noisy)"
                if r.discarded
                else ("yes" if r.valid else "NO") + (" (noisy)" if d["other_pct"] > st.noisy_pct else ""),
            ]
        )
    parts += ["All runs, in the order they ran (tool order rotates each round):", "", render(heads, rows, markdown), ""]
    bad = [r for r in runs if not r.valid]
    for r in bad:
        parts += [f"- Run {r.round} {r.tool} INVALID: {r.error.splitlines()[0] if r.error else '?'}"]
    if markdown:
        parts += ["", f"_{SERVER_NOTE}_"]
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------------
# SDK child (runs in its own process, started by run_measured)
# --------------------------------------------------------------------------------------------------
def _sources(src: Path, recursive: bool) -> list[tuple[str, Path]]:
    if not recursive:
        return [(src.name, src)]
    return sorted((p.relative_to(src).as_posix(), p) for p in src.rglob("*") if p.is_file())


def sdk_child(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog=f"bench_upload.py {CHILD_MODE}")
    p.add_argument("src", type=Path)
    p.add_argument("container")
    p.add_argument("--recursive", action="store_true")
    p.add_argument("--mode", choices=("threads", "aio"), default="threads")
    a = p.parse_args(argv)
    conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
    items = _sources(a.src, a.recursive)
    if len(items) == 1 and not a.recursive:
        from azure.storage.blob import BlobServiceClient

        name, path = items[0]
        blob = BlobServiceClient.from_connection_string(conn).get_blob_client(a.container, name)
        with path.open("rb") as f:
            blob.upload_blob(
                f, length=path.stat().st_size, overwrite=True, max_concurrency=SDK_CONCURRENCY, validate_content=True
            )
        return 0
    if a.mode == "threads":
        from concurrent.futures import ThreadPoolExecutor

        from azure.storage.blob import ContainerClient

        # One client shared by the threads: one connection pool (requests' default of 10 >= 8 threads).
        cc = ContainerClient.from_connection_string(conn, a.container)

        def put(item: tuple[str, Path]) -> None:
            cc.upload_blob(item[0], item[1].read_bytes(), overwrite=True, validate_content=True)

        with ThreadPoolExecutor(SDK_CONCURRENCY) as pool:
            for _ in pool.map(put, items):  # iterating re-raises the first upload error
                pass
        return 0

    import asyncio

    from azure.storage.blob.aio import ContainerClient as AioContainerClient

    async def main() -> None:
        sem = asyncio.Semaphore(SDK_CONCURRENCY)
        async with AioContainerClient.from_connection_string(conn, a.container) as cc:

            async def put(name: str, path: Path) -> None:
                async with sem:
                    await cc.upload_blob(name, path.read_bytes(), overwrite=True, validate_content=True)

            await asyncio.gather(*(put(n, p) for n, p in items))

    asyncio.run(main())
    return 0


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench_upload.py",
        description=(
            "Upload benchmark: blobsync vs the azure-storage-blob SDK against a fresh in-memory Azurite per run "
            "(127.0.0.1 only). Each run: start Azurite, create a container, run ONE tool on ONE workload in a "
            "child process, measure wall time, the child's CPU and peak RSS (wait4) and Azurite's CPU, verify "
            "the upload with an independent listing, stop Azurite. Run by hand; never in CI. " + SERVER_NOTE
        ),
    )
    p.add_argument(
        "--workload", choices=("large", "small"), required=True, help="large: one 1 GiB file; small: 2,000 x 16 KiB"
    )
    p.add_argument("--repeat", type=int, default=3, help="rounds; each round runs every tool once (default 3)")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated subset of {','.join(TOOLS)}")
    p.add_argument("--markdown", action="store_true", help="print tables ready for bench/RESULTS.md")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a tool run is killed (default 600)")
    p.add_argument(
        "--sdk-mode",
        choices=("threads", "aio"),
        default="aio",
        help="how the SDK uploads many files: aio client + semaphore of 8 (default: faster and leaner here than a "
        "sync client on a thread pool of 8) or threads",
    )
    p.add_argument("--memory-mb", type=float, help="pass --memory-mb to blobsync (default: its own, 256)")
    p.add_argument(
        "--blobsync-args",
        default="",
        help="extra blobsync cp options for experiments, one shell-quoted string (e.g. '--concurrency 8')",
    )
    p.add_argument(
        "--cache-dir", type=Path, default=DEFAULT_CACHE, help=f"generated workloads (default {DEFAULT_CACHE})"
    )
    p.add_argument("--large-mib", type=int, default=1024, help="size of the large file in MiB (default 1024)")
    p.add_argument("--small-files", type=int, default=2000, help="number of small files (default 2000)")
    p.add_argument("--small-kib", type=int, default=16, help="size of each small file in KiB (default 16)")
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
    """The parent needs the SDK (container creation, verification): re-run under the project venv if missing."""
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


def preflight(tools: Sequence[str], st: Settings) -> None:
    if not os.access(AZURITE_BIN, os.X_OK):
        raise BenchError(f"Azurite not found at {AZURITE_BIN}: run scripts/setup.sh to install it project-locally")
    if any(t.startswith("blobsync") for t in tools) and not os.access(BLOBSYNC_BIN, os.X_OK):
        raise BenchError(f"blobsync CLI not found at {BLOBSYNC_BIN}: run scripts/setup.sh")
    if "sdk" in tools and not os.access(st.python, os.X_OK):
        raise BenchError(f"no Python at {st.python} for the SDK child: run scripts/setup.sh or pass --python")


def _sigterm(signum: int, frame: object) -> NoReturn:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop Azurite and the child


def main(argv: Sequence[str]) -> int:
    if argv[:1] == [CHILD_MODE]:
        return sdk_child(argv[1:])
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    st = Settings(
        python=a.python,
        timeout=a.timeout,
        sdk_mode=a.sdk_mode,
        memory_mb=a.memory_mb,
        blobsync_args=shlex.split(a.blobsync_args),
        keep_temp=a.keep_temp,
        max_background=a.max_background,
        idle_wait=a.idle_wait,
        noisy_pct=a.noisy_pct,
        noisy_retries=a.noisy_retries,
    )
    runs: list[Run] = []
    interrupted = False
    try:
        ensure_sdk_importable()
        preflight(a.tools, st)
        a.cache_dir.mkdir(parents=True, exist_ok=True)
        wl = (
            large_workload(a.cache_dir, a.large_mib)
            if a.workload == "large"
            else small_workload(a.cache_dir, a.small_files, a.small_kib)
        )
        # Read the source once so every tool (including the first) starts with it in the page cache.
        for _, path in _sources(wl.src, wl.recursive):
            with path.open("rb") as f:
                while f.read(16 * MiB):
                    pass
        code_before = src_state()
        n = len(a.tools)
        for rnd in range(1, a.repeat + 1):
            # Round-robin, rotated each round, so slow drift and position effects are shared by all tools.
            order = [a.tools[(i + rnd - 1) % n] for i in range(n)]
            for tool in order:
                print(f"bench: round {rnd}/{a.repeat}: {tool} on {wl.name} ...", file=sys.stderr, flush=True)
                for attempt in range(st.noisy_retries + 1):
                    run = one_run(rnd, tool, wl, st)
                    runs.append(run)
                    d = derived(run, wl)
                    status = "ok" if run.valid else "INVALID"
                    rate = f"{fmt(d['mb_s'], 1)} MB/s" if wl.name == "large" else f"{fmt(d['files_s'], 0)} files/s"
                    print(
                        f"bench:   {status}: wall {fmt(d['wall_s'])} s, {rate}, client CPU {fmt(d['cpu_s'])} s,"
                        f" RSS {fmt(d['rss_mib'], 1)} MiB, Azurite CPU {fmt(d['az_cpu_s'])} s,"
                        f" other CPU {fmt(d['other_pct'], 0)}%",
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
        a.json.write_text(
            json.dumps({"workload": asdict(wl) | {"src": str(wl.src)}, "runs": [asdict(r) for r in runs]}, indent=2)
        )
    print(report(wl, runs, a.tools, st, a.markdown, (code_before, src_state())))
    if interrupted:
        return 130
    return 0 if all(r.valid for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
