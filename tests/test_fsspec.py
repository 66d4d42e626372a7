"""blobsync's fsspec filesystem against Azurite: fsspec's own abstract test suite (copy, get, put, open, pipe), the
entry point, and pandas-style use (issue 27, part 5)."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import pytest
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)

from blobsync import TransferConfig
from blobsync.fsspec import BlobsyncFileSystem
from conftest import ContainerHandle
from support.azurite import Azurite


class BlobsyncFixtures(AbstractFixtures):  # type: ignore[misc]
    @pytest.fixture
    def fs(self, azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BlobsyncFileSystem]:
        journal = tmp_path_factory.mktemp("fsspec") / "j.db"
        fs = BlobsyncFileSystem(azurite.blob_endpoint, config=TransferConfig(journal_path=journal),
                                skip_instance_cache=True)
        try:
            yield fs
        finally:
            fs.client.close()

    @pytest.fixture
    def fs_path(self, container: ContainerHandle) -> str:
        return f"{container.name}/root"

    @pytest.fixture
    def fs_join(self) -> Callable[..., str]:
        return posixpath.join

    @pytest.fixture
    def supports_empty_directories(self) -> bool:
        return False  # Blob Storage's folders are name prefixes


class TestBlobsyncCopy(AbstractCopyTests, BlobsyncFixtures):  # type: ignore[misc]
    pass


class TestBlobsyncGet(AbstractGetTests, BlobsyncFixtures):  # type: ignore[misc]
    pass


class TestBlobsyncPut(AbstractPutTests, BlobsyncFixtures):  # type: ignore[misc]
    pass


class TestBlobsyncOpen(AbstractOpenTests, BlobsyncFixtures):  # type: ignore[misc]
    pass


class TestBlobsyncPipe(AbstractPipeTests, BlobsyncFixtures):  # type: ignore[misc]
    pass


def test_the_entry_point_registers_the_protocol(azurite: Azurite, container: ContainerHandle, tmp_path: Path) -> None:
    assert fsspec.get_filesystem_class("blobsync") is BlobsyncFileSystem
    fs = fsspec.filesystem("blobsync", account_url=azurite.blob_endpoint,
                           config=TransferConfig(journal_path=tmp_path / "j.db"))
    try:
        with fsspec.open(f"blobsync://{container.name}/a/b.csv", "wb", account_url=azurite.blob_endpoint,
                         config=TransferConfig(journal_path=tmp_path / "j.db")) as f:
            f.write(b"x,y\n1,2\n")
        assert container.download("a/b.csv") == b"x,y\n1,2\n"
        assert fs.cat(f"{container.name}/a/b.csv") == b"x,y\n1,2\n"
        assert fs.ls(container.name, detail=False) == [f"{container.name}/a"]
        assert fs.info(f"{container.name}/a/b.csv")["size"] == 8
    finally:
        fs.client.close()


def test_pyarrow_reads_and_writes_parquet_through_the_filesystem(
        azurite: Azurite, container: ContainerHandle, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    fs = BlobsyncFileSystem(azurite.blob_endpoint, config=TransferConfig(journal_path=tmp_path / "j.db"),
                            skip_instance_cache=True)
    try:
        table = pa.table({"epoch": list(range(50_000)), "loss": [1.0 / (i + 1) for i in range(50_000)]})
        pq.write_table(table, f"{container.name}/metrics/run7.parquet", filesystem=fs)
        assert pq.read_table(f"{container.name}/metrics/run7.parquet", filesystem=fs).equals(table)
        import io

        assert pq.read_table(io.BytesIO(container.download("metrics/run7.parquet"))).equals(table)
    finally:
        fs.client.close()
