"""Rendering: sizes, the progress display (terminal, plain lines, JSON), JSON lines, and the summary."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping
from typing import TextIO

from blobsync.events import BaseSubscriber, Progress
from blobsync.redact import printable, redact
from blobsync.report import NO_JOB, FileResult, FileStatus, Report


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def _rate(p: Progress) -> float:
    """Bytes per second on the wire, counted as they move: at a low cap a block takes long to be acknowledged,
    and a rate of acknowledged bytes read 0 B/s until the first one was."""
    return max(p.bytes_moving, p.bytes_sent) / max(time.monotonic() - p.started, 1e-6)


def _eta(p: Progress, rate: float) -> int | None:
    if rate > 0 and p.bytes_total > p.bytes_done:
        return int((p.bytes_total - p.bytes_done) / rate)
    return None


def listing_line(p: Progress) -> str:
    """A sync's enumeration, before any transfer: what each side listed so far, and how fast."""
    elapsed = max(time.monotonic() - p.started, 1e-6)
    listed = p.listed_src + p.listed_dst
    return (f"comparing: {p.listed_src:,} at the source, {p.listed_dst:,} at the destination listed "
            f"({listed / elapsed:,.0f} objects/s)")


def progress_line(p: Progress) -> str:
    if p.listing and not p.files_total:
        return listing_line(p)
    rate = _rate(p)
    pct = 100.0 * p.bytes_done / p.bytes_total if p.bytes_total else 100.0
    eta = _eta(p, rate)
    done = p.files_done + p.files_failed
    extras = []
    if p.files_skipped:
        extras.append(f"{p.files_skipped} skipped")
    if p.files_failed:
        extras.append(f"{p.files_failed} failed")
    if p.files_deleted:
        extras.append(f"{p.files_deleted} deleted")
    if p.concurrency:
        extras.append(f"concurrency {p.concurrency}")
    if p.retries:
        extras.append(f"{p.retries} retries")
    if p.bytes_moving > p.bytes_sent:
        extras.append(f"{human_bytes(p.bytes_moving)} on the wire")
    if p.throttled:
        extras.append(f"throttled {p.throttled}x")
    return (f"{pct:5.1f}%  {human_bytes(p.bytes_done)} / {human_bytes(p.bytes_total)}  "
            f"{human_bytes(rate)}/s  files {done}/{p.files_total}"
            f"{f', ETA {eta}s' if eta is not None else ''}{'  (' + ', '.join(extras) + ')' if extras else ''}")


def progress_record(p: Progress) -> dict[str, object]:
    rate = _rate(p)
    return {
        "type": "progress", "elapsed": round(time.monotonic() - p.started, 3),
        "bytes_done": p.bytes_done, "bytes_total": p.bytes_total, "bytes_sent": p.bytes_sent,
        "bytes_on_wire": max(p.bytes_moving, p.bytes_sent),
        "rate_bytes_per_second": round(rate), "eta_seconds": _eta(p, rate),
        "files_done": p.files_done, "files_total": p.files_total, "files_skipped": p.files_skipped,
        "files_failed": p.files_failed, "files_deleted": p.files_deleted,
        "concurrency": p.concurrency, "retries": p.retries, "throttled": p.throttled,
        "listing": p.listing, "listed_source": p.listed_src, "listed_destination": p.listed_dst,
    }


class JsonLines:
    """Writes one redacted JSON object per line to stdout; safe to call from the loop and display threads."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self._lock = threading.Lock()

    def emit(self, record: Mapping[str, object]) -> None:
        line = redact(json.dumps(record, ensure_ascii=False, default=str))
        with self._lock:
            stream = self.stream or sys.stdout
            stream.write(line + "\n")
            stream.flush()


class JsonEvents(BaseSubscriber):
    """Subscriber that prints every file's result (successes too) as a JSON line."""

    def __init__(self, out: JsonLines) -> None:
        self.out = out

    def on_done(self, result: FileResult) -> None:
        self.out.emit({"type": "file", "path": result.rel, "blob": result.blob, "size": result.size,
                       "status": result.status.value, "bytes_sent": result.bytes_sent,
                       "reason": result.reason or None})


