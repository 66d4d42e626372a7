"""Child processes of the test run: start them as a user's shell would, and find the ones a test left behind."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# Children meant to outlive a test (the session's Azurite): never reported as left behind.
LONG_LIVED: set[int] = set()
# Python's own helper, started by the first process spawned with multiprocessing (a Dask LocalCluster's
# workers) and kept for the interpreter's lifetime: not something a test started.
_RUNTIME_HELPERS = ("multiprocessing.resource_tracker",)


def as_from_a_terminal() -> None:
    """preexec_fn: the signal dispositions of a command typed at a terminal.

    pytest may itself run with SIGINT ignored (a background job of a script), and children inherit that;
    a test that interrupts its child with SIGINT then waits forever. A test that means to check the
    inherited-ignore case starts its child through a shell instead."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(parent) and fields[0] != "Z":  # a zombie is gone already
            found.append(int(stat.parent.name))
    return found


def leftover_children() -> list[tuple[int, str]]:
    """This process's live children that no one meant to keep, with their command lines."""
    out = []
    for pid in _children(os.getpid()):
        if pid in LONG_LIVED:
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if any(helper in cmd for helper in _RUNTIME_HELPERS):
            LONG_LIVED.add(pid)
            continue
        out.append((pid, cmd))
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL a child and, if it leads a process group, everything in that group; then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.05)


def read_terminal(master: int, timeout: float = 60,
                  on_output: Callable[[bytes], None] | None = None) -> bytes:
    """Everything a child writes to its pty (`master`: our end), until it closes the terminal or `timeout`
    passes; `on_output(all_so_far)` after each piece, to answer prompts."""
    output = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            continue
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
        if on_output is not None:
            on_output(output)
    return output


@dataclass
class Terminal:
    master: int  # our end of the child's pty
    exit_code: int | None = None  # once the child has exited


@contextlib.contextmanager
def on_a_terminal(cmd: list[str], env: dict[str, str]) -> Iterator[Terminal]:
    """Run `cmd` with a pty as its terminal, in a session of its own, as a shell would (SIGINT at its default).
    Leaving the block waits for it and sets `exit_code`; on an error it is killed instead."""
    pid, master = pty.fork()
    if pid == 0:  # the child
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execve(cmd[0], cmd, env)
    term = Terminal(master)
    try:
        yield term
        _, status = os.waitpid(pid, 0)
        pid = 0
        term.exit_code = os.waitstatus_to_exitcode(status)
    finally:
        if pid:
            kill_tree(pid)
        os.close(master)
