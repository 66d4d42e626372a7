"""The `jobs` commands' view of a journal (list, totals, files, cap, clean), through sqlite-utils.

Kept apart from the transfer path (journal/store.py, plain sqlite3) since sqlite-utils' import costs ~45 ms, a
fifth of the start-up of a `blobsync cp` of one small file; a transfer never loads this module."""

from __future__ import annotations

import json
import logging
import time

import sqlite_utils

from blobsync.errors import UsageError
from blobsync.journal.store import FileRow, JobRow, Journal

log = logging.getLogger("blobsync")


class JobBook:
    """Reads and changes jobs of one open journal (same connection, same transactions)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.db = sqlite_utils.Database(journal.conn)

    def list_jobs(self) -> list[JobRow]:
        """Every job this journal can read; a row it cannot (edited, damaged) is named in a warning, not listed."""
        out = []
        for r in self.db.table("jobs").rows_where(order_by="created desc"):
            try:
                out.append(self.journal.job_row(r))
            except UsageError as exc:
                log.warning("%s", exc)
        return out

    def job_totals(self, job_id: str) -> dict[str, dict[str, int]]:
        """Per file state: number of files, bytes and bytes sent."""
        out: dict[str, dict[str, int]] = {}
        for row in self.db.query(
            "select state, count(*) n, coalesce(sum(size),0) bytes, coalesce(sum(bytes_sent),0) sent "
            "from files where job_id = ? group by state", [job_id],
        ):
            out[row["state"]] = {"files": row["n"], "bytes": row["bytes"], "sent": row["sent"]}
        return out

    def files(self, job_id: str) -> list[FileRow]:
        return [self.journal.file_row(r)
                for r in self.db.table("files").rows_where("job_id = ?", [job_id], order_by="rel")]

    def set_job_cap(self, job_id: str, cap_mbps: float) -> None:
        """Ask a running job to change its bandwidth cap; also kept in its options for a later resume."""
        job = self.journal.get_job(job_id)
        options = dict(job.options, cap_mbps=cap_mbps)
        self.journal.flush()
        with self.journal.transaction():
            self.db.execute("insert or replace into job_controls (job_id, cap_mbps, updated) values (?, ?, ?)",
                            [job.id, cap_mbps, time.time()])
            self.db.execute("update jobs set options = ? where id = ?", [json.dumps(options, sort_keys=True), job.id])

    def delete_jobs(self, older_than_seconds: float | None, include_unfinished: bool) -> list[str]:
        cutoff = time.time() - (older_than_seconds or 0)
        where = "updated <= ?" + ("" if include_unfinished else " and state in ('done', 'abandoned')")
        ids = [r["id"] for r in self.db.table("jobs").rows_where(where, [cutoff])]
        self.journal.flush()
        with self.journal.transaction():
            for job_id in ids:
                self.db.execute("delete from blocks where file_id in (select id from files where job_id = ?)",
                                [job_id])
                for table in ("files", "job_controls"):
                    self.db.execute(f"delete from {table} where job_id = ?", [job_id])
                self.db.execute("delete from jobs where id = ?", [job_id])
        return ids
