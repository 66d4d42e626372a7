"""Whole-file MD5s on every core (issue 41): one file's updates stay on one lane, in order; files hashing at once
take different lanes; the lane count follows the cores (BLOBSYNC_HASH_THREADS overrides). Many files up and down
at once land with the right MD5s (checked with the SDK)."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import blobsync
from blobsync import TransferConfig
from blobsync.config import MiB
from blobsync.engine.digest import HashLanes, hash_threads
from conftest import ContainerHandle


def test_files_hashing_at_once_take_different_lanes_and_each_stays_on_one() -> None:
    lanes = HashLanes(3)
    try:
        first, second, third = lanes.take(), lanes.take(), lanes.take()
        assert sorted((first, second, third)) == [0, 1, 2]
        lanes.give_back(second)
        assert lanes.take() == second  # the least used
        threads: dict[str, set[int]] = {"a": set(), "b": set()}
        data = {name: [os.urandom(100_000) for _ in range(50)] for name in threads}
        digests = {name: hashlib.md5() for name in threads}
        with lanes.lane() as pool_a, lanes.lane() as pool_b:
            assert pool_a is not pool_b
            futures = []
            for i in range(50):  # interleaved, as two files' blocks arrive
                for name, pool in (("a", pool_a), ("b", pool_b)):
                    def update(name: str = name, i: int = i) -> None:
                        threads[name].add(threading.get_ident())
                        digests[name].update(data[name][i])
                    futures.append(pool.submit(update))
            for future in futures:
                future.result()
        assert all(len(ids) == 1 for ids in threads.values()) and threads["a"] != threads["b"]
        for name in threads:
            assert digests[name].digest() == hashlib.md5(b"".join(data[name])).digest()
    finally:
        lanes.shutdown()


def test_the_lane_count_follows_the_cores_unless_told() -> None:
    cores = len(os.sched_getaffinity(0))
    assert hash_threads({}) == cores
    assert hash_threads({"BLOBSYNC_HASH_THREADS": "1"}) == 1
    assert hash_threads({"BLOBSYNC_HASH_THREADS": "nonsense"}) == cores


def test_many_files_up_and_down_at_once_keep_their_md5s(container: ContainerHandle, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    files = {f"f{i}.bin": os.urandom(3 * MiB + i) for i in range(6)}
    for name, data in files.items():
        (src / name).write_bytes(data)
    config = TransferConfig.from_mib(block_size_mb=1, put_blob_size_mb=0, journal_path=tmp_path / "j.db")
    env = {"BLOBSYNC_HASH_THREADS": "3"}
    assert blobsync.copy(src, f"{container.url}/up", TransferConfig(**{**config.__dict__, "recursive": True}),
                         env=env).ok
    for name, data in files.items():
        props = container.client.get_blob_client(f"up/src/{name}").get_blob_properties()
        assert props.content_settings.content_md5 == hashlib.md5(data).digest()
        assert container.download(f"up/src/{name}") == data
    down = tmp_path / "down"
    report = blobsync.copy(f"{container.url}/up", down, TransferConfig(**{**config.__dict__, "recursive": True}),
                           env=env)
    assert report.ok and report.files_transferred == 6
    for result in report.written:
        assert result.content_md5 == hashlib.md5(files[Path(result.rel).name]).digest()
    for name, data in files.items():
        assert (down / "up" / "src" / name).read_bytes() == data
