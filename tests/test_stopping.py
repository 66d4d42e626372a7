"""Stopping a job from outside: SIGTERM/SIGHUP to a background job of a script, Ctrl-C on a pty."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from blobsync.config import MiB
from conftest import ContainerHandle
from support.cli import blobsync_cmd, clean_env, random_file, run
from support.processes import kill_tree, on_a_terminal, read_terminal
from support.proxy import FaultProxy

SIZE = 8 * MiB + 3


def _args(tmp_path: Path, url: str) -> list[str]:
    return ["cp", str(tmp_path / "f.bin"), url, "--journal", str(tmp_path / "j.db"), "--block-size-mb", "1",
            "--concurrency", "2", "--quiet"]


def _as_from_cron() -> None:
    """The script's own start: SIGHUP and SIGTERM at their defaults, whatever this test run inherited (the suite
    itself may run under nohup, which leaves SIGHUP ignored in every child)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _ignored(pid: int, sig: signal.Signals) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    return bool(ignored & (1 << (sig - 1)))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _resume_completes(container: ContainerHandle, proxy: FaultProxy, tmp_path: Path, data: bytes, url: str) -> None:
    with sqlite3.connect(tmp_path / "j.db") as db:
        assert db.execute("select state from jobs").fetchone()[0] == "interrupted"
    proxy.clear_rules()
    proxy.release_holds()
    proxy.wait_idle()
    again = run(_args(tmp_path, url))
    assert again.returncode == 0, again.stderr
    assert container.download("f.bin") == data


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_background_job_of_a_script_stops_on_sigterm_and_sighup_and_ignores_sigint(
    stop: signal.Signals, container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = random_file(tmp_path / "f.bin", SIZE, seed=1)
    url = f"{proxy.endpoint()}/{container.name}/f.bin"
    proxy.hold_after("put_block", 2)
    # What a pipeline does: a non-interactive shell starts the job with '&' (bash then sets SIGINT to
    # ignored in the job) and later stops it with kill.
    script = '"$@" 2> "$ERR" & echo $!; wait $!; echo "rc=$?"'
    shell = subprocess.Popen(["bash", "-c", script, "bash", *blobsync_cmd(*_args(tmp_path, url))],
                             env=clean_env({"ERR": str(tmp_path / "err.txt")}), stdout=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=_as_from_cron)
    try:
        assert shell.stdout is not None
        pid = int(shell.stdout.readline())
        proxy.wait_for_held(1, timeout=60)
        assert _ignored(pid, signal.SIGINT)
        os.kill(pid, signal.SIGINT)  # inherited as ignored: stays ignored (nohup semantics)
        time.sleep(1.0)
        assert _alive(pid)
        os.kill(pid, stop)
        out, _ = shell.communicate(timeout=60)
    finally:
        kill_tree(shell.pid)
    err = (tmp_path / "err.txt").read_text()
    assert "rc=130" in out, (out, err)
    assert "interrupted" in err and "Traceback" not in err
    _resume_completes(container, proxy, tmp_path, data, url)


def test_a_job_started_under_nohup_keeps_sighup_ignored_and_stops_on_sigterm(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = random_file(tmp_path / "f.bin", SIZE, seed=3)
    url = f"{proxy.endpoint()}/{container.name}/f.bin"
    proxy.hold_after("put_block", 2)

    def under_nohup() -> None:
        _as_from_cron()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = subprocess.Popen(blobsync_cmd(*_args(tmp_path, url)), env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=under_nohup)
    try:
        proxy.wait_for_held(1, timeout=60)
        assert _ignored(proc.pid, signal.SIGHUP)
        proc.send_signal(signal.SIGHUP)  # the terminal went away: nohup's point is to keep running
        time.sleep(1.0)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        kill_tree(proc.pid)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    _resume_completes(container, proxy, tmp_path, data, url)


def test_ctrl_c_on_a_terminal_stops_the_job_resumably(container: ContainerHandle, proxy: FaultProxy,
                                                      tmp_path: Path) -> None:
    data = random_file(tmp_path / "f.bin", SIZE, seed=2)
    url = f"{proxy.endpoint()}/{container.name}/f.bin"
    proxy.hold_after("put_block", 2)
    cmd = blobsync_cmd(*_args(tmp_path, url))
    env = clean_env()
    with on_a_terminal(cmd, env) as term:
        proxy.wait_for_held(1, timeout=60)
        os.write(term.master, b"\x03")  # Ctrl-C: the terminal sends SIGINT to its foreground job
        output = read_terminal(term.master, 60)
    text = output.decode(errors="replace")
    assert term.exit_code == 130, text
    assert "interrupted" in text and "Traceback" not in text
    _resume_completes(container, proxy, tmp_path, data, url)
