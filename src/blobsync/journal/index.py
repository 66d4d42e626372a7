"""The sync index: both sides of a sync in a scratch SQLite file, joined on disk so memory stays flat."""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

_BATCH = 5000


class Entry(NamedTuple):
    """One file or blob as seen during enumeration, by its path relative to the sync root. A tuple in the index's
    column order: a sync builds one per object of each side, and a tuple costs a fifth of a frozen dataclass."""

    rel: str
    size: int
    mtime_ns: int
    exact_mtime: bool = True  # False when the time is a blob's Last-Modified (whole seconds, upload time)
    md5: bytes | None = None
    etag: str | None = None
    name: str | None = None  # the blob name, for remote entries; for local ones, the path if not `rel`
    inode: int = 0
    tier: str | None = None  # remote entries: the blob's access tier (a copy may keep it)
    crc64: bytes | None = None  # remote entries: the whole blob's CRC64 blobsync stored with it (what a read checks)


_COLUMNS = 10  # of each side's table, in Entry's order


def _entry(row: tuple[object, ...], offset: int = 0) -> Entry | None:
    if row[offset] is None:
        return None
    rel, size, mtime, exact, md5, etag, name, inode, tier, crc64 = row[offset:offset + _COLUMNS]
    return Entry(str(rel), int(size), int(mtime), bool(exact), md5 if isinstance(md5, bytes) else None,  # type: ignore[call-overload]
                 etag if isinstance(etag, str) else None, name if isinstance(name, str) else None,
                 int(inode), tier if isinstance(tier, str) else None,  # type: ignore[call-overload]
                 crc64 if isinstance(crc64, bytes) else None)


class SyncIndex:
    """Source and destination entries of one sync run, in a temporary database deleted on close."""

    def __init__(self, folder: Path | None = None, *, path: Path | None = None) -> None:
        """A new index file in `folder`, or at `path` (an empty file its caller made and will delete)."""
        if path is None:
            if folder is not None:
                folder.mkdir(parents=True, exist_ok=True)
            fd, made = tempfile.mkstemp(prefix="blobsync-index-", suffix=".db", dir=folder)
            os.close(fd)
            path = Path(made)
        name = str(path)
        self.path = path
        self.db = sqlite3.connect(name, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute("PRAGMA cache_size=-16000")  # 16 MiB page cache: bounded whatever the tree size
        for side in ("src", "dst"):
            self.db.execute(
                f"create table {side} (rel text primary key, size int, mtime_ns int, exact int, md5 blob, "
                "etag text, name text, inode int, tier text, crc64 blob) without rowid"
            )
        self.db.execute("create table todo (rel text primary key, reason text) without rowid")

    def add(self, side: str, entries: Iterable[Entry]) -> int:
        """Insert entries of one side ('src' or 'dst') in batches; returns how many."""
        assert side in ("src", "dst")
        count = 0
        batch: list[Entry] = []
        for entry in entries:
            batch.append(entry)
            if len(batch) >= _BATCH:
                count += self._insert(side, batch)
                batch = []
        return count + self._insert(side, batch)

    def _insert(self, side: str, rows: list[Entry]) -> int:
        if rows:
            self.db.execute("begin")
            self.db.executemany(f"insert or replace into {side} values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self.db.execute("commit")
        return len(rows)

    def adopt(self, side: str, path: Path) -> int:
        """Take one side's entries from another index's file (a walk's process wrote it), then delete that file;
        returns how many. One statement in SQLite, sorted as the table is: no row passes through Python."""
        assert side in ("src", "dst")
        try:
            self.db.execute("attach database ? as walked", (str(path),))
            try:
                self.db.execute("begin")
                self.db.execute(f"insert or replace into main.{side} select * from walked.{side}")
                self.db.execute("commit")
            finally:
                self.db.execute("detach database walked")
        finally:
            path.unlink(missing_ok=True)
        return self.count(side)

    def pairs(self, *, skip_same_size: bool = False, newer_than: tuple[int, int] | None = None
              ) -> Iterator[tuple[Entry, Entry | None]]:
        """Every source entry with the destination entry of the same path, if any, in path order.

        With `skip_same_size`, SQLite leaves out the pairs whose sizes match, except, with `newer_than` =
        (exact_ns, coarse_ns), those whose source mtime is later than the destination's by more than exact_ns (both
        times exact) or coarse_ns (otherwise). A no-op sync of many files then builds no Entry at all."""
        where = ""
        params: tuple[int, ...] = ()
        if skip_same_size:
            where = " where d.rel is null or s.size != d.size"
            if newer_than is not None:
                where += " or s.mtime_ns - d.mtime_ns > (case when s.exact and d.exact then ? else ? end)"
                params = newer_than
        cur = self.db.execute(f"select s.*, d.* from src s left join dst d on d.rel = s.rel{where} order by s.rel",
                              params)
        for row in cur:
            src = _entry(row)
            assert src is not None
            yield src, _entry(row, _COLUMNS)

    def entries(self, side: str) -> Iterator[Entry]:
        """Every entry of one side, in path order."""
        assert side in ("src", "dst")
        for row in self.db.execute(f"select * from {side} order by rel"):
            entry = _entry(row)
            assert entry is not None
            yield entry

    def totals(self, side: str) -> tuple[int, int]:
        """How many entries one side has, and their total size."""
        assert side in ("src", "dst")
        count, size = self.db.execute(f"select count(*), coalesce(sum(size), 0) from {side}").fetchone()
        return int(count), int(size)

    def orphans(self) -> Iterator[Entry]:
        """Destination entries with no source entry: the candidates for deletion, in path order."""
        cur = self.db.execute("select d.* from dst d where not exists (select 1 from src s where s.rel = d.rel) "
                              "order by d.rel")
        for row in cur:
            entry = _entry(row)
            assert entry is not None
            yield entry

    def count_orphans(self) -> int:
        return int(self.db.execute("select count(*) from dst d where not exists "
                                   "(select 1 from src s where s.rel = d.rel)").fetchone()[0])

    def mark(self, decisions: Iterable[tuple[str, str]]) -> int:
        """Remember (rel, reason) of each source entry to transfer."""
        count = 0
        batch: list[tuple[str, str]] = []
        for item in decisions:
            batch.append(item)
            if len(batch) >= _BATCH:
                count += self._insert_todo(batch)
                batch = []
        return count + self._insert_todo(batch)

    def _insert_todo(self, rows: list[tuple[str, str]]) -> int:
        if rows:
            self.db.execute("begin")
            self.db.executemany("insert or replace into todo values (?, ?)", rows)
            self.db.execute("commit")
        return len(rows)

    def todo(self) -> Iterator[tuple[Entry, str]]:
        """The marked source entries with their reasons, in path order."""
        for row in self.db.execute("select s.*, t.reason from todo t join src s on s.rel = t.rel order by s.rel"):
            entry = _entry(row)
            assert entry is not None
            yield entry, str(row[_COLUMNS])

    def todo_totals(self) -> tuple[int, int]:
        """How many entries are marked to transfer, and their total size."""
        count, size = self.db.execute("select count(*), coalesce(sum(s.size), 0) from todo t "
                                      "join src s on s.rel = t.rel").fetchone()
        return int(count), int(size)

    def count(self, side: str) -> int:
        assert side in ("src", "dst", "todo")
        return int(self.db.execute(f"select count(*) from {side}").fetchone()[0])

    def close(self) -> None:
        self.db.close()
        self.path.unlink(missing_ok=True)
