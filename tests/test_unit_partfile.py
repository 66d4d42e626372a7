"""PartFile writes: whole aligned blocks with O_DIRECT where the file system takes it, the rest buffered."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from blobsync.engine.budget import new_buffer
from blobsync.local import target as target_mod
from blobsync.local.target import PartFile, direct_io_wanted

MiB = 1024 * 1024


def _direct_io_works_here(folder: Path) -> bool:
    """Whether this file system takes an aligned O_DIRECT write (some refuse at open, some only at write)."""
    probe = folder / "probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except (OSError, AttributeError):
        return False
    try:
        os.pwrite(fd, memoryview(new_buffer(MiB)), 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink()


def _filled(size: int, seed: int) -> memoryview:
    buf = new_buffer(size)
    view = memoryview(buf)
    view[:] = (bytes((seed + i) % 256 for i in range(251)) * (size // 251 + 1))[:size]
    return view


def test_aligned_blocks_go_direct_and_the_file_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    direct_here = _direct_io_works_here(tmp_path)
    target = tmp_path / "out.bin"
    size = 3 * MiB + 123  # two whole blocks, then a last block with a tail that is not a multiple of 4096
    part = PartFile(target, size, keep=False)
    writes: list[tuple[int, int]] = []  # (descriptor, bytes) of every pwrite
    real_pwrite = os.pwrite

    def recording_pwrite(fd: int, data: memoryview, offset: int) -> int:
        writes.append((fd, len(data)))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(target_mod.os, "pwrite", recording_pwrite)
    first, second, last = _filled(MiB, 1), _filled(MiB, 2), _filled(MiB + 123, 3)
    part.write_view(second, MiB)  # out of order, as ranges finish
    part.write_view(first, 0)
    part.write_view(last, 2 * MiB)
    if direct_here:
        direct = sum(n for fd, n in writes if fd == part._direct_fd)
        assert direct == 3 * MiB, "every whole 4 KiB run should have been written with O_DIRECT"
        assert [n for fd, n in writes if fd == part.fd] == [123]  # only the tail goes through the page cache
    monkeypatch.undo()
    part.finish(None)
    assert target.read_bytes() == bytes(first) + bytes(second) + bytes(last)
    assert not target.with_name("out.bin.blobsync-part").exists()


def test_unaligned_buffers_and_offsets_are_written_buffered(tmp_path: Path) -> None:
    target = tmp_path / "odd.bin"
    part = PartFile(target, 10_000 + 5_000, keep=False)
    small = bytearray(os.urandom(10_000))  # a bytearray from malloc: not page-aligned
    odd = memoryview(bytearray(os.urandom(5_000)))
    part.write_view(memoryview(small), 0)
    part.write_view(odd, 10_000)  # an offset that is not a multiple of 4096
    part.finish(None)
    assert target.read_bytes() == bytes(small) + bytes(odd)


def test_a_file_system_that_refuses_direct_io_gets_buffered_writes(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open
    refused: list[int] = []

    def no_direct(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if flags & os.O_DIRECT:
            refused.append(flags)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(target_mod.os, "open", no_direct)
    target = tmp_path / "fallback.bin"
    part = PartFile(target, 2 * MiB, keep=False)
    a, b = _filled(MiB, 7), _filled(MiB, 9)
    part.write_view(a, 0)
    part.write_view(b, MiB)
    assert len(refused) == 1 and not part._direct  # asked once, then never again for this file
    part.finish(None)
    assert target.read_bytes() == bytes(a) + bytes(b)


def test_direct_io_can_be_turned_off() -> None:
    assert not direct_io_wanted({"BLOBSYNC_DIRECT_IO": "0"})
    assert not direct_io_wanted({"BLOBSYNC_DIRECT_IO": "false"})
    assert direct_io_wanted({}) == hasattr(os, "O_DIRECT")
