"""The portable I/O paths (what Windows and macOS run), forced on Linux with BLOBSYNC_PORTABLE_IO=1; the Windows
name and path rules, the boot identifier per platform, and the journal's home, with the platform injected."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import termios
import threading
import unicodedata
from pathlib import Path

import pytest

import blobsync
from blobsync import stopping
from blobsync.errors import UnsafeNameError
from blobsync.jobs.compare import CompareMode
from blobsync.journal.store import default_journal_path
from blobsync.local import files
from blobsync.local.platform import BootSources, boot_identifier, extended_path, features, open_positional
from blobsync.local.target import safe_join
from conftest import ContainerHandle
from support.azurite import connection_string
from support.cli import random_file

MiB = 1024 * 1024


def _env(container: ContainerHandle) -> dict[str, str]:
    return {"AZURE_STORAGE_CONNECTION_STRING": connection_string(container.url.rsplit("/", 1)[0])}


@pytest.fixture
def linux_paths_forbidden(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """BLOBSYNC_PORTABLE_IO=1, with every Linux-only call made to fail loudly if anything still makes it."""
    monkeypatch.setenv("BLOBSYNC_PORTABLE_IO", "1")
    calls: list[str] = []

    def forbidden(name: str):  # type: ignore[no-untyped-def]
        def call(*args: object, **kwargs: object) -> None:
            calls.append(name)
            raise AssertionError(f"os.{name} called with BLOBSYNC_PORTABLE_IO=1")
        return call

    for name in ("pread", "pwrite", "preadv", "posix_fadvise"):
        monkeypatch.setattr(os, name, forbidden(name), raising=False)
    real_open, real_ioctl = os.open, fcntl.ioctl

    def checked_open(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            calls.append("O_DIRECT")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    def checked_ioctl(fd: object, request: int, *args: object) -> object:
        if request == termios.TIOCOUTQ:
            calls.append("TIOCOUTQ")
        return real_ioctl(fd, request, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", checked_open)
    monkeypatch.setattr(fcntl, "ioctl", checked_ioctl)
    return calls


def test_portable_mode_uses_no_linux_only_call_and_moves_the_bytes(
        linux_paths_forbidden: list[str], container: ContainerHandle, tmp_path: Path) -> None:
    assert not features().positional and features().nowait is None and not features().direct
    src = tmp_path / "src"
    data = {"big.bin": random_file(src / "big.bin", 20 * MiB + 3, seed=1),
            "small.bin": random_file(src / "small.bin", 5000, seed=2),
            "sub/tiny.txt": random_file(src / "sub" / "tiny.txt", 10, seed=3)}
    config = blobsync.TransferConfig.from_mib(block_size_mb=1, recursive=True, journal_path=tmp_path / "j.db")
    env = _env(container)
    up = blobsync.copy(src, container.url, config, env=env, as_subdir=False, raise_on_error=True)
    assert up.files_transferred == 3
    for rel, content in data.items():
        assert container.download(rel) == content
    down = blobsync.copy(container.url, str(tmp_path / "dl"), config, env=env, as_subdir=False,
                         raise_on_error=True)
    assert down.files_transferred == 3
    for rel, content in data.items():
        assert (tmp_path / "dl" / rel).read_bytes() == content
    # A sync both ways, then one with nothing to do.
    (src / "small.bin").write_bytes(b"changed")
    synced = blobsync.sync(src, container.url, config, env=env, compare=CompareMode.SIZE_ONLY,
                           raise_on_error=True)
    assert synced.files_transferred == 1 and container.download("small.bin") == b"changed"
    assert linux_paths_forbidden == []


def test_positional_file_without_pread_serves_threads_at_their_own_offsets(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BLOBSYNC_PORTABLE_IO", "1")
    path = tmp_path / "f.bin"
    f = open_positional(str(path), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(f.fd, 64 * 4096)

        def writer(i: int) -> None:
            for _ in range(20):
                assert f.write(memoryview(bytes([i]) * 4096), i * 4096) == 4096
                assert f.read(4096, i * 4096) == bytes([i]) * 4096

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert path.read_bytes() == b"".join(bytes([i]) * 4096 for i in range(64))
    finally:
        f.close_extra()
        os.close(f.fd)


def test_boot_identifier_per_platform() -> None:
    sources = BootSources(read_text=lambda path: "3f1c-boot\n" if path.endswith("boot_id") else "",
                          sysctl_boottime=lambda: 1_700_000_000.25, tick_count_ms=lambda: 3_600_000,
                          now=lambda: 1_700_003_600.7)
    assert boot_identifier("linux", sources) == "3f1c-boot"
    assert boot_identifier("darwin", sources) == "boot-1700000000.250000"
    assert boot_identifier("win32", sources) == "boot-1700000000"
    later = BootSources(sources.read_text, sources.sysctl_boottime, lambda: 3_660_000, lambda: 1_700_003_660.9)
    assert boot_identifier("win32", later) == "boot-1700000000"  # the same boot, a minute later
    rebooted = BootSources(sources.read_text, sources.sysctl_boottime, lambda: 5_000, lambda: 1_700_003_660.9)
    assert boot_identifier("win32", rebooted) != "boot-1700000000"

    def unreadable(path: str) -> str:
        raise OSError("no /proc")

    assert boot_identifier("linux", BootSources(unreadable, lambda: None, lambda: None, lambda: 0.0)) is None
    assert boot_identifier("darwin", BootSources(unreadable, lambda: None, lambda: None, lambda: 0.0)) is None
    assert boot_identifier("sunos5", sources) is None


def test_windows_name_rules_fail_the_blob_not_the_job(tmp_path: Path) -> None:
    for rel in ("a<b.txt", "dir/c:d.txt", 'q"uote.txt', "pipe|.txt", "what?.txt", "star*.pt", "dots.",
                "space ", "sub./x.txt", "CON", "con.txt", "NUL.tar.gz", "dir/COM1", "lpt9.log", "ctl\x01.txt"):
        with pytest.raises(UnsafeNameError) as caught:
            safe_join(tmp_path, rel, windows=True)
        assert "Windows" in str(caught.value), rel
    for rel in ("a<b.txt", "what?.txt", "dots.", "CON"):  # names Linux and macOS hold
        assert safe_join(tmp_path, rel, windows=False) == tmp_path / rel
    for rel in ("CONSOLE.txt", "com10.txt", "a.b.c", "nul-not.txt", "données/été.pt"):
        assert safe_join(tmp_path, rel, windows=True) == tmp_path.joinpath(*rel.split("/"))


def test_long_windows_paths_take_the_extended_prefix() -> None:
    long = "C:\\data\\" + "d" * 300 + "\\f.bin"
    assert extended_path(long, "win32") == "\\\\?\\" + long
    assert extended_path("\\\\server\\share\\" + "d" * 300, "win32") == "\\\\?\\UNC\\server\\share\\" + "d" * 300
    assert extended_path("C:\\short\\f.bin", "win32") == "C:\\short\\f.bin"
    assert extended_path("\\\\?\\" + long, "win32") == "\\\\?\\" + long
    assert extended_path("/" + "d" * 300, "linux") == "/" + "d" * 300


def test_journal_lives_in_localappdata_on_windows() -> None:
    assert default_journal_path({"LOCALAPPDATA": "C:\\Users\\me\\AppData\\Local"}, "win32") == \
        Path("C:\\Users\\me\\AppData\\Local") / "blobsync" / "journal.db"
    assert default_journal_path({"HOME": "/home/me"}, "linux") == Path("/home/me/.local/state/blobsync/journal.db")
    assert default_journal_path({"XDG_STATE_HOME": "/s", "LOCALAPPDATA": "x"}, "win32") == \
        Path("/s/blobsync/journal.db")


def test_a_stop_signal_without_loop_signal_handlers_still_stops_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows' event loops have no add_signal_handler: the plain handler hands the signal to the loop."""

    def unsupported(self: object, *args: object) -> None:
        raise NotImplementedError

    monkeypatch.setattr(asyncio.unix_events._UnixSelectorEventLoop, "add_signal_handler", unsupported)
    monkeypatch.setattr(stopping, "_stop_signals", (signal.SIGTERM,))
    before = signal.getsignal(signal.SIGTERM)

    async def job() -> None:
        asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGTERM)
        await asyncio.sleep(30)

    with pytest.raises(KeyboardInterrupt):
        stopping.run(job())
    assert signal.getsignal(signal.SIGTERM) == before  # put back


