"""What this OS offers for local I/O, detected in one place: positional reads and writes, reads that refuse to
wait, direct writes, read-ahead advice, the socket send-queue probe, a boot identifier and a full fsync.

BLOBSYNC_PORTABLE_IO=1 turns every Linux-only path off, so the portable ones (what Windows and macOS use) run
and are tested on Linux too."""

from __future__ import annotations

import errno
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Features:
    positional: bool  # os.pread / os.pwrite / os.preadv (not on Windows)
    nowait: int | None  # RWF_NOWAIT: a read that fails rather than wait for the disk (Linux)
    direct: bool  # O_DIRECT writes (Linux)
    fadvise: bool  # posix_fadvise read-ahead (Linux, BSDs)
    send_queue: bool  # TIOCOUTQ: bytes a socket still holds (Linux)
    full_fsync: bool  # F_FULLFSYNC: an fsync that reaches the platter (macOS)


def _portable_forced(env: Mapping[str, str]) -> bool:
    return env.get("BLOBSYNC_PORTABLE_IO", "").strip().lower() in ("1", "true", "yes")


@functools.cache
def _detect(portable: bool, platform: str) -> Features:
    linux = platform.startswith("linux") and not portable
    full_fsync = False
    if platform == "darwin":
        import fcntl

        full_fsync = hasattr(fcntl, "F_FULLFSYNC")
    return Features(
        positional=hasattr(os, "pread") and hasattr(os, "preadv") and not portable,
        nowait=getattr(os, "RWF_NOWAIT", None) if linux else None,
        direct=hasattr(os, "O_DIRECT") and linux,
        fadvise=hasattr(os, "posix_fadvise") and not portable,
        send_queue=linux,
        full_fsync=full_fsync,
    )


def features(env: Mapping[str, str] | None = None, platform: str | None = None) -> Features:
    """The I/O paths to use here (cheap: detected once per setting)."""
    return _detect(_portable_forced(os.environ if env is None else env), platform or sys.platform)


class PositionalFile:
    """A file many threads read or write at their own offsets. With pread/pwrite that is one descriptor; without
    them (Windows, or BLOBSYNC_PORTABLE_IO=1) each thread seeks a descriptor of its own, opened on first use."""

    def __init__(self, fd: int, path: str, flags: int, portable: bool, identity: tuple[int, int] | None = None
                 ) -> None:
        self.fd = fd
        self._path = path
        self._flags = flags & ~(os.O_CREAT | os.O_TRUNC | getattr(os, "O_EXCL", 0))
        self._portable = portable
        self._identity = identity  # (st_dev, st_ino): a descriptor opened by name must be of this same file
        self._extra: list[int] = []
        if portable:  # per-thread descriptors; with pread/pwrite (one per file opened) none are needed
            self._local = threading.local()
            self._lock = threading.Lock()

    def _own(self) -> int:
        fd: int | None = getattr(self._local, "fd", None)
        if fd is None:
            fd = os.open(self._path, self._flags)
            st = os.fstat(fd)
            if self._identity is not None and (st.st_dev, st.st_ino) != self._identity:
                os.close(fd)
                raise OSError(errno.ESTALE, "the file was replaced by another under its name")
            with self._lock:
                self._extra.append(fd)
            self._local.fd = fd
        return fd

    def read_into(self, buf: memoryview, offset: int) -> int:
        if not self._portable:
            return os.preadv(self.fd, [buf], offset)
        fd = self._own()
        os.lseek(fd, offset, os.SEEK_SET)
        with open(fd, "rb", buffering=0, closefd=False) as f:
            return f.readinto(buf) or 0

    def read(self, length: int, offset: int) -> bytes:
        if not self._portable:
            return os.pread(self.fd, length, offset)
        buf = bytearray(length)
        done = 0
        while done < length:
            n = self.read_into(memoryview(buf)[done:], offset + done)
            if n == 0:
                break
            done += n
        del buf[done:]
        return bytes(buf)

    def write(self, view: memoryview, offset: int) -> int:
        if not self._portable:
            return os.pwrite(self.fd, view, offset)
        fd = self._own()
        os.lseek(fd, offset, os.SEEK_SET)
        return os.write(fd, view)

    def close_extra(self) -> None:
        """Close the per-thread descriptors (the caller closes `fd`)."""
        if not self._portable:
            return
        with self._lock:
            extra, self._extra = self._extra, []
        for fd in extra:
            os.close(fd)
        self._local = threading.local()


def open_positional(path: str, flags: int, mode: int = 0o777, env: Mapping[str, str] | None = None
                    ) -> PositionalFile:
    """Open `path` for positional I/O by whichever means this OS offers (OSError as os.open raises it)."""
    fd = os.open(extended_path(path), flags | getattr(os, "O_BINARY", 0), mode)
    return PositionalFile(fd, extended_path(path), flags | getattr(os, "O_BINARY", 0),
                          not features(env).positional)


