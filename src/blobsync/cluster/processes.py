"""Worker processes of blobsync's own on this machine (--processes N): the cluster path's Executor over a process
pool, no Dask. A job of many small files is bound by one process's CPU (~0.5 ms a file); N processes each run
an engine of their own on shards of the job, while the client plans, journals and reports as with a cluster."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any

from blobsync.cluster import tasks
from blobsync.cluster.shards import SplitFile
from blobsync.cluster.spec import ShardReport, ShardSpec
from blobsync.engine.bandwidth import BucketState
from blobsync.engine.budget import WARM
from blobsync.local.platform import usable_cores

TASK_RETRIES = 2  # as on Dask: a task that raised runs at most three times in all
RELAY_POLL = 0.2  # s: how soon the relay thread sees that close() asked it to stop
WARM_BYTES = 512 << 20  # a worker keeps up to this much of a finished task's idle buffers for the next task

_events: Any = None  # in a worker process: the queue its progress goes to (set by _start)


def prestart(count: int) -> ProcessExecutor | None:
    """`count` workers forked from this process now, for the command's first job to take (ProcessExecutor.open),
    or None where they cannot be (no fork here, or a thread already runs: a fork copies the locks other threads
    hold). Only blobsync's own command calls this, first thing: a library's host (its threads, a GPU context) always
    gets spawned workers. A forked worker starts in milliseconds with every module imported; a spawned one imports
    the engine and aiohttp first (~0.3 s of CPU each), which a job of one large file pays on its critical path."""
    if "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1:
        return None
    # What a task runs (the engine's steps, the Blob store, aiohttp, awscrt's CRC64), loaded once, here: a worker
    # imports nothing its first task needs.
    from blobsync.backends.azure import store  # noqa: F401
    from blobsync.backends.trust_store import import_aiohttp
    from blobsync.checksums import crc64_available
    from blobsync.cluster import split  # noqa: F401

    import_aiohttp()
    crc64_available()

    gc.freeze()  # the objects of now kept out of the workers' collections: their pages stay shared
    try:
        executor = ProcessExecutor(count, fork=True)
    finally:
        gc.unfreeze()
    return executor  # a command that stops before its job takes them: the pool's own exit handler ends them


class ProcessExecutor:
    """Runs the client's units in a pool of local worker processes (spawned, or forked by `prestart` before the
    command starts any thread or event loop); their progress comes back through one queue."""

    shares_machine = True  # the workers share this machine's memory: the job's memory budget is split among them

    def __init__(self, count: int, fork: bool = False, env: Mapping[str, str] = os.environ) -> None:
        context = multiprocessing.get_context("fork" if fork else "spawn")
        self.count = count
        self.cores = _cores(env)
        self._queue = _Events(context)
        self._stopping = threading.Event()
        # The job's one bandwidth cap, in memory every worker shares: the client moves its bucket in (run).
        self.cap_state = BucketState.shared()
        self._pool = concurrent.futures.ProcessPoolExecutor(count, mp_context=context, initializer=_start,
                                                            initargs=(self._queue, self.cap_state))
        if fork:
            self._pool.submit(int)  # a forking pool forks all its workers at its first task: now, with no thread
        self._handler: Callable[[dict[str, Any]], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._broken = False
        self._taken = False
        self._reader = threading.Thread(target=self._relay, name="blobsync-process-events", daemon=True)
        self._reader.start()

    @classmethod
    async def open(cls, count: int, started: object = None) -> ProcessExecutor:
        """The workers `prestart` started, the first time a job asks (with as many), else `count` spawned ones."""
        ready = isinstance(started, ProcessExecutor) and started.count == count and not started._taken
        executor = started if ready and isinstance(started, ProcessExecutor) else cls(count)
        executor._taken = True
        executor._loop = asyncio.get_running_loop()
        return executor

    async def workers(self) -> list[str]:
        return [] if self._broken else [f"process {i + 1}" for i in range(self.count)]

    def worker_count(self) -> int:
        return 0 if self._broken else self.count

    def connected(self) -> bool:
        return not self._broken

    async def blind_workers(self, path: str, marker: str) -> list[str]:
        return []  # the same machine, the same file system

    def run_shard(self, spec: ShardSpec) -> asyncio.Future[ShardReport]:
        return asyncio.ensure_future(self._call(tasks.SHARD, spec))

    async def run_split(self, split: SplitFile, upload: bool, digest: Any = "",
                        on_part: Callable[[ShardReport], None] | None = None) -> list[ShardReport]:
        started: list[asyncio.Future[Any]] = []

        def submit(kind: str, *args: Any, n: int | None = None) -> asyncio.Future[Any]:
            started.append(asyncio.ensure_future(self._after(kind, *args)))
            return started[-1]

        parts, last = tasks.split_graph(submit, split, upload, digest)
        try:
            return await tasks.gather_split(parts, last, on_part)
        finally:
            for task in started:
                task.cancel()

    async def _after(self, kind: str, *args: Any) -> Any:
        """Task `kind` once the tasks it takes the results of are done, with their results."""
        inputs = [await a if isinstance(a, asyncio.Future) else a for a in args]
        return await self._call(kind, *inputs)

    async def _call(self, kind: str, *args: Any) -> Any:
        """One task in the pool, tried again where it raised (not where the pool itself broke)."""
        for attempt in range(TASK_RETRIES + 1):
            try:
                return await _unlinked(self._pool.submit(_task, kind, *args))
            except concurrent.futures.process.BrokenProcessPool:
                self._broken = True  # a worker died (killed, out of memory): the job stops, resumable
                raise
            except Exception:
                if attempt == TASK_RETRIES:
                    raise
        raise AssertionError("unreachable")

    def follow(self, topic: str, handler: Callable[[dict[str, Any]], None]) -> None:
        self._handler = handler

    def _relay(self) -> None:
        """Worker progress events into the client's loop, those waiting taken together (one wake-up of the loop
        for them all), until close() says stop: then those still in the pipe, and no more (the workers are gone)."""
        while True:
            stopping = self._stopping.is_set()
            events = self._queue.take(0 if stopping else RELAY_POLL)
            loop, handler = self._loop, self._handler
            if events and loop is not None and handler is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(_each, handler, events)
            if stopping and not events:
                return

    async def close(self) -> None:
        """Stops the workers at once (a stopped job resumes from what its journal and the store hold)."""
        processes = list(getattr(self._pool, "_processes", {}).values())
        # Pending tasks are not cancelled here: the pool fails them itself once its workers are gone (Python 3.11's
        # pool raises InvalidStateError in its own thread, with a traceback on stderr, when it fails a task that
        # was cancelled meanwhile).
        self._pool.shutdown(wait=False)
        for process in processes:
            with contextlib.suppress(Exception):
                process.terminate()
        await asyncio.to_thread(_join, processes)
        # Not a last message through the queue: a worker terminated while it was writing one holds the queue's
        # lock for good, and a put would wait on it forever (seen: a SIGTERM'd job that never ended).
        self._stopping.set()
        await asyncio.to_thread(self._reader.join, 5)


class _Events:
    """The workers' progress events to the client: one pipe, a lock among the writers (each message is written
    whole), read by the client's relay thread with a timeout, so that it can stop whatever a worker left."""

    def __init__(self, context: Any) -> None:
        self._reader, self._writer = context.Pipe(duplex=False)
        self._lock = context.Lock()

    def put(self, event: dict[str, Any]) -> None:
        """In a worker: one event."""
        with self._lock:
            self._writer.send(event)

    def take(self, timeout: float) -> list[dict[str, Any]]:
        """In the client: the events waiting, or the first to come within `timeout` (none: an empty list)."""
        events: list[dict[str, Any]] = []
        while self._reader.poll(0 if events else timeout):
            events.append(self._reader.recv())
        return events


