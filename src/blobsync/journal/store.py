"""Job -> file -> block state in SQLite (WAL), written in batches so the journal never limits throughput."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from blobsync.errors import JobBusyError, UsageError
from blobsync.journal.states import MEMORY_SOURCE, FileState, JobKind, JobState
from blobsync.redact import printable

SCHEMA_VERSION = 1
T = TypeVar("T")
_FLUSH_OPS = 2000
_FLUSH_SECONDS = 1.0


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS [jobs] ([id] TEXT PRIMARY KEY, [kind] TEXT, [source] TEXT, [dest] TEXT, "
    "[options] TEXT, [state] TEXT, [created] FLOAT, [updated] FLOAT, [pid] INTEGER)",
    "CREATE INDEX IF NOT EXISTS [idx_jobs_kind_source_dest] ON [jobs] ([kind], [source], [dest])",
    "CREATE TABLE IF NOT EXISTS [files] ([id] INTEGER PRIMARY KEY, [job_id] TEXT, [rel] TEXT, [blob] TEXT, "
    "[size] INTEGER, [mtime_ns] INTEGER, [inode] INTEGER, [state] TEXT, [nonce] TEXT, [block_size] INTEGER, "
    "[n_blocks] INTEGER, [md5] TEXT, [etag] TEXT, [bytes_sent] INTEGER, [error] TEXT, [updated] FLOAT)",
    "CREATE UNIQUE INDEX IF NOT EXISTS [idx_files_job_id_rel] ON [files] ([job_id], [rel])",
    # Local MD5s for sync --compare-hash: valid while (size, mtime_ns, inode) are unchanged.
    "CREATE TABLE IF NOT EXISTS hashes (path text primary key, size int, mtime_ns int, inode int, md5 blob)",
    # [md5] holds the check a block was sent with: an MD5 or a Storage CRC64, in hex.
    "CREATE TABLE IF NOT EXISTS [blocks] ([file_id] INTEGER, [idx] INTEGER, [size] INTEGER, [md5] TEXT, "
    "[boot] TEXT, PRIMARY KEY ([file_id], [idx]))",
    # Kept across jobs (each sync run is a new job), one row per blob: a commit replaces it.
    # `container` is the container's URL without query string: never a SAS.
    "CREATE TABLE IF NOT EXISTS committed_blobs (container text, blob text, block_size int, etag text, "
    "size int, md5 text, blocks text, updated float, primary key (container, blob))",
    # Changes asked of a running job by another process (`blobsync jobs cap`); the job polls this row.
    "CREATE TABLE IF NOT EXISTS job_controls (job_id text primary key, cap_mbps real, updated real)",
)


_last_path: Path | None = None  # the journal this process opened last: what `damaged` names


def damaged(exc: sqlite3.Error) -> UsageError:
    """The one clear error for a journal SQLite cannot use (not a database, damaged pages, locked too long),
    whenever the damage shows: at open or in the middle of a job."""
    where = f" at {_last_path}" if _last_path is not None else ""
    return UsageError(f"cannot open the journal{where}: {exc}", hint="pass --journal PATH or move it aside")


def damaged_row(what: str, key: object, exc: Exception) -> UsageError:
    """The one line for a journal row blobsync did not write as it reads it (edited by hand, damaged)."""
    where = f" in {_last_path}" if _last_path is not None else ""
    return UsageError(f"the journal's row for {what} {printable(str(key))!r}{where} is damaged ({exc})",
                      hint="remove that job with 'blobsync jobs clean --all', or pass another --journal")


def _state_now(state: JobState, source: str, pid: int | None) -> JobState:
    """A put of data held in memory whose process is gone (killed mid-put) can never go on: abandoned."""
    if (state is JobState.RUNNING and source.startswith(MEMORY_SOURCE) and pid and pid != os.getpid()
            and not _pid_alive(pid)):
        return JobState.ABANDONED
    return state


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} where text belongs")
    return value


def _integer(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{value!r} where a whole number belongs")
    return value


def _number(value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{value!r} where a number belongs")
    return float(value)


def _optional(value: object, kind: type[T]) -> T | None:
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"{value!r} where {kind.__name__} or nothing belongs")
    return value


def default_journal_path(env: Mapping[str, str] | None = None, platform: str | None = None) -> Path:
    """$XDG_STATE_HOME/blobsync/journal.db, else ~/.local/state/blobsync/journal.db; on Windows
    %LOCALAPPDATA%\\blobsync\\journal.db (XDG_STATE_HOME still wins where it is set)."""
    env = os.environ if env is None else env
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "blobsync" / "journal.db"
    if (platform or sys.platform) == "win32":
        local = env.get("LOCALAPPDATA") or str(Path(env.get("USERPROFILE") or Path.home()) / "AppData" / "Local")
        return Path(local) / "blobsync" / "journal.db"
    return Path(env.get("HOME") or Path.home()) / ".local" / "state" / "blobsync" / "journal.db"


@dataclass(frozen=True)
class JobRow:
    id: str
    kind: JobKind
    source: str
    dest: str  # URL without query string: never a SAS
    options: dict[str, Any]
    state: JobState
    created: float
    updated: float
    pid: int | None


@dataclass(frozen=True)
class FileRow:
    id: int
    job_id: str
    rel: str
    blob: str
    size: int
    mtime_ns: int
    inode: int
    state: FileState
    nonce: str | None
    block_size: int | None
    n_blocks: int | None
    md5: str | None
    etag: str | None
    bytes_sent: int
    error: str | None
    ctime_ns: int | None = None  # the source's inode change time when its blocks were staged


@dataclass(frozen=True)
class BlockRow:
    idx: int
    size: int
    md5: str
    boot: str | None = None  # a download range not yet fsynced: the boot it was written in (None: on disk)


@dataclass(frozen=True)
class CommittedBlob:
    """A blob as blobsync last committed it: what a delta upload of the file's next version builds on."""

    block_size: int
    etag: str  # the blob's ETag right after that commit
    size: int
    md5_hex: str | None
    blocks: tuple[tuple[str, int, bytes], ...]  # (block ID, length, xxh3-128 digest) in order


