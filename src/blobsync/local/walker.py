"""A sync's local side as index entries, walked in this process or, for a large tree, in a process of its own
writing a scratch index file: the walk (a stat per file) then runs on another core than the listing it is
compared with, which one process's interpreter lock kept on one core between them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blobsync.errors import SourceError
from blobsync.filters import Filters
from blobsync.journal.index import Entry, SyncIndex
from blobsync.local.child import child_started, may_spawn, run_child, scratch_file
from blobsync.local.files import SkippedEntry, SourceFile, local_rel, walk

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

# A tree this large at its top (folders, or files) is walked in a process of its own: starting one costs ~0.2 s
# of CPU, which a walk of 10^5 files repays and a walk of 10^4 does not.
PROCESS_FOLDERS = 64
PROCESS_FILES = 20_000
_WALK_PROCESS = "BLOBSYNC_WALK_PROCESS"  # 1: always, 0: never (tests; a host where spawning fails)


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
    allowed = may_spawn(env, _WALK_PROCESS)
    if allowed is not None:
        return allowed
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
    async with scratch_file(index.path.parent, "blobsync-walk-") as made:
        status, payload = await run_child(_walk_child, (str(made), side, str(root), filters, follow_symlinks, upload),
                                          "blobsync-walk", seen)
        if status != "ok":
            raise SourceError(f"cannot walk {str(root)!r}: {payload}")
        index.adopt(side, made)
        return list(payload)


def _walk_child(conn: Connection, count: Any, made: str, side: str, root: str, filters: Filters,
                follow_symlinks: bool, upload: bool) -> None:
    """The walk's process: entries into the index file its parent made, what was skipped back."""
    child_started()
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
