"""Small source files are read on the event loop only when the page cache holds them (RWF_NOWAIT)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from blobsync.local.files import OpenFile


def test_a_cached_small_file_is_read_without_a_thread(tmp_path: Path) -> None:
    path = tmp_path / "small.bin"
    data = os.urandom(16 * 1024)
    path.write_bytes(data)  # just written: in the page cache
    with OpenFile(path) as src:
        got = src.read_all_cached(len(data))
    if not hasattr(os, "RWF_NOWAIT"):
        assert got is None
        return
    assert got is not None
    assert bytes(got[0]) == data and got[1] == hashlib.md5(data).digest()


def test_a_small_file_not_in_the_page_cache_is_left_to_a_worker_thread(tmp_path: Path) -> None:
    if not hasattr(os, "RWF_NOWAIT"):
        pytest.skip("no RWF_NOWAIT here")
    path = tmp_path / "cold.bin"
    data = os.urandom(16 * 1024)
    path.write_bytes(data)
    with OpenFile(path) as src:
        os.fsync(src.fd)  # dirty pages cannot be dropped
        os.posix_fadvise(src.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if src.read_all_cached(len(data)) is not None:
            pytest.skip("this file system served the read without waiting anyway")
        assert src.read_all(len(data)) == (data, hashlib.md5(data).digest())


def test_a_size_change_is_left_to_the_blocking_read_which_reports_it(tmp_path: Path) -> None:
    path = tmp_path / "grew.bin"
    path.write_bytes(b"x" * 100)
    with OpenFile(path) as src:
        assert src.read_all_cached(50) is None