# Jobs run by this process, by (journal, job id): two threads calling the same job would both run it (the pid
# check above cannot tell them apart).
_RUNNING_HERE: set[tuple[str, str]] = set()
_RUNNING_LOCK = threading.Lock()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Journal:
    """All journal reads and writes. Writes queue up and commit together in one transaction per flush."""

    def __init__(self, path: Path | str) -> None:
        path = Path(path)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a new folder is the user's alone
        except OSError as exc:
            raise UsageError(f"cannot open the journal at {path}: {exc.strerror or exc}",
                             hint="pass --journal PATH") from exc
        if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise UsageError(f"cannot open the journal at {path}: not writable", hint="pass --journal PATH")
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._pending: list[tuple[str, tuple[Any, ...]]] = []
        self._commits_in: dict[str, bool] = {}  # container -> whether committed_blobs may hold a record of it
        self._last_flush = time.monotonic()
        self._claimed: set[tuple[str, str]] = set()  # jobs this journal runs (released on close)

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection, opened on first use: a run with nothing to do (a no-op sync) never opens it.

        A transfer's reads and writes use it directly; the `jobs` commands reach it through sqlite-utils
        (journal/jobs.py), whose import costs ~45 ms, a fifth of the start-up of a `blobsync cp` of one file."""
        if self._conn is None:
            global _last_path
            _last_path = self.path
            try:
                with contextlib.suppress(FileExistsError):  # made 0600 first: SQLite gives its WAL the same mode
                    os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                conn = sqlite3.connect(str(self.path), timeout=10.0, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                self._create_schema(conn)
            except sqlite3.Error as exc:
                raise damaged(exc) from exc
            self._conn = conn
        return self._conn

    def _dicts(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        cursor = self.conn.execute(sql, tuple(params))
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, values, strict=True)) for values in cursor]

    @staticmethod
    def _create_schema(conn: sqlite3.Connection) -> None:
        # Plain DDL with IF NOT EXISTS under one write lock: two processes opening a new journal at once (a
        # job starting while `blobsync jobs list` polls) must not both try to create the same table.
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                conn.execute(statement)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(blocks)")}
            if "boot" not in columns:  # a journal from before downloads tracked fsyncs
                conn.execute("ALTER TABLE blocks ADD COLUMN boot TEXT")
            if "ctime_ns" not in {row[1] for row in conn.execute("PRAGMA table_info(files)")}:
                conn.execute("ALTER TABLE files ADD COLUMN ctime_ns INTEGER")
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One explicit transaction (the connection runs in autocommit mode otherwise)."""
        conn = self.conn
        conn.execute("begin immediate")
        try:
            yield
        except BaseException:
            conn.execute("rollback")
            raise
        conn.execute("commit")

    # --- jobs ---------------------------------------------------------------------------------------------

    @staticmethod
    def job_row(row: Mapping[str, Any]) -> JobRow:
        """A jobs row as read, or UsageError naming it when it is not one blobsync wrote (edited, damaged)."""
        try:
            options = json.loads(row["options"] or "{}")
            if not isinstance(options, dict):
                raise ValueError("its options are not a JSON object")
            pid = row["pid"] if isinstance(row["pid"], int) else None
            return JobRow(_text(row["id"]), JobKind(row["kind"]), _text(row["source"]), _text(row["dest"]), options,
                          _state_now(JobState(row["state"]), _text(row["source"]), pid), _number(row["created"]),
                          _number(row["updated"]), pid)
        except (ValueError, TypeError) as exc:
            raise damaged_row("job", row.get("id"), exc) from None

    def find_unfinished_job(self, kind: JobKind, source: str, dest: str) -> JobRow | None:
        rows = self._dicts("select * from jobs where kind = ? and source = ? and dest = ? and state != 'done' "
                           "order by created desc limit 1", [kind, source, dest])
        return self.job_row(rows[0]) if rows else None

    def get_job(self, job_id: str) -> JobRow:
        rows = self._dicts("select * from jobs where id = ? or id like ? limit 2", [job_id, f"{job_id}%"])
        if len(rows) != 1:
            raise UsageError(f"no job {job_id!r} in {self.path}" if not rows else f"job id {job_id!r} is ambiguous",
                             hint="see 'blobsync jobs list'")
        return self.job_row(rows[0])

    def create_job(self, kind: JobKind, source: str, dest: str, options: Mapping[str, Any]) -> JobRow:
        now = time.time()
        job_id = uuid.uuid4().hex[:12]
        # The connection is in autocommit mode: this insert commits by itself.
        self.conn.execute("insert into jobs (id, kind, source, dest, options, state, created, updated, pid) "
                          "values (?, ?, ?, ?, ?, 'running', ?, ?, ?)",
                          (job_id, kind, source, dest, json.dumps(dict(options), sort_keys=True), now, now,
                           os.getpid()))
        return self.get_job(job_id)

    def claim_job(self, job: JobRow) -> None:
        """Mark `job` as run by this process; refuse if another live process runs it."""
        if job.state is JobState.RUNNING and job.pid and job.pid != os.getpid() and _pid_alive(job.pid):
            raise JobBusyError(f"job {job.id} is being run by process {job.pid}",
                               hint="wait for it or stop it, then run the command again")
        key = (str(self.path.resolve()), job.id)
        with _RUNNING_LOCK:
            if key in _RUNNING_HERE and key not in self._claimed:
                raise JobBusyError(f"job {job.id} is being run by another thread of this process",
                                   hint="wait for that call to return, then call again")
            _RUNNING_HERE.add(key)
            self._claimed.add(key)
        self.set_job_state(job.id, JobState.RUNNING)

    def set_job_state(self, job_id: str, state: JobState) -> None:
        self.flush()
        with self.transaction():
            self.conn.execute("update jobs set state = ?, updated = ?, pid = ? where id = ?",
                              (state, time.time(), os.getpid(), job_id))

    def job_cap(self, job_id: str) -> tuple[float, float] | None:
        """The latest cap asked of a job by `set_job_cap`, and when: (megabits per second, time.time())."""
        row = self.conn.execute("select cap_mbps, updated from job_controls where job_id = ?", (job_id,)).fetchone()
        return (float(row[0]), float(row[1])) if row is not None else None

    # --- files --------------------------------------------------------------------------------------------

    @staticmethod
    def file_row(row: Mapping[str, Any]) -> FileRow:
        """A files row as read, or UsageError naming it when it is not one blobsync wrote (edited, damaged)."""
        try:
            return FileRow(_integer(row["id"]), _text(row["job_id"]), _text(row["rel"]), _text(row["blob"]),
                           _integer(row["size"]), _integer(row["mtime_ns"]), _integer(row["inode"] or 0),
                           FileState(row["state"]), _optional(row["nonce"], str), _optional(row["block_size"], int),
                           _optional(row["n_blocks"], int), _optional(row["md5"], str), _optional(row["etag"], str),
                           _integer(row["bytes_sent"] or 0), _optional(row["error"], str),
                           _optional(row["ctime_ns"], int))
        except (ValueError, TypeError) as exc:
            raise damaged_row(f"file {row.get('rel')!r} of job", row.get("job_id"), exc) from None

    def add_files(self, job_id: str, entries: Iterable[tuple[str, str, int, int, int]]) -> dict[str, FileRow]:
        """Insert (rel, blob, size, mtime_ns, inode) rows not yet known; return the rows of these files by rel
        (a resumed job's earlier rows for them included)."""
        now = time.time()
        batch = list(entries)
        self.flush()
        with self.transaction():
            self.conn.executemany(
                "insert or ignore into files (job_id, rel, blob, size, mtime_ns, inode, state, bytes_sent, "
                "updated) values (?, ?, ?, ?, ?, ?, 'pending', 0, ?)",
                ((job_id, rel, blob, size, mtime, inode, now) for rel, blob, size, mtime, inode in batch),
            )
        rows: dict[str, FileRow] = {}
        for start in range(0, len(batch), 500):
            rels = [entry[0] for entry in batch[start:start + 500]]
            for found in self._dicts(
                    f"select * from files where job_id = ? and rel in ({','.join('?' * len(rels))})", [job_id, *rels]):
                file = self.file_row(found)
                rows[file.rel] = file
        return rows

    def blocks(self, file_id: int) -> list[BlockRow]:
        return [BlockRow(idx, size, md5, boot) for idx, size, md5, boot in self.conn.execute(
            "select idx, size, md5, boot from blocks where file_id = ? order by idx", (file_id,))]

    # --- hash cache -----------------------------------------------------------------------------------------

    def cached_md5(self, path: str, size: int, mtime_ns: int, inode: int) -> bytes | None:
        row = self.conn.execute("select size, mtime_ns, inode, md5 from hashes where path = ?", (path,)).fetchone()
        if row is None or tuple(row[:3]) != (size, mtime_ns, inode):
            return None
        return bytes(row[3])

    def cache_md5(self, path: str, size: int, mtime_ns: int, inode: int, md5: bytes) -> None:
        self._queue("insert or replace into hashes values (?, ?, ?, ?, ?)", (path, size, mtime_ns, inode, md5))

    # --- committed block lists (delta uploads) ------------------------------------------------------------

    def committed_blob(self, container: str, blob: str) -> CommittedBlob | None:
        self.flush()  # a record queued by an earlier file of this run counts
        row = self.conn.execute("select block_size, etag, size, md5, blocks from committed_blobs "
                                "where container = ? and blob = ?", (container, blob)).fetchone()
        if row is None:
            return None
        blocks = tuple((bid, length, bytes.fromhex(digest)) for bid, length, digest in json.loads(row[4]))
        return CommittedBlob(row[0], row[1], row[2], row[3], blocks)

    def remember_commit(self, container: str, blob: str, record: CommittedBlob) -> None:
        self._commits_in[container] = True
        blocks = json.dumps([[bid, length, digest.hex()] for bid, length, digest in record.blocks],
                            separators=(",", ":"))
        self._queue("insert or replace into committed_blobs values (?, ?, ?, ?, ?, ?, ?, ?)",
                    (container, blob, record.block_size, record.etag, record.size, record.md5_hex, blocks,
                     time.time()))

    def forget_commit(self, container: str, blob: str) -> None:
        """The blob was replaced by a single Put Blob or deleted: nothing of it can be reused."""
        # Most containers hold no record (no chunked upload yet): one look, then no delete per small file. A
        # record another process adds meanwhile and this one leaves behind is harmless: a delta uses a record
        # only while the blob still has the ETag it names.
        held = self._commits_in.get(container)
        if held is None:
            held = self.conn.execute("select 1 from committed_blobs where container = ? limit 1",
                                     (container,)).fetchone() is not None
            self._commits_in[container] = held
        if held:
            self._queue("delete from committed_blobs where container = ? and blob = ?", (container, blob))

    # --- batched writes -----------------------------------------------------------------------------------

    def _queue(self, sql: str, params: tuple[Any, ...]) -> None:
        self._pending.append((sql, params))
        if len(self._pending) >= _FLUSH_OPS or time.monotonic() - self._last_flush >= _FLUSH_SECONDS:
            self.flush()

    def start_file(self, file_id: int, *, nonce: str | None, block_size: int | None, n_blocks: int | None,
                   size: int, mtime_ns: int, inode: int, reset: bool, etag: str | None = None,
                   ctime_ns: int | None = None) -> None:
        """Record how a file is being sent; `reset` forgets its blocks (a new nonce: a clean restart).

        For downloads `etag` is the version of the blob being fetched: ranges are only reused for it."""
        if reset:
            self._queue("delete from blocks where file_id = ?", (file_id,))
        self._queue(
            "update files set state = 'active', nonce = ?, block_size = ?, n_blocks = ?, size = ?, "
            "mtime_ns = ?, inode = ?, ctime_ns = ?, error = null, etag = coalesce(?, etag), updated = ?"
            + (", bytes_sent = 0" if reset else "") + " where id = ?",
            (nonce, block_size, n_blocks, size, mtime_ns, inode, ctime_ns, etag, time.time(), file_id),
        )

    def block_done(self, file_id: int, idx: int, size: int, check_hex: str, *, durable: bool = False,
                   boot: str | None = None) -> None:
        """Record a block the service acknowledged, or a range written to disk (never before).

        Uploads can ask the service what arrived, so their blocks are batched. A download's journal is the
        only record of which ranges are on disk: `durable` commits at once (one small transaction per range),
        and `boot` marks a range written but not yet fsynced (it survives a killed process, not a power cut)."""
        self._queue("insert or replace into blocks (file_id, idx, size, md5, boot) values (?, ?, ?, ?, ?)",
                    (file_id, idx, size, check_hex, boot))
        self._queue("update files set bytes_sent = bytes_sent + ? where id = ?", (size, file_id))
        if durable:
            self.flush()

    def ranges_synced(self, file_id: int, indexes: Iterable[int]) -> None:
        """These ranges of a partial download are fsynced: they survive a power cut now."""
        for idx in indexes:
            self._queue("update blocks set boot = null where file_id = ? and idx = ?", (file_id, idx))
        self.flush()

    def placing(self, file_id: int, mark: str) -> None:
        """A download's file, whole and checked, is about to take its final name as the file `mark` names: kept
        (durably, before the rename) where a download keeps no nonce, so a run killed between the rename and its
        record finds the file finished instead of fetching it again."""
        self._queue("update files set nonce = ?, updated = ? where id = ?", (mark, time.time(), file_id))
        self.flush()

    def finish_file(self, file_id: int, state: FileState, *, md5_hex: str | None = None, etag: str | None = None,
                    error: str | None = None, bytes_sent: int = 0) -> None:
        """A file's outcome (written by the job runner alone). `bytes_sent` is this run's: a resumed file has sent
        at least that much in all, as its blocks recorded."""
        self._queue(
            "update files set state = ?, md5 = coalesce(?, md5), etag = coalesce(?, etag), error = ?, "
            "bytes_sent = max(coalesce(bytes_sent, 0), ?), updated = ? where id = ?",
            (state, md5_hex, etag, error, bytes_sent, time.time(), file_id),
        )

    def flush(self) -> None:
        """Commit every queued write in one transaction."""
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        with self.transaction():
            for sql, params in pending:
                self.conn.execute(sql, params)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with _RUNNING_LOCK:
            _RUNNING_HERE.difference_update(self._claimed)
            self._claimed.clear()
        if self._conn is None:
            return
        self.flush()
        self._conn.close()
        self._conn = None
