"""Rendering for the terminal: sizes, the live progress line, and the end-of-run summary."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from blobsync.engine.context import Progress
from blobsync.report import FileStatus, Report


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def progress_line(p: Progress) -> str:
    elapsed = max(time.monotonic() - p.started, 1e-6)
    rate = p.bytes_sent / elapsed
    pct = 100.0 * p.bytes_done / p.bytes_total if p.bytes_total else 100.0
    eta = ""
    if rate > 0 and p.bytes_total > p.bytes_done:
        eta = f", ETA {int((p.bytes_total - p.bytes_done) / rate)}s"
    done = p.files_done + p.files_skipped + p.files_failed
    return (f"{pct:5.1f}%  {human_bytes(p.bytes_done)} / {human_bytes(p.bytes_total)}  "
            f"{human_bytes(rate)}/s  files {done}/{p.files_total}"
            f"{f', {p.files_failed} failed' if p.files_failed else ''}{eta}"
            f"  concurrency {p.concurrency}{f', throttled {p.throttled}x' if p.throttled else ''}")


class LiveProgress:
    """Redraws one progress line on a terminal from a background thread; silent when not a TTY."""

    def __init__(self, progress: Progress, stream: TextIO = sys.stderr, interval: float = 0.5) -> None:
        self.progress = progress
        self.stream = stream
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LiveProgress:
        if self.stream.isatty():
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.stream.write("\r\x1b[K" + progress_line(self.progress))
            self.stream.flush()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def summary_record(report: Report, *, dry_run: bool = False) -> dict[str, object]:
    """The summary as one JSON-ready object."""
    return {
        "type": "summary", "job": report.job_id, "dry_run": dry_run, "direction": report.kind,
        "source": report.source, "destination": report.dest,
        "files_transferred": report.files_transferred, "files_skipped": report.files_skipped,
        "files_failed": report.files_failed, "files_deleted": report.files_deleted,
        "files_in_sync": report.files_in_sync,
        "bytes_transferred": report.bytes_transferred, "bytes_sent": report.bytes_sent,
        "bytes_reused": report.bytes_reused, "retries": report.retries, "throttled": report.throttled,
        "lowest_concurrency": report.lowest_concurrency, "duration": round(report.duration, 3),
        "concurrency": report.concurrency or None, "concurrency_auto": report.concurrency_auto,
        "deletes_refused": report.deletes_refused or None,
        "failures": [{"path": f.rel, "reason": f.reason} for f in report.failures],
        "exit_code": int(report.exit_code),
    }


def summary(report: Report, *, dry_run: bool = False) -> str:
    rate = report.bytes_sent / report.duration if report.duration > 0 else 0.0
    if dry_run:
        verb = "to download" if report.kind == "download" else "to upload"
        return (f"Dry run: {report.files_transferred} {verb}, {report.files_failed} with problems; "
                f"{human_bytes(report.bytes_transferred)}; nothing was changed")
    verb = "downloaded" if report.kind == "download" else "uploaded"
    if report.job_id == "-" and not report.failures:
        return f"Nothing to do: {report.files_in_sync} file(s) already in sync"
    where = "on disk" if report.kind == "download" else "on the service"
    lines = [
        f"Job {report.job_id}: {report.files_transferred} {verb}, {report.files_skipped} skipped, "
        f"{report.files_failed} failed",
        f"  {human_bytes(report.bytes_transferred)} {verb} in {report.duration:.1f}s "
        f"({human_bytes(rate)}/s); {human_bytes(report.bytes_sent)} over the wire"
        + (f", {human_bytes(report.bytes_reused)} already {where} (resumed)" if report.bytes_reused else "")
        + f"; {report.retries} retries",
    ]
    if report.concurrency_auto and report.concurrency:
        lines.append(f"  concurrency auto: settled at {report.concurrency} requests in flight "
                     f"(tried up to {report.concurrency_peak})")
    if report.throttled:
        lines.append(f"  the service throttled {report.throttled} time(s); concurrency went down to "
                     f"{report.lowest_concurrency or 'the same level'} and back up as it recovered")
    if report.files_in_sync:
        lines.append(f"  {report.files_in_sync} file(s) already in sync")
    if report.files_deleted:
        lines.append(f"  {report.files_deleted} deleted at the destination")
    if report.deletes_refused:
        lines.append(f"  {report.deletes_refused}")
    for note in report.skipped_notes[:20]:
        if note.reason and note.reason != "already uploaded by this job":
            lines.append(f"  skipped {note.rel}: {note.reason}")
    for failure in report.failures:
        status = "FAILED" if failure.status is FileStatus.FAILED else "skipped"
        lines.append(f"  {status} {failure.rel}: {failure.reason}")
    return "\n".join(lines)