def test_macos_names_are_compared_and_stored_as_nfc(monkeypatch: pytest.MonkeyPatch, container: ContainerHandle,
                                                     tmp_path: Path) -> None:
    """HFS+ hands out 'été.pt' decomposed (NFD); the blob gets the composed name, and a second sync finds it."""
    monkeypatch.setattr(files, "NFC_NAMES", True)
    nfd = unicodedata.normalize("NFD", "été.pt")
    data = random_file(tmp_path / "src" / nfd, 1000, seed=4)
    config = blobsync.TransferConfig(journal_path=tmp_path / "j.db")
    env = _env(container)
    first = blobsync.sync(tmp_path / "src", container.url, config, env=env, raise_on_error=True)
    assert first.files_transferred == 1
    assert container.blob_names() == [unicodedata.normalize("NFC", "été.pt")]
    assert container.download(unicodedata.normalize("NFC", "été.pt")) == data
    again = blobsync.sync(tmp_path / "src", container.url, config, env=env, raise_on_error=True)
    assert again.files_transferred == 0 and again.files_in_sync == 1
    down = blobsync.sync(container.url, tmp_path / "src", config, env=env, raise_on_error=True)
    assert down.files_transferred == 0  # the NFD file on disk is the NFC blob


def test_a_target_open_in_another_program_is_a_per_file_failure_naming_it(tmp_path: Path) -> None:
    from blobsync.errors import DiskFullError, LocalWriteError
    from blobsync.local.target import _write_error

    busy = PermissionError(13, "Permission denied")
    busy.winerror = 32  # type: ignore[attr-defined]  # what Windows sets for ERROR_SHARING_VIOLATION
    error = _write_error(tmp_path / "model.pt", busy)
    assert type(error) is LocalWriteError and "open in another program" in str(error)
    assert not isinstance(_write_error(tmp_path / "x", PermissionError(13, "Permission denied")), DiskFullError)
