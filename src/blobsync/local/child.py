"""One side of a sync's index made by a process of its own (a large walk, a blob-to-blob sync's source listing): the
process is spawned, writes a scratch index file this process made, counts what it has done in shared memory, answers
through a pipe, is killed if its caller is cancelled, and dies with this process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

# Only the command (a process of blobsync's own) starts one unasked: a library call leaves its host alone, and a
# host script without a __main__ guard would be run again by the new process (multiprocessing's spawn imports it).
_OWN_PROCESS = False


class ChildUnavailable(OSError):
    """No process could be started here (no shared memory, no pipes, a sandbox): the caller does the work itself."""


def own_process() -> None:
    """Let this process hand large walks and listings to processes of their own (the command's entry point)."""
    global _OWN_PROCESS
    _OWN_PROCESS = True


def may_spawn(env: dict[str, str] | os._Environ[str], forced_by: str) -> bool | None:
    """Whether a process of its own may be started: True or False where the variable `forced_by` says 1 or 0 (tests;
    a host where spawning fails), False outside the command or on one core, else None (the caller's measure
    decides)."""
    forced = env.get(forced_by, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if not _OWN_PROCESS or (os.cpu_count() or 1) < 2:
        return False
    return None


@contextlib.asynccontextmanager
async def scratch_file(folder: Path, prefix: str) -> AsyncIterator[Path]:
    """An empty index file for a child to write, made and always removed here: a child killed halfway (a Ctrl-C)
    cannot leave it behind."""
    fd, made = tempfile.mkstemp(prefix=prefix, suffix=".db", dir=folder)
    os.close(fd)
    try:
        yield Path(made)
    finally:
        Path(made).unlink(missing_ok=True)


async def run_child(target: Callable[..., None], args: tuple[Any, ...], name: str,
                    seen: Callable[[int], None]) -> tuple[str, Any]:
    """`target(conn, count, *args)` in a spawned process, from its start to its answer ('ok' or 'error', and what
    it sent); `seen` is told of what it counted as it goes. Killed if this is cancelled; ChildUnavailable where no
    process can be started."""
    import multiprocessing  # loaded by the runs that need it, not by every command's start

    ctx = multiprocessing.get_context("spawn")  # never fork a process with an event loop and threads
    try:
        here, there = ctx.Pipe(duplex=False)
        count = ctx.Value("q", 0, lock=False)
        proc = ctx.Process(target=target, name=name, daemon=True, args=(there, count, *args))
        proc.start()
    except OSError as exc:
        raise ChildUnavailable(f"cannot start a process: {exc}") from exc
    there.close()
    loop = asyncio.get_running_loop()
    try:
        reply = loop.run_in_executor(None, _receive, here)
        told = 0
        while True:
            done, _ = await asyncio.wait([reply], timeout=0.25)
            if count.value > told:
                seen(count.value - told)
                told = count.value
            if done:
                return reply.result()
    finally:
        if proc.is_alive():
            proc.kill()
        await loop.run_in_executor(None, proc.join)
        here.close()


def _receive(conn: Connection) -> tuple[str, Any]:
    try:
        return conn.recv()  # type: ignore[no-any-return]
    except (EOFError, OSError):
        return "error", "its process ended without an answer"


def child_started() -> None:
    """What a child does first: a Ctrl-C reaches the whole process group, and the parent stops it; it dies with
    its parent where the platform allows; its collector and allocator are tuned as the command's own (cli.main:
    a listing or a walk makes objects by the million that die young, and takes page bodies of megabytes)."""
    import gc

    from blobsync.local.platform import tune_malloc

    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    tune_malloc()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
