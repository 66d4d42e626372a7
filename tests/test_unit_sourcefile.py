"""Small source files are read on the event loop only when the page cache holds them (RWF_NOWAIT)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from blobsync.local.files import INLINE_READ_MAX, OpenFile, looks_cold, warm_if_cold


def _evict(path: Path) -> None:
    """Drop a file from the page cache (dirty pages cannot be dropped, hence the fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


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
    assert bytes(got) == data


def test_a_small_file_not_in_the_page_cache_is_left_to_a_worker_thread(tmp_path: Path) -> None:
    if not hasattr(os, "RWF_NOWAIT"):
        pytest.skip("no RWF_NOWAIT here")
    path = tmp_path / "cold.bin"
    data = os.urandom(16 * 1024)
    path.write_bytes(data)
    _evict(path)
    with OpenFile(path) as src:
        if src.read_all_cached(len(data)) is not None:
            pytest.skip("this file system served the read without waiting anyway")
        assert src.read_all(len(data)) == data


def test_a_size_change_is_left_to_the_blocking_read_which_reports_it(tmp_path: Path) -> None:
    path = tmp_path / "grew.bin"
    path.write_bytes(b"x" * 100)
    with OpenFile(path) as src:
        assert src.read_all_cached(50) is None


def test_a_cold_batch_of_small_files_is_read_ahead_and_a_warm_one_is_left_alone(tmp_path: Path) -> None:
    if not hasattr(os, "RWF_NOWAIT"):
        pytest.skip("no RWF_NOWAIT here")
    paths = [tmp_path / f"f{i}.bin" for i in range(20)]
    for path in paths:
        path.write_bytes(os.urandom(16 * 1024))
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(INLINE_READ_MAX + 1))
    batch = [(p, p.stat().st_size) for p in [*paths, big]]
    submitted: list[Callable[[], None]] = []

    assert not warm_if_cold(batch, submitted.append)  # just written: in the page cache
    assert submitted == []

    for path in [*paths, big]:
        _evict(path)
    # Probed on a file warm_if_cold does not sample: a probe that misses starts the kernel's readahead of that
    # file, which made paths[0] (a sampled one) warm again by the time warm_if_cold looked (seen under CPU load).
    if not looks_cold(paths[3]):
        pytest.skip("this file system serves reads without waiting anyway")
    assert warm_if_cold(batch, submitted.append)
    assert len(submitted) == 1
    submitted[0]()  # what the worker thread runs: readahead for every small file (not the big one)
    deadline = time.monotonic() + 5
    while any(looks_cold(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(looks_cold(p) for p in paths)
    assert looks_cold(big)  # larger files are read in worker threads anyway: no readahead asked for them
