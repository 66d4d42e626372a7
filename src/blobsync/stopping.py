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


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`; while it runs, a stop signal cancels it and KeyboardInterrupt is raised here."""
    if not _stop_signals or threading.current_thread() is not threading.main_thread():
        return asyncio.run(coro)
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
        return asyncio.run(main())
    except asyncio.CancelledError:
        if stopped:
            raise KeyboardInterrupt from None
        raise
