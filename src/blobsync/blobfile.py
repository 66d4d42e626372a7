"""File objects over blobs, blocking and async: a seekable reader with parallel read-ahead, and a writer that stages
blocks as they are written and commits on close (numpy.save, pickle.dump, torch.save-style writers)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import warnings
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

from blobsync.errors import UsageError
from blobsync.report import FileResult

Submit = Callable[[Coroutine[Any, Any, bytes]], "concurrent.futures.Future[bytes]"]


class _InFlight(Protocol):
    """A block's fetch in flight: a concurrent.futures.Future (the blocking reader) or an asyncio.Task."""

    def done(self) -> bool: ...

    def cancelled(self) -> bool: ...

    def exception(self) -> BaseException | None: ...

    def cancel(self) -> bool: ...


F = TypeVar("F", bound=_InFlight)


class _ReadAhead(Generic[F]):
    """What both readers share: one version of a blob read at any offset, `ahead` blocks past the position fetched
    in parallel while the caller reads; blocks fetched outside that window are kept, a window's worth at most, for
    a reader that seeks back to them (torch.load reads a zip's end, then its records from the start)."""

    closed: bool

    def __init__(self, name: str, size: int, block_size: int, fetch: Callable[[int, int], Coroutine[Any, Any, bytes]],
                 ahead: int) -> None:
        self.name = name
        self.size = size
        self.block_size = block_size
        self._fetch = fetch
        self._ahead = max(0, ahead)
        self._pos = 0
        self._blocks: dict[int, F] = {}

    def _start(self, fetch: Coroutine[Any, Any, bytes]) -> F:
        raise NotImplementedError

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = seek_to(self._pos, self.size, offset, whence)
        return self._pos

    def _next(self, buffer: Any) -> tuple[memoryview, F] | None:
        """Where a read goes and the block it reads from (None: nothing to read)."""
        if self.closed:
            raise ValueError("read from a closed blob reader")
        view = memoryview(buffer).cast("B")
        if self._pos >= self.size or not len(view):
            return None
        index = self._pos // self.block_size
        last = (self.size - 1) // self.block_size
        for i in range(index, min(last, index + self._ahead) + 1):
            if i not in self._blocks:
                offset = i * self.block_size
                self._blocks[i] = self._start(self._fetch(offset, min(self.block_size, self.size - offset)))
        # Outside the window a window's worth is kept, here or still coming (see the class): first blocks past it
        # (a reader that read a file's end comes back to it), then the latest behind it; the rest are dropped.
        outside = [i for i in self._blocks if i > index + self._ahead] + \
            [i for i in reversed(self._blocks) if i < index]
        kept = 0
        for i in outside:
            block = self._blocks[i]
            failed = block.cancelled() or (block.done() and block.exception() is not None)
            if not failed and kept < self._ahead + 1:
                kept += 1
                continue
            self._blocks.pop(i).cancel()
        return view, self._blocks[index]

    def _copy(self, view: memoryview, data: bytes) -> int:
        start = self._pos % self.block_size
        n = min(len(view), len(data) - start)
        view[:n] = data[start:start + n]
        self._pos += n
        return n


class BlobReader(_ReadAhead["concurrent.futures.Future[bytes]"], io.RawIOBase):
    """The blocking reader: io's raw reader over `_ReadAhead`, its fetches submitted to the Client's loop."""

    def __init__(self, name: str, size: int, block_size: int, fetch: Callable[[int, int], Coroutine[Any, Any, bytes]],
                 submit: Submit, ahead: int = 4) -> None:
        _ReadAhead.__init__(self, name, size, block_size, fetch, ahead)
        io.RawIOBase.__init__(self)
        self._submit = submit

    def _start(self, fetch: Coroutine[Any, Any, bytes]) -> concurrent.futures.Future[bytes]:
        return self._submit(fetch)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        found = self._next(buffer)
        return 0 if found is None else self._copy(found[0], found[1].result())

    def close(self) -> None:
        for future in self._blocks.values():
            future.cancel()
        self._blocks.clear()
        super().close()


