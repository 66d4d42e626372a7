"""Measuring one tool process: wall time, CPU and peak RSS (wait4 rusage), Azurite's CPU, background noise."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def wall_and_cpu(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one child run (its CPU from wait4); a failure raises RuntimeError with its stderr."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{cmd[:3]} failed: {err.decode(errors='replace')[-1500:]}")
    return wall, usage.ru_utime + usage.ru_stime


def die_with_parent() -> None:
    # Runs between fork and exec: the kernel SIGKILLs the child if the benchmark dies without cleaning up
    # (e.g. it is SIGKILLed itself), so no node or tool process is ever left behind.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def system_busy_seconds() -> float:
    """CPU seconds all cores have spent not idle since boot (from /proc/stat), to expose background load."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]  # guest time is already inside user
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK


def background_cores(sample_s: float = 1.0) -> float:
    t0, b0 = time.monotonic(), system_busy_seconds()
    time.sleep(sample_s)  # a sampling window, not a synchronisation sleep
    return (system_busy_seconds() - b0) / (time.monotonic() - t0)


def wait_for_quiet(max_cores: float, patience_s: float) -> float:
    """Hold the next run while something else (a test suite, a build) keeps the 2 cores busy; return the load."""
    if max_cores <= 0 or patience_s <= 0:
        return float("nan")  # noise guard off (smoke runs)
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
    return busy


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


def process_cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of one process (all its threads), NaN once it is gone."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = rest[rest.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


class ServerWatch:
    """The server's CPU sampled while a tool runs: how long it sat idle at the start (the tool starting up) and at
    the end (the tool finishing alone), and how busy it was in between. On two shared cores a tool's wall time is
    roughly its idle start + the server's CPU for its requests + its idle tail; this says which part differs."""

    MARGIN_S = 0.02  # two clock ticks: the server's own timers must not count as the tool's work

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.t0 = time.monotonic()
        self.cpu0 = process_cpu_seconds(pid)
        self.samples: list[tuple[float, float]] = []

    def sample(self) -> None:
        cpu = process_cpu_seconds(self.pid)
        if cpu == cpu:
            self.samples.append((time.monotonic() - self.t0, cpu - self.cpu0))

    def summary(self, wall_s: float) -> dict[str, float]:
        """server_start_s: until the server had spent MARGIN_S of CPU; server_tail_s: from when it had spent all
        but MARGIN_S to the tool's exit; server_busy: its CPU over the time between, in cores."""
        self.sample()
        if not self.samples or self.samples[-1][1] < 3 * self.MARGIN_S or wall_s != wall_s:
            return {}
        total = self.samples[-1][1]
        first = next(t for t, c in self.samples if c >= self.MARGIN_S)
        last = next(t for t, c in self.samples if c >= total - self.MARGIN_S)
        last = min(last, wall_s)
        return {"server_start_s": first, "server_tail_s": max(0.0, wall_s - last),
                "server_busy": (total - 2 * self.MARGIN_S) / (last - first) if last > first else float("nan")}


def tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:].strip()
    except OSError:
        return ""


@dataclass
class ChildResult:
    returncode: int
    wall_s: float
    user_s: float
    sys_s: float
    maxrss_kib: int
    timed_out: bool
    killed_by_us: bool = False
    page_faults: int = 0  # minor + major, of the tool's process tree
    context_switches: int = 0  # voluntary + involuntary


# Forks and execs the measured command, reaps it with wait4 and writes wall time and rusage as JSON. It runs as
# `python -S -I -c` and imports almost nothing, so it stays a few MiB: see run_measured for why it exists.
LAUNCHER = """
import ctypes, json, os, sys, time
out, cmd = sys.argv[1], sys.argv[2:]
libc = ctypes.CDLL(None)
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: the tool dies with the launcher
    try:
        os.execvp(cmd[0], cmd)
    except BaseException as exc:
        sys.stderr.write(f"launcher: cannot run {cmd[0]}: {exc}\\n")
    os._exit(127)
with open(out + ".pid", "w") as f:
    f.write(str(pid))
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
with open(out, "w") as f:
    json.dump({"status": status, "wall": wall, "utime": ru.ru_utime, "stime": ru.ru_stime, "maxrss": ru.ru_maxrss,
               "faults": ru.ru_minflt + ru.ru_majflt, "switches": ru.ru_nvcsw + ru.ru_nivcsw}, f)
"""


def run_measured(
    cmd: Sequence[str],
    env: dict[str, str],
    cwd: Path,
    log: Path,
    timeout: float,
    kill_when: Callable[[], bool] | None = None,
    on_poll: Callable[[], None] | None = None,
) -> ChildResult:
    """Run `cmd` under the tiny launcher, which reaps it with wait4 (exact CPU and peak RSS); kill it after `timeout`.

    Why a launcher instead of wait4 here: Linux seeds a process's ru_maxrss with the high-water RSS of the memory
    image it replaced at exec, i.e. the RSS of whoever forked it. Forked straight from the benchmark (the SDK
    imported, listings done: 60-200 MiB) even /bin/true reports the benchmark's RSS. Forked from a ~10 MiB
    launcher, that floor sits far below any tool's own peak, so ru_maxrss is the tool's.

    `kill_when`, polled every 20 ms, SIGKILLs the tool once it returns True (the resume workload's crash);
    `on_poll` is called every 20 ms while the tool runs (a ServerWatch's sample).
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
            start_new_session=True,  # own group (launcher + tool): a timeout kills everything in it
            preexec_fn=die_with_parent,
        )
    timed_out = killed = False
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                timed_out = True
                break
            if kill_when is not None and kill_when():
                pid_file = Path(str(result) + ".pid")
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the tool only: the launcher reports it
                    killed = True
                kill_when = None
            if on_poll is not None:
                on_poll()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.02 if kill_when is not None or on_poll is not None else 0.05)
    finally:
        # Also on Ctrl-C/SIGTERM, and after a normal exit: grandchildren that outlived the tool must not
        # skew the next run or outlive the benchmark.
        if killed:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        kill_group(proc.pid)
        proc.wait()
    try:
        r = json.loads(result.read_text())
    except (OSError, ValueError):
        # Killed (timeout) or the launcher itself failed: no usage figures, only the exit status.
        return ChildResult(proc.returncode or -1, float("nan"), float("nan"), float("nan"), 0, timed_out, killed)
    return ChildResult(
        returncode=os.waitstatus_to_exitcode(r["status"]),
        wall_s=r["wall"],  # from just before fork to the tool's exit, excluding the launcher's own start
        user_s=r["utime"],
        sys_s=r["stime"],
        maxrss_kib=r["maxrss"],  # kilobytes on Linux
        timed_out=timed_out,
        killed_by_us=killed,
        page_faults=r.get("faults", 0),
        context_switches=r.get("switches", 0),
    )