class ProgressDisplay:
    """Shows progress while a job runs: a line redrawn in place on a terminal, a plain line every
    `interval` seconds otherwise, or a JSON progress record every `interval` seconds with `json_out`."""

    def __init__(self, progress: Progress, *, stream: TextIO | None = None, interval: float | None = None,
                 json_out: JsonLines | None = None) -> None:
        self.progress = progress
        self.stream = stream or sys.stderr
        self.json_out = json_out
        self.tty = json_out is None and self.stream.isatty()
        self.interval = interval if interval is not None else (0.5 if self.tty else 10.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ProgressDisplay:
        self._thread = threading.Thread(target=self._run, daemon=True, name="blobsync-progress")
        self._thread.start()
        return self

    def _show(self) -> None:
        if self.json_out is not None:
            self.json_out.emit(progress_record(self.progress))
        elif self.tty:
            self.stream.write("\r\x1b[K" + progress_line(self.progress))
            self.stream.flush()
        elif self.progress.files_total or self.progress.files_done or self.progress.listing:
            self.stream.write(progress_line(self.progress).strip() + "\n")
            self.stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._show()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def summary_record(report: Report, *, dry_run: bool = False) -> dict[str, object]:
    """The summary as one JSON-ready object."""
    return {
        "type": "summary", "job": report.job_id, "dry_run": dry_run, "direction": report.kind,
        "source": report.source, "destination": report.dest,
        "files_transferred": report.files_transferred, "files_skipped": report.files_skipped,
        "files_planned": report.files_planned, "bytes_planned": report.bytes_planned,
        "files_failed": report.files_failed, "files_deleted": report.files_deleted,
        "files_in_sync": report.files_in_sync, "files_held": report.files_held,
        "bytes_transferred": report.bytes_transferred, "bytes_sent": report.bytes_sent,
        "bytes_reused": report.bytes_reused, "bytes_delta": report.bytes_delta,
        "bytes_copied": report.bytes_copied,
        "retries": report.retries, "throttled": report.throttled,
        "lowest_concurrency": report.lowest_concurrency, "duration": round(report.duration, 3),
        "concurrency": report.concurrency or None, "concurrency_auto": report.concurrency_auto,
        "deletes_refused": report.deletes_refused or None,
        "notes": report.notes,
        "failures": [{"path": f.rel, "reason": f.reason} for f in report.failures],
        "exit_code": int(report.exit_code),
        **({"shards": [{"task": s.label, "worker": s.worker, "files": s.files, "bytes": s.bytes,
                        "duration": round(s.duration, 3), "retries": s.retries} for s in report.shards]}
           if report.shards else {}),
    }


def summary(report: Report, *, dry_run: bool = False) -> str:
    if report.kind == "remove":
        return _removal_summary(report, dry_run)
    if dry_run:
        verb = "to download" if report.kind == "download" else "to upload"
        return (f"Dry run: {report.files_planned} {verb}, {report.files_failed} with problems; "
                f"{human_bytes(report.bytes_planned)}; nothing was changed")
    if report.job_id == NO_JOB and not report.failures:
        held = f"; {report.files_held} still changing, left for later" if report.files_held else ""
        return f"Nothing to do: {report.files_in_sync} file(s) already in sync{held}"
    return "\n".join([*_totals(report), *_notes(report)])


def _totals(report: Report) -> list[str]:
    verb = "downloaded" if report.kind == "download" else "uploaded"
    where = "on disk" if report.kind == "download" else "on the service"
    rate = report.bytes_sent / report.duration if report.duration > 0 else 0.0
    resumed = report.bytes_reused - report.bytes_delta - report.bytes_copied
    return [
        f"Job {report.job_id}: {report.files_transferred} {verb}, {report.files_skipped} skipped, "
        f"{report.files_failed} failed",
        f"  {human_bytes(report.bytes_transferred)} {verb} in {report.duration:.1f}s "
        f"({human_bytes(rate)}/s); {human_bytes(report.bytes_sent)} over the wire"
        + (f", {human_bytes(report.bytes_delta)} reused by delta (unchanged blocks)" if report.bytes_delta else "")
        + (f", {human_bytes(resumed)} already {where} (resumed)" if resumed else "")
        + f"; {report.retries} retries",
    ]


def _notes(report: Report) -> list[str]:
    """The lines under the totals: how concurrency went, what was in sync, held, deleted, skipped or failed."""
    lines = []
    if report.concurrency_auto and report.concurrency:
        lines.append(f"  concurrency auto: settled at {report.concurrency} requests in flight "
                     f"(tried up to {report.concurrency_peak})")
    if report.throttled:
        lines.append(f"  the service throttled {report.throttled} time(s); concurrency went down to "
                     f"{report.lowest_concurrency or 'the same level'} and back up as it recovered")
    if report.shards:
        workers = sorted({s.worker for s in report.shards})
        per = ", ".join(f"{w} {human_bytes(sum(s.bytes for s in report.shards if s.worker == w))}" for w in workers)
        lines.append(f"  on the cluster: {len(report.shards)} task(s) on {len(workers)} worker(s): {per}")
    counts = ((report.files_in_sync, "file(s) already in sync"),
              (report.files_held, "file(s) still changing, left for later"),
              (report.files_deleted, "deleted at the destination"))
    lines.extend(f"  {n} {what}" for n, what in counts if n)
    if report.deletes_refused:
        lines.append(f"  {report.deletes_refused}")
    lines.extend(f"  {note}" for note in report.notes)
    for note in report.skipped_notes[:20]:
        if note.reason and note.reason != "already uploaded by this job":
            lines.append(f"  skipped {printable(note.rel)}: {printable(note.reason)}")
    for failure in report.failures:
        status = "FAILED" if failure.status is FileStatus.FAILED else "skipped"
        lines.append(f"  {status} {printable(failure.rel)}: {printable(failure.reason)}")
    return lines


def _removal_summary(report: Report, dry_run: bool) -> str:
    if dry_run:
        head = f"Dry run: {report.files_deleted} blob(s) would be removed; nothing was changed"
    else:
        head = (f"Removed {report.files_deleted} blob(s) in {report.duration:.1f}s"
                f"{f', {report.files_skipped} already gone' if report.files_skipped else ''}"
                f", {report.files_failed} failed; {report.retries} retries")
    lines = [head]
    if report.files_deleted == 0 and report.files_failed == 0 and not report.files_skipped:
        lines = [f"Nothing to remove at {report.source}"]
    for failure in report.failures:
        lines.append(f"  FAILED {printable(failure.rel)}: {printable(failure.reason)}")
    return "\n".join(lines)