class BlobWriter(io.RawIOBase):
    """The blocking writer: io's raw writer over an AsyncBlobWriter whose calls run on the Client's loop (`run`).
    `close()` commits (nothing is visible before it) and keeps the record of what landed in `result`; leaving a
    `with` block by an exception commits nothing and leaves no blob."""

    def __init__(self, name: str, write: Callable[[memoryview, bool], Coroutine[Any, Any, int]],
                 finish: Callable[[], Coroutine[Any, Any, FileResult]], abort: Callable[[], Coroutine[Any, Any, None]],
                 run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        super().__init__()
        self.name = name
        self.path = name  # as fsspec's file objects have it (its filesystem sets `fs`)
        self.fs: Any = None
        self._async = AsyncBlobWriter(name, write, finish, abort)
        self._run = run

    @property
    def result(self) -> FileResult | None:
        return self._async.result

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._async.tell()

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError("write to a closed blob writer")
        n: int = self._run(self._async.write(data))  # waited for: the stream copies what it keeps
        return n

    def write_borrowed(self, data: Any) -> int:
        """Write `data` without copying its whole blocks: they are sent from its memory, which must stay alive
        (`data` an object that owns it, or a view of one) and unchanged until `close()` or `abort()` returns."""
        if self.closed:
            raise ValueError("write to a closed blob writer")
        n: int = self._run(self._async.write(data, borrowed=True))
        return n

    def close(self) -> None:
        if not self.closed:
            try:
                self._run(self._async.close())
            finally:
                super().close()

    def __del__(self) -> None:
        # io's own finaliser would call close(), which commits: a writer dropped without close() (an exception
        # that skipped it, a script that forgot it) must leave the blob as it was, as a half-written file would.
        if not self.closed:
            warnings.warn(f"blob writer {self.name!r} dropped without close(): nothing was committed",
                          ResourceWarning, stacklevel=2)
            io.RawIOBase.close(self)

    def abort(self) -> None:
        """Commit nothing: the blob is left as it was (or absent)."""
        if not self.closed:
            try:
                self._run(self._async.abort())
            finally:
                super().close()

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is not None:
            self.abort()
        else:
            self.close()


def seek_to(pos: int, size: int, offset: int, whence: int) -> int:
    """The position a seek lands on, as io's rules have it (past the end is allowed; before the start is not)."""
    base = {io.SEEK_SET: 0, io.SEEK_CUR: pos, io.SEEK_END: size}.get(whence)
    if base is None:
        raise ValueError(f"invalid whence {whence}")
    if base + offset < 0:
        raise ValueError("negative seek position")
    return base + offset


def check_mode(mode: str) -> str:
    if mode == "ab":
        raise UsageError("mode 'ab' is not offered: a block blob cannot be appended to in place (its blocks are "
                         "committed at once); read it and write it anew with 'wb', or write the new part as a "
                         "blob of its own")
    if mode not in ("rb", "wb"):
        raise UsageError(f"invalid mode {mode!r}: blobs open 'rb' (read) or 'wb' (write), binary only")
    return mode


class AsyncBlobReader(_ReadAhead["asyncio.Task[bytes]"]):
    """The async reader of one version of a blob: `await read(n)`, `readinto`, `seek`, `tell`; its fetches are
    tasks of the running loop."""

    def __init__(self, name: str, size: int, block_size: int,
                 fetch: Callable[[int, int], Coroutine[Any, Any, bytes]], ahead: int = 4) -> None:
        super().__init__(name, size, block_size, fetch, ahead)
        self.closed = False

    def _start(self, fetch: Coroutine[Any, Any, bytes]) -> asyncio.Task[bytes]:
        return asyncio.ensure_future(fetch)

    async def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes from the position (all the rest with n < 0); b'' at the end."""
        want = max(0, self.size - self._pos) if n < 0 else n
        out = bytearray(want)
        got = 0
        while got < want:
            step = await self.readinto(memoryview(out)[got:])
            if not step:
                break
            got += step
        return bytes(out[:got])

    async def readinto(self, buffer: Any) -> int:
        found = self._next(buffer)
        return 0 if found is None else self._copy(found[0], await asyncio.shield(found[1]))

    async def close(self) -> None:
        self.closed = True
        tasks = list(self._blocks.values())
        self._blocks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> AsyncBlobReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncBlobWriter:
    """The async writer of a blob: `await write(data)` stages full blocks as they fill, `await close()` commits
    and returns the record of what landed (`result`); leaving `async with` by an exception commits nothing."""

    def __init__(self, name: str, write: Callable[[memoryview, bool], Coroutine[Any, Any, int]],
                 finish: Callable[[], Coroutine[Any, Any, FileResult]],
                 abort: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.name = name
        self._write, self._finish, self._abort = write, finish, abort
        self._pos = 0
        self.closed = False
        self.result: FileResult | None = None

    def tell(self) -> int:
        return self._pos

    async def write(self, data: Any, *, borrowed: bool = False) -> int:
        """Stage `data` (copied, unless `borrowed`: see BlobWriter.write_borrowed)."""
        if self.closed:
            raise ValueError("write to a closed blob writer")
        n = await self._write(memoryview(data).cast("B"), borrowed)  # the stream copies what it keeps
        self._pos += n
        return n

    async def close(self) -> FileResult | None:
        if self.closed:
            return self.result
        self.closed = True
        try:
            self.result = await self._finish()
        except BaseException:
            await self._abort()
            raise
        return self.result

    async def abort(self) -> None:
        """Commit nothing: the blob is left as it was (or absent)."""
        if not self.closed:
            self.closed = True
            await self._abort()

    async def __aenter__(self) -> AsyncBlobWriter:
        return self

    async def __aexit__(self, kind: object, *rest: object) -> None:
        if kind is not None:
            await self.abort()
        else:
            await self.close()