def _cores(env: Mapping[str, str]) -> int:
    """The cores the workers share (what a split of one file counts on): this process's, or BLOBSYNC_SPLIT_CORES
    (tests and benchmarks: the split as a larger machine makes it)."""
    given = env.get("BLOBSYNC_SPLIT_CORES", "").strip()
    return int(given) if given.isdigit() and 0 < int(given) <= 4096 else usable_cores()


def _unlinked(task: concurrent.futures.Future[Any]) -> asyncio.Future[Any]:
    """An asyncio future that takes the pool task's outcome; cancelling it leaves the task to the pool (see
    close()), unlike asyncio.wrap_future, which cancels the task too."""
    loop = asyncio.get_running_loop()
    out: asyncio.Future[Any] = loop.create_future()

    def settle(done: concurrent.futures.Future[Any]) -> None:
        if out.done():
            return
        if done.cancelled():
            out.cancel()
        elif (error := done.exception()) is not None:
            out.set_exception(error)
        else:
            out.set_result(done.result())

    def handed_back(done: concurrent.futures.Future[Any]) -> None:
        with contextlib.suppress(RuntimeError):  # the client's loop is closed: nobody waits for it any more
            loop.call_soon_threadsafe(settle, done)

    task.add_done_callback(handed_back)
    return out


def _each(handler: Callable[[dict[str, Any]], None], events: list[dict[str, Any]]) -> None:
    for event in events:
        handler(event)


def _join(processes: list[Any]) -> None:
    for process in processes:
        with contextlib.suppress(Exception):
            process.join(5)


# --- what runs in a worker process (module level: the pool pickles these by reference) ----------------------


def _start(queue: Any, cap_state: BucketState) -> None:
    from blobsync.cluster import work
    from blobsync.local.platform import tune_malloc

    # A forked worker has the command's signal handlers, and its wakeup descriptor (a signal here would wake the
    # command's loop as if the command had it): the defaults, as a spawned worker has them.
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    tune_malloc()  # a process of blobsync's own, as the command's
    WARM.keep(WARM_BYTES)  # its range tasks' sessions, one after another, reuse the pages of the one before
    global _events
    _events = queue
    work.MACHINE_CAP.state = cap_state
    # Ctrl-C reaches the whole process group: the client alone handles it and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _task(kind: str, spec: Any, *rest: Any) -> Any:
    from blobsync.cluster.tasks import run

    return run(kind, _events.put, None, spec, *rest)
