"""Upload sources that are not files on disk: bytes, buffers and binary file objects, read as a file would be."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import BinaryIO

from blobsync.errors import SourceChangedError, UsageError
from blobsync.local.files import FileIdentity, clamp_ns

Data = bytes | bytearray | memoryview | BinaryIO


class BufferSource:
    """Bytes in memory as an upload source. The caller's buffer is read in place (no copy of a large checkpoint);
    it must not change until the call returns."""

    def __init__(self, view: memoryview, name: str) -> None:
        self.view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        self.path = PurePosixPath(name)  # names the content type; never opened
        self.opened = FileIdentity(len(self.view), time.time_ns(), 0)

    def identity(self) -> FileIdentity:
        return self.opened

    def read_into(self, buf: memoryview, offset: int) -> None:
        end = offset + len(buf)
        if end > len(self.view):
            raise SourceChangedError(f"{self.path}: the buffer is shorter than it was")
        buf[:] = self.view[offset:end]

    def read_all(self, size: int) -> bytes:
        return bytes(self.view[:size])

    def read_all_cached(self, size: int) -> bytearray | None:
        return bytearray(self.view[:size])


class FileObjectSource(BufferSource):
    """A seekable binary file object, read at offsets: the engine's worker threads read blocks together, so each
    seek+readinto pair holds a lock."""

    def __init__(self, file: BinaryIO, name: str) -> None:
        import threading

        self.file = file
        self._lock = threading.Lock()
        start = file.tell()
        size = file.seek(0, io.SEEK_END) - start
        file.seek(start)
        self._start = start
        self.path = PurePosixPath(name)
        self._fd = _fileno(file)
        # A file on disk as fstat sees it (a change during the upload shows, as for a path); else as opened now.
        self.opened = self.identity() if self._fd is not None else FileIdentity(size, time.time_ns(), 0)

    def identity(self) -> FileIdentity:
        """A file on disk: as it is now (a change during the upload is seen, as for a path); else as opened."""
        if self._fd is None:
            return self.opened
        st = os.fstat(self._fd)
        return FileIdentity(st.st_size - self._start, clamp_ns(st.st_mtime_ns), st.st_ino, clamp_ns(st.st_ctime_ns))

    @property
    def resume_key(self) -> str | None:
        """What names this source across runs (the file's path, where it has one on disk), so a put of the same
        file again resumes its staged blocks; None for an object nothing names."""
        name = getattr(self.file, "name", None)
        if self._fd is None or not isinstance(name, str):
            return None
        return f"file:{os.path.abspath(name)}@{self._start}"

    def read_into(self, buf: memoryview, offset: int) -> None:
        with self._lock:
            self.file.seek(self._start + offset)
            done = 0
            while done < len(buf):
                n = self.file.readinto(buf[done:])  # type: ignore[attr-defined]
                if not n:
                    raise SourceChangedError(f"{self.path}: the file object ended early")
                done += n

    def read_all(self, size: int) -> bytes:
        return bytes(_whole(self.read_into, size))

    def read_all_cached(self, size: int) -> bytearray | None:
        return None  # a file object's read may block: the caller reads it in a worker thread


def source_of(data: object, name: str) -> BufferSource:
    """The upload source for what a caller passed to put(): bytes-like, or a seekable binary file object."""
    if isinstance(data, bytes | bytearray | memoryview):
        return BufferSource(memoryview(data), name)
    if hasattr(data, "readinto") and hasattr(data, "seek"):
        try:
            if data.seekable():  # type: ignore[attr-defined]
                return FileObjectSource(data, name)  # type: ignore[arg-type]
        except (OSError, ValueError):
            pass
    raise UsageError(f"invalid data={type(data).__name__}: put() takes bytes, bytearray, memoryview or a seekable "
                     "binary file object")


def _fileno(file: object) -> int | None:
    try:
        fd = file.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # io.BytesIO raises UnsupportedOperation (an OSError)
        return None
    return fd if isinstance(fd, int) else None


class GeneratedSource:
    """Test data of a given size made on the fly (`blobsync bench`): a random pattern read at an offset salted per
    file, so no two files and no two blocks of a file are alike, at the cost of a memory copy (no disk, no RNG)."""

    PATTERN = 4 * 1024 * 1024 + 7  # a length no block size divides: blocks never repeat within a file

    def __init__(self, name: str, size: int, salt: int, pattern: memoryview) -> None:
        self.path = PurePosixPath(name)
        self.opened = FileIdentity(size, time.time_ns(), 0)
        self._salt = salt
        self._pattern = pattern  # one job's, shared by its files (pattern())

    @classmethod
    def pattern(cls) -> memoryview:
        """Random bytes, twice over: a read that crosses the end is still one slice."""
        once = os.urandom(cls.PATTERN)
        return memoryview(once + once)

    def identity(self) -> FileIdentity:
        return self.opened

    def read_into(self, buf: memoryview, offset: int) -> None:
        half = len(self._pattern) // 2
        done = 0
        while done < len(buf):
            start = (self._salt + offset + done) % half
            n = min(len(buf) - done, half)
            buf[done:done + n] = self._pattern[start:start + n]
            done += n

    def read_all(self, size: int) -> bytes:
        return bytes(_whole(self.read_into, size))

    def read_all_cached(self, size: int) -> bytearray | None:
        return _whole(self.read_into, size)


def _whole(read_into: Callable[[memoryview, int], None], size: int) -> bytearray:
    buf = bytearray(size)
    read_into(memoryview(buf), 0)
    return buf