def lock_file(fd: int, *, shared: bool = False) -> bool:
    """Take an advisory lock on the whole file without waiting (flock; on Windows a lock on a byte far past any
    data, so reads and writes of the file itself are never blocked). False: another process holds it."""
    try:
        import fcntl
    except ImportError:
        import msvcrt

        try:
            os.lseek(fd, 1 << 62, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
            return True
        except OSError:
            return False
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):  # a file system without locks (some NFS)
            return True
        raise


def extended_path(path: str, platform: str | None = None) -> str:
    """On Windows, an absolute path of 260 characters or more takes the `\\\\?\\` prefix, without which the
    Win32 calls refuse it (MAX_PATH). Elsewhere, and for shorter paths, `path` itself."""
    if (platform or sys.platform) != "win32" or len(path) < 260 or path.startswith("\\\\?\\"):
        return path
    absolute = os.path.abspath(path) if (platform or sys.platform) == sys.platform else path
    if absolute.startswith("\\\\"):  # a UNC share: \\server\share\... -> \\?\UNC\server\share\...
        return "\\\\?\\UNC\\" + absolute[2:]
    return "\\\\?\\" + absolute


def full_sync(fd: int, env: Mapping[str, str] | None = None) -> None:
    """fsync that survives a power cut: on macOS fsync leaves data in the drive's cache, F_FULLFSYNC does not."""
    if features(env).full_fsync:
        import fcntl

        try:
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)  # type: ignore[attr-defined]
            return
        except OSError:
            pass  # some file systems (network, FAT) refuse it: a plain fsync is the best they offer
    os.fsync(fd)


def data_sync(fd: int) -> None:
    """fdatasync where the OS has it (Linux), else fsync (macOS, Windows)."""
    getattr(os, "fdatasync", os.fsync)(fd)


@dataclass(frozen=True)
class BootSources:
    """Where each platform says when it booted (injected by tests)."""

    read_text: Callable[[str], str]
    sysctl_boottime: Callable[[], float | None]
    tick_count_ms: Callable[[], int | None]
    now: Callable[[], float]


def _read_text(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def _sysctl_boottime() -> float | None:
    """macOS: kern.boottime, a struct timeval, through libc's sysctlbyname."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return None

    class TimeVal(ctypes.Structure):
        _fields_ = (("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_int32))

    libc = ctypes.CDLL(name, use_errno=True)
    value = TimeVal()
    size = ctypes.c_size_t(ctypes.sizeof(value))
    if libc.sysctlbyname(b"kern.boottime", ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)):
        return None
    return float(value.tv_sec + value.tv_usec / 1e6)


def _tick_count_ms() -> int | None:
    """Windows: milliseconds since boot (GetTickCount64)."""
    import ctypes

    windll = getattr(ctypes, "windll", None)
    if windll is None:
        return None
    get = windll.kernel32.GetTickCount64
    get.restype = ctypes.c_uint64
    return int(get())


SYSTEM_BOOT = BootSources(_read_text, _sysctl_boottime, _tick_count_ms, time.time)


def boot_identifier(platform: str | None = None, sources: BootSources = SYSTEM_BOOT) -> str | None:
    """Something that changes when the machine reboots: Linux's boot_id, else the boot time (macOS's own; on
    Windows computed from the uptime). None where the OS does not say; callers then trust only what was fsynced."""
    platform = platform or sys.platform
    try:
        if platform.startswith("linux"):
            return sources.read_text("/proc/sys/kernel/random/boot_id").strip() or None
        if platform == "darwin":
            booted = sources.sysctl_boottime()
            return f"boot-{booted:.6f}" if booted is not None else None
        if platform == "win32":
            ticks = sources.tick_count_ms()
            if ticks is None:
                return None
            # To the second: a clock adjustment may change it (then unsynced ranges are fetched again, the safe
            # side); two boots cannot share a second, a job having run in between.
            return f"boot-{int(sources.now() - ticks / 1000)}"
    except (OSError, ValueError, AttributeError):
        return None
    return None


# glibc's malloc gives freed memory back to the OS as soon as 128 KiB-256 KiB lie free at the heap's top, and serves
# each large request with a fresh mmap: a download's bodies arrive as ~256 KiB objects (one per recv, one per parsed
# piece), so nearly every one landed in pages faulted in again. Measured, 1 GiB down from the null server: 195,000
# minor faults and 1.1 s of system CPU, against 74,000 and 0.7 s with these settings.
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
MALLOC_TUNING = ((_M_MMAP_THRESHOLD, 16 << 20), (_M_TRIM_THRESHOLD, 64 << 20), (_M_TOP_PAD, 16 << 20))


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a taskset or a cgroup's cpuset narrows it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def tune_malloc() -> bool:
    """Keep freed heap memory (up to 64 MiB) for reuse instead of returning it and faulting it in again; a process
    of blobsync's own only (the command, its worker processes): the library leaves its host's allocator alone.
    False where the C library is not glibc's."""
    if not sys.platform.startswith("linux") or _portable_forced(os.environ):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    return all(mallopt(param, value) == 1 for param, value in MALLOC_TUNING)
