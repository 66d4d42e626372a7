"""Background checkpoint saves outlive the call that started them, not the interpreter: its exit waits for each one
and says on stderr which failed unseen (a job's last checkpoint is never lost without a word)."""

from __future__ import annotations

import concurrent.futures
import sys
import threading
from typing import Any, TypeVar

import blobsync.clientloop  # noqa: F401  its exit hook registered first, so it runs after this module's
from blobsync.redact import redact

T = TypeVar("T")
_PENDING: dict[Save[Any], str] = {}
_LOCK = threading.Lock()


class Save(concurrent.futures.Future[T]):
    """A save under way, as its caller holds it: once the caller has asked for its outcome (`result()` or
    `exception()`), a failure is theirs to handle; until then, the interpreter's exit reports it."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what
        with _LOCK:
            _PENDING[self] = what
        self.add_done_callback(_settled)

    def result(self, timeout: float | None = None) -> T:
        try:
            return super().result(timeout)
        finally:
            if self.done():
                _forget(self)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        error = super().exception(timeout)
        _forget(self)
        return error


def chain(source: concurrent.futures.Future[Any], save: Save[T], then: Any = None) -> Save[T]:
    """`save` completes as `source` does (its result passed through `then(result)` when given)."""

    def finished(done: concurrent.futures.Future[Any]) -> None:
        try:
            value = done.result()
            save.set_result(then(value) if then is not None else value)
        except BaseException as exc:  # the caller learns why through `save`
            save.set_exception(exc)

    source.add_done_callback(finished)
    return save


def _settled(future: concurrent.futures.Future[Any]) -> None:
    if future.cancelled() or concurrent.futures.Future.exception(future) is None:
        _forget(future)


def _forget(future: concurrent.futures.Future[Any]) -> None:
    with _LOCK:
        _PENDING.pop(future, None)  # type: ignore[call-overload]


def wait_all() -> list[str]:
    """Wait for every save still tracked; a line (also on stderr) for each that failed with nobody told."""
    with _LOCK:
        pending = dict(_PENDING)
    running = sum(not f.done() for f in pending)
    if running:
        print(f"blobsync: waiting for {running} checkpoint save(s) still uploading before exit", file=sys.stderr,
              flush=True)
    lines = []
    for future, what in pending.items():
        concurrent.futures.wait([future])
        error = concurrent.futures.Future.exception(future) if not future.cancelled() else None
        if future.cancelled() or error is not None:
            lines.append(redact(f"blobsync: {what} was NOT saved: {error or 'cancelled'}"))  # any error's text
        _forget(future)
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return lines


# threading's exit hooks run in the reverse order of registration: this one (registered after clientloop's) runs
# first, while the Clients and thread pools the saves use are still open.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(wait_all)
else:  # pragma: no cover - every CPython since 3.9 has it
    import atexit

    atexit.register(wait_all)
