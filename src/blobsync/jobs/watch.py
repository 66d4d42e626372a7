"""sync --watch: sync once, then again whenever files changed and have settled, until told to stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import watchfiles

from blobsync.engine.retry import RetryPolicy, backoff_delay
from blobsync.errors import BlobsyncError, Scope, UsageError
from blobsync.report import Report

log = logging.getLogger("blobsync")

Ready = Callable[[str, int], bool]
RunRound = Callable[[Ready], Awaitable[Report]]

# Between failed rounds: the project's one backoff (full jitter, Retry-After honoured), up to a minute, never
# shorter than the settle time.
ROUND_BACKOFF = RetryPolicy(base_delay=2.0, max_delay=60.0)
_FUTURE_NS = 60_000_000_000  # an mtime this far ahead is a clock oddity, not a writer at work


class Watcher:
    """Runs `run_round` (one sync that only sends files `ready` admits) when changes have settled.

    A file is ready once neither an event nor its mtime is younger than `settle` seconds, so a checkpoint
    being written is never sent half-way; a burst of changes becomes one round. A round that fails (network
    gone, a file that changed while read) is retried with backoff; the next round resumes what was staged."""

    def __init__(self, root: Path, run_round: RunRound, *, settle: float, stop: Callable[[], bool],
                 on_round: Callable[[Report], None] | None = None,
                 on_error: Callable[[BlobsyncError, float], None] | None = None,
                 ignore: tuple[str, ...] = (), poll: float = 0.2) -> None:
        self.root = root
        self.run_round = run_round
        self.settle = settle
        self.stop = stop
        self.on_round = on_round or (lambda report: None)
        self.on_error = on_error or (lambda exc, delay: None)
        self.ignore = ignore  # path prefixes whose events are ours (the journal, the sync index)
        self.poll = poll  # how often `stop` is asked while idle
        self.rounds = 0
        self._dirty: dict[str, float] = {}  # relative path -> monotonic time of its last event
        self._recheck: float | None = 0.0  # the initial sync runs at once
        self._not_before = 0.0  # backoff after a failed round
        self._failures = 0
        self._wake = asyncio.Event()

    async def run(self) -> None:
        stop_events = threading.Event()  # the watch thread polls it: set from any thread
        events = asyncio.create_task(self._events(stop_events))
        try:
            while not self.stop():
                if events.done():
                    events.result()  # the watcher itself failed (folder removed): say so
                    raise UsageError(f"stopped watching {self.root}: it is gone")
                now = time.monotonic()
                due = self._due()
                if due is not None and due <= now:
                    await self._round()
                    continue
                self._wake.clear()
                timeout = self.poll if due is None else min(self.poll, due - now)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        finally:
            stop_events.set()
            await asyncio.wait([events])
            if not events.cancelled():
                events.exception()  # retrieved: a failure while stopping adds nothing

    def _due(self) -> float | None:
        times = [self._recheck] if self._recheck is not None else []
        if self._dirty:
            times.append(min(self._dirty.values()) + self.settle)
        return max(min(times), self._not_before) if times else None

    async def _events(self, stop: threading.Event) -> None:
        root = str(self.root)
        async for changes in watchfiles.awatch(root, watch_filter=self._wanted, stop_event=stop, debounce=400,
                                               step=50):
            now = time.monotonic()
            for _, path in changes:
                self._dirty[os.path.relpath(path, root).replace(os.sep, "/")] = now
            self._wake.set()

    def _wanted(self, change: watchfiles.Change, path: str) -> bool:
        return not path.startswith(self.ignore) if self.ignore else True

    def _ready(self, started: float) -> Ready:
        settle_ns = int(self.settle * 1e9)

        def ready(rel: str, mtime_ns: int) -> bool:
            now_ns = time.time_ns()
            writing = now_ns - settle_ns < mtime_ns <= now_ns + _FUTURE_NS
            event = self._dirty.get(rel)
            return not writing and (event is None or event <= started - self.settle)

        return ready

    async def _round(self) -> None:
        started = time.monotonic()
        self.rounds += 1
        try:
            report = await self.run_round(self._ready(started))
        except BlobsyncError as exc:
            if exc.scope is Scope.RUN:
                raise  # no later round can fare better: stop with it (and its exit code), never retry forever
            self._failed(exc)
            return
        for rel, when in list(self._dirty.items()):
            if when <= started - self.settle:
                del self._dirty[rel]  # it was considered: sent, in sync, or failed and retried below
        if report.files_failed:
            self._failed(None)
        else:
            self._failures = 0
            self._not_before = 0.0
            # Files held by their mtime alone raise no further event: look again once they may have settled.
            self._recheck = time.monotonic() + self.settle if report.files_held else None
        self.on_round(report)

    def _failed(self, exc: BlobsyncError | None) -> None:
        self._failures += 1
        delay = max(self.settle, 0.5, backoff_delay(ROUND_BACKOFF, self._failures, exc))
        self._not_before = self._recheck = time.monotonic() + delay
        if exc is not None:
            log.info("sync round failed, retrying in %.0fs: %s", delay, exc)
            self.on_error(exc, delay)
