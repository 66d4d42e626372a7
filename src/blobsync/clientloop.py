"""The blocking Client's event loop in a thread of its own: background work that lands (close and the
interpreter's exit wait for it), done-callbacks run where a blocking call is allowed, and a fresh loop in a forked
child."""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.thread  # its exit hook registered before this module's (see the end)
import contextlib
import logging
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from blobsync.errors import DroppedError, UsageError
from blobsync.jobs.runner import JOBS_STARTED

T = TypeVar("T")
log = logging.getLogger("blobsync")



class ClientLoop:
    """One event loop in a daemon thread, the work submitted to it, and a thread where the futures handed out
    complete (their done-callbacks may call the Client again without deadlocking its loop)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._callbacks = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"{name}-callbacks")
        self._pending: dict[concurrent.futures.Future[Any], concurrent.futures.Future[Any]] = {}
        self._lock = threading.Lock()
        self._dropping = False
        self._tasks: set[asyncio.Task[Any]] = set()  # the submitted calls running on the loop
        self.closed = False

    @property
    def forked(self) -> bool:
        """True in a child forked from the process that made this loop: its thread did not come along."""
        return os.getpid() != self.pid

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def on_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def wait(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and block until it is done (interrupted: the call is stopped, resumable)."""
        if self.closed:
            coro.close()
            raise UsageError("this Client is closed")
        if self.on_loop_thread():
            coro.close()
            raise UsageError("a blocking Client call from the Client's own event loop (a subscriber or an "
                             "aio callback) would wait forever: use client.submit(...) or await client.aio there")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            if not future.done():  # interrupted while waiting: stop the call (resumable), then let it go
                future.cancel()
                concurrent.futures.wait([future], timeout=30)
            raise

    def submit(self, make: Callable[[], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
        """Start `make()` on the loop; the Future returned completes on the callbacks thread."""
        with self._lock:
            if self.closed or self._dropping:
                raise UsageError("this Client is closed")
            outer: concurrent.futures.Future[T] = concurrent.futures.Future()
            outer.set_running_or_notify_cancel()
            inner = asyncio.run_coroutine_threadsafe(self._tracked(make), self.loop)
            self._pending[inner] = outer
        inner.add_done_callback(self._settle)
        return outer

    async def _tracked(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        started: list[str] = []
        JOBS_STARTED.set(started)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self._dropping:
                raise asyncio.CancelledError
            return await make()
        except asyncio.CancelledError:
            if not self._dropping:
                raise
            job = started[-1] if started else None
            raise DroppedError("dropped by Client.close(cancel=True) before it finished" + (
                f": run 'blobsync jobs resume {job}' (or the same call again) to finish it" if job else
                "; nothing of it was committed: call it again")) from None
        finally:
            self._tasks.discard(task)

    def _settle(self, inner: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            outer = self._pending.pop(inner, None)
        if outer is None:
            return

        def transfer() -> None:
            if inner.cancelled():
                outer.set_exception(DroppedError("cancelled before it finished"))
            elif (error := inner.exception()) is not None:
                outer.set_exception(error)
            else:
                outer.set_result(inner.result())

        try:
            self._callbacks.submit(transfer)
        except RuntimeError:  # the interpreter is exiting: complete it here
            transfer()

    def close(self, shut: Callable[[], Coroutine[Any, Any, None]], *, wait: bool = True,
              cancel: bool = False) -> None:
        """Wait for (or, with `cancel`, drop) the submitted work, run `shut` on the loop, then stop it."""
        if self.closed:
            return
        if self.on_loop_thread():
            raise UsageError("Client.close() from the Client's own event loop would wait forever: close it from "
                             "the thread that made it")
        with self._lock:
            self._dropping = cancel or not wait
            inners = list(self._pending)
        if self._dropping:  # each task ends with a DroppedError that names its job (see _tracked)
            self.loop.call_soon_threadsafe(lambda: [task.cancel() for task in list(self._tasks)])
        concurrent.futures.wait(inners)
        try:
            self.wait(shut())
        finally:
            self.closed = True
            self._stop_loop()

    def abandon(self, shut: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """The Client was dropped unclosed (garbage collected, from any thread): without waiting here, let its
        submitted work finish, run `shut` on the loop, then stop the loop (nothing is left to warn at exit)."""
        if self.closed or self.forked or self.loop.is_closed():
            return
        self.closed = True

        async def end() -> None:
            try:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
                await shut()
            finally:
                self.loop.stop()
                self._callbacks.shutdown(wait=False)

        with contextlib.suppress(RuntimeError):  # the loop stopped already (the interpreter is exiting)
            asyncio.run_coroutine_threadsafe(end(), self.loop)

    def _stop_loop(self) -> None:
        async def finish() -> None:  # no task is left pending to be destroyed with the loop
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(finish(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()
        in_callbacks = threading.current_thread().name.startswith(f"{self._name}-callbacks")
        self._callbacks.shutdown(wait=not in_callbacks)


# Clients still open when the interpreter exits: their submitted work is waited for first (as a
# ThreadPoolExecutor's is), before the thread pools it needs shut down.
_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()


def track(client: Any) -> None:
    _OPEN.add(client)


def _close_open_clients() -> None:
    for client in list(_OPEN):
        with contextlib.suppress(Exception):
            if client.pending():  # said where a script's author sees it: the library logs to no handler of theirs
                warnings.warn(f"the interpreter is exiting with {client.pending()} background call(s) of an open "
                              "blobsync Client: waiting for them to finish (close() the Client to decide yourself)",
                              RuntimeWarning, stacklevel=1)
            client.close()


# threading's own exit hooks run in the reverse order of registration, before concurrent.futures shuts down its
# thread pools (registered when it was imported, before this module): the work can still use them.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_close_open_clients)
else:  # pragma: no cover - every CPython since 3.9 has it
    import atexit

    atexit.register(_close_open_clients)
