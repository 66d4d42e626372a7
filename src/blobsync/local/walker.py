"""A sync's local side as index entries, walked in this process or, for a large tree, in a process of its own
writing a scratch index file: the walk (a stat per file) then runs on another core than the listing it is
compared with, which one process's interpreter lock kept on one core between them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blobsync.errors import SourceError
from blobsync.filters import Filters
from blobsync.journal.index import Entry, SyncIndex
from blobsync.local.files import SkippedEntry, SourceFile, local_rel, walk

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

# A tree this large at its top (folders, or files) is walked in a process of its own: starting one costs ~0.2 s
# of CPU, which a walk of 10^5 files repays and a walk of 10^4 does not.
PROCESS_FOLDERS = 64
PROCESS_FILES = 20_000
_WALK_PROCESS = "BLOBSYNC_WALK_PROCESS"  # 1: always, 0: never (tests; a host where spawning fails)
# Only the command (a process of blobsync's own) starts one unasked: a library call leaves its host alone, and a
# host script without a __main__ guard would be run again by the new process (multiprocessing's spawn imports it).
_OWN_PROCESS = False


def own_process() -> None:
    """Let this process walk large trees in a process of their own (the `blobsync` command's entry point)."""
    global _OWN_PROCESS
    _OWN_PROCESS = True


def tree_entries(root: Path, filters: Filters, *, follow_symlinks: bool, upload: bool,
                 skipped: Callable[[SkippedEntry], None]) -> Iterator[Entry]:
    """Every file under `root` the filters take, as an index entry named as the other side names it (a source
    file as the service will store it; a local target as it is), and every entry skipped (to `skipped`)."""
    # Folders nothing could match in are not listed (--recursive=false lists one folder). One whose name has a
    # backslash is, since its files are compared under names with '/' there.
    enters = filters.enters if filters.active else (lambda rel: True)
    for item in walk(root, follow_symlinks=follow_symlinks, enters=lambda rel: "\\" in rel or enters(rel)):
        if isinstance(item, SkippedEntry):
            if filters.matches(item.rel):
                skipped(item)
            continue
        f: SourceFile = item
        rel = f.blob_rel if upload else local_rel(f.rel)
        if filters.matches(rel, f.identity.mtime_ns / 1e9):
            yield Entry(rel, f.identity.size, f.identity.mtime_ns, True, inode=f.identity.inode,
                        name=f.rel if rel != f.rel else None)


def in_process(root: Path, env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether to walk `root` in a process of its own: a large tree, on a machine with a core to spare, in the
    command's process (or wherever BLOBSYNC_WALK_PROCESS=1 asks for it)."""
    forced = env.get(_WALK_PROCESS, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if not _OWN_PROCESS or (os.cpu_count() or 1) < 2:
        return False
    folders = files = 0
    try:
        with os.scandir(root) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    folders += 1
                else:
                    files += 1
                if folders >= PROCESS_FOLDERS or files >= PROCESS_FILES:
                    return True
    except OSError:
        return False
    return False


async def index_in_process(index: SyncIndex, side: str, root: Path, filters: Filters, *, follow_symlinks: bool,
                           upload: bool, seen: Callable[[int], None]) -> list[SkippedEntry]:
    """Walk `root` in a process of its own into a scratch index file, then take its entries into `index`;
    `seen` is told how many were walked as it goes. Returns the entries skipped. The process is killed if this
    is cancelled, and dies with this process where the platform allows."""
    import multiprocessing  # loaded by the walks that need it, not by every command's start
    import tempfile

    ctx = multiprocessing.get_context("spawn")  # never fork a process with an event loop and threads
    # The walk's index file is made and removed here: a walk killed halfway (a Ctrl-C) cannot leave it behind.
    fd, made = tempfile.mkstemp(prefix="blobsync-walk-", suffix=".db", dir=index.path.parent)
    os.close(fd)
    try:
        skipped = await _run_child(ctx, root, made, side, filters, follow_symlinks, upload, seen)
        index.adopt(side, Path(made))
        return skipped
    finally:
        Path(made).unlink(missing_ok=True)


async def _run_child(ctx: Any, root: Path, made: str, side: str, filters: Filters, follow_symlinks: bool,
                     upload: bool, seen: Callable[[int], None]) -> list[SkippedEntry]:
    """The walk's process, from its start to its answer; killed if this is cancelled."""
    here, there = ctx.Pipe(duplex=False)
    count = ctx.Value("q", 0, lock=False)
    proc = ctx.Process(target=_walk_child, name="blobsync-walk", daemon=True,
                       args=(there, made, side, str(root), filters, follow_symlinks, upload, count))
    proc.start()
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
                break
        status, payload = reply.result()
    finally:
        if proc.is_alive():
            proc.kill()
        await loop.run_in_executor(None, proc.join)
        here.close()
    if status != "ok":
        raise SourceError(f"cannot walk {str(root)!r}: {payload}")
    return list(payload)


def _receive(conn: Connection) -> tuple[str, Any]:
    try:
        return conn.recv()  # type: ignore[no-any-return]
    except (EOFError, OSError):
        return "error", "the walk's process ended without an answer"


def _walk_child(conn: Connection, made: str, side: str, root: str, filters: Filters, follow_symlinks: bool,
                upload: bool, count: Any) -> None:
    """The walk's process: entries into the index file its parent made, what was skipped back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it (a Ctrl-C reaches the whole group)
    _die_with_parent()
    skipped: list[SkippedEntry] = []
    index = SyncIndex(path=Path(made))
    try:
        batch: list[Entry] = []
        for entry in tree_entries(Path(root), filters, follow_symlinks=follow_symlinks, upload=upload,
                                  skipped=skipped.append):
            batch.append(entry)
            if len(batch) >= 5000:
                count.value += index.add(side, batch)
                batch = []
        count.value += index.add(side, batch)
        index.db.close()
        conn.send(("ok", skipped))
    except Exception as exc:  # sent as text: the parent raises it as this walk's failure
        index.db.close()
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
