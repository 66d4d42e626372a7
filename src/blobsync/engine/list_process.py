"""A blob-to-blob sync's source listed by a process of its own: the folders its fan-out lists flat are read, parsed
and indexed on another core than the destination's listing, which one process's interpreter lock kept on the same
core (parsing a listing costs ~10 µs of CPU per object: at 10^6 objects a side, the sync's whole bound)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blobsync.backends.base import Location
from blobsync.config import TransferConfig
from blobsync.engine.context import RequestPath
from blobsync.engine.listing import RemoteLister, entry_time
from blobsync.engine.session import Session
from blobsync.errors import BlobsyncError, ServiceError
from blobsync.events import Progress
from blobsync.filters import Filters
from blobsync.journal import Journal
from blobsync.journal.index import SyncIndex
from blobsync.local.child import ChildUnavailable, child_started, may_spawn, run_child, scratch_file

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

_LIST_PROCESS = "BLOBSYNC_LIST_PROCESS"  # 1: always where allowed, 0: never (tests; a host where spawning fails)
FlatLister = Callable[[RemoteLister, list[str]], Awaitable[None]]


def flat_lister(session: Session, loc: Location, config: TransferConfig) -> FlatLister | None:
    """How the folders of `loc`'s fan-out are listed flat in a process of its own, or None: in this one. Only where
    that process keeps every promise this one does: never with a Client's credential object (it is not handed to
    another process), a bandwidth cap (the job's one bucket) or a store only this process reaches (memory://);
    the command's own process only, unless BLOBSYNC_LIST_PROCESS=1."""
    if may_spawn(dict(session.env), _LIST_PROCESS) is False:
        return None
    if session.credential_for(loc) is not None or config.cap_bytes or session.store(loc).capabilities.this_process:
        return None

    async def in_child(lister: RemoteLister, prefixes: list[str]) -> None:
        try:
            await list_in_process(lister, prefixes, loc, config, session.env)
        except ChildUnavailable:  # a host where no process starts: listed here, as without one
            await lister.flat(prefixes)

    return in_child


async def list_in_process(lister: RemoteLister, prefixes: list[str], loc: Location, config: TransferConfig,
                          env: Mapping[str, str]) -> None:
    """Every object under each of `prefixes` into `lister`'s side of its index, listed by a process of its own
    into a scratch index file taken in at the end; the child's retries count as the lister's request path's. A
    failure is raised as the child's own error (an AuthError stays one)."""
    index = lister.index
    async with scratch_file(index.path.parent, "blobsync-list-") as made:
        args = (str(made), lister.side, loc, config, dict(env), lister.root, prefixes, lister.filters)
        status, payload = await run_child(_list_child, args, "blobsync-list", lister.seen)
        if status != "ok":
            if isinstance(payload, BaseException):
                raise payload
            raise ServiceError(f"the listing of {loc.display} failed: {payload}", code="ListingFailed")
        if isinstance(lister.request, RequestPath):
            lister.request.met_elsewhere(*payload)
        index.adopt(lister.side, made)


def _list_child(conn: Connection, count: Any, made: str, side: str, loc: Location, config: TransferConfig,
                env: dict[str, str], root: str, prefixes: list[str], filters: Filters) -> None:
    """The listing's process: entries into the index file its parent made, its retry counts back."""
    child_started()
    index = SyncIndex(path=Path(made))
    try:
        counts = asyncio.run(_list_flat(index, side, loc, config, env, root, prefixes, filters, count))
        index.db.close()
        conn.send(("ok", counts))
    except BlobsyncError as exc:  # sent as itself: the parent raises the same error, with its exit code
        index.db.close()
        conn.send(("error", exc))
    except Exception as exc:
        index.db.close()
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


async def _list_flat(index: SyncIndex, side: str, loc: Location, config: TransferConfig, env: dict[str, str],
                     root: str, prefixes: list[str], filters: Filters, count: Any) -> tuple[int, int]:
    progress = Progress()
    session = Session(config, env, _no_journal, wire_progress=progress)

    def seen(n: int) -> None:
        count.value += n

    try:
        lister = RemoteLister(session.store(loc), session.requests(config, progress), root, index, side, filters,
                              entry_time, seen)
        await lister.flat(prefixes)
    finally:
        await session.close()
    return progress.retries, progress.throttled


def _no_journal() -> Journal:
    raise RuntimeError("a listing's process keeps no journal")
