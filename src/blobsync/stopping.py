"""Running a job's event loop so that SIGTERM and SIGHUP stop it as cleanly as Ctrl-C (exit 130, resumable)."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# The signals that cancel a running job, set by the command line (a library leaves its host's signals alone).
_stop_signals: tuple[signal.Signals, ...] = ()


def stop_on_signals() -> None:
    """From now on, SIGTERM (and SIGHUP, unless it was ignored when we started) cancel a running job.

    The signal cancels the job's main task itself, so it works whatever SIGINT's disposition: a job started
    with `cmd &` from a script inherits SIGINT as ignored, and a SIGTERM that only raised SIGINT went nowhere.
    An inherited 'ignore' is kept (nohup leaves SIGHUP ignored; SIGINT ignored stays ignored)."""
    global _stop_signals
    # SIGBREAK: Ctrl-Break in a Windows console (Ctrl-C is SIGINT there too, and asyncio.run cancels on it).
    wanted = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGBREAK") if hasattr(signal, name)]
    _stop_signals = tuple(s for s in wanted if s == signal.SIGTERM or signal.getsignal(s) != signal.SIG_IGN)


# The loop every job of this thread runs on, when one is kept across jobs (`blobsync run`: one session, whose
# connections belong to one loop); None: each job on a loop of its own.
_kept_loop: asyncio.AbstractEventLoop | None = None


def keep_loop(loop: asyncio.AbstractEventLoop | None) -> None:
    """Run the jobs started from now on on `loop` (None: each on a new loop again)."""
    global _kept_loop
    _kept_loop = loop


def _run(main: Coroutine[Any, Any, T]) -> T:
    if _kept_loop is not None and threading.current_thread() is threading.main_thread():
        return _kept_loop.run_until_complete(main)
    return asyncio.run(main)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`; while it runs, a stop signal cancels it and KeyboardInterrupt is raised here."""
    if not _stop_signals or threading.current_thread() is not threading.main_thread():
        return _run(coro)
    stopped: list[int] = []

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(signum: int) -> None:
            stopped.append(signum)
            task.cancel()

        installed = []
        previous: dict[int, Any] = {}
        for sig in _stop_signals:
            try:
                loop.add_signal_handler(sig, on_signal, sig)
                installed.append(sig)
            except NotImplementedError:  # Windows' loops: a plain handler that hands the signal to the loop
                previous[sig] = signal.signal(sig, lambda signum, _frame: loop.call_soon_threadsafe(on_signal, signum))
            except (RuntimeError, ValueError):
                continue
        try:
            return await coro
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    try:
        return _run(main())
    except asyncio.CancelledError:
        if stopped:
            raise KeyboardInterrupt from None
        raise


def run_beside(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on a loop of its own in a helper thread, for a caller whose thread already runs a loop (a
    notebook cell, an async framework's callback), and wait for it. An interrupt of the waiting thread cancels
    the job, which stops within a second as a cancelled one does (resumable), and is then raised here: a
    KeyboardInterrupt (a notebook's interrupt, Ctrl-C under a plain loop), or the cancellation of the host's task
    (Ctrl-C under asyncio.run, whose handler cancels its main task and cannot run it while this thread waits)."""
    host = asyncio.current_task()
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)
    outcome: list[BaseException] = []

    def drive() -> None:
        try:
            loop.run_until_complete(task)
        except BaseException as exc:  # handed to the waiting thread
            outcome.append(exc)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    helper = threading.Thread(target=drive, name="blobsync", daemon=True)
    helper.start()
    try:
        while helper.is_alive():
            helper.join(0.1)  # short waits: the interrupt lands between them
            if host is not None and host.cancelling():
                raise asyncio.CancelledError
    except BaseException:
        loop.call_soon_threadsafe(task.cancel)
        helper.join()
        raise
    if outcome:
        raise outcome[0]
    return task.result()
