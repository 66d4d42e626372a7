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
from conftest import ContainerHandle, container_sas
from support.azurite import Azurite


class BlobsyncFixtures(AbstractFixtures):  # type: ignore[misc]
    @pytest.fixture(params=["key", "container-sas"])
    def fs(self, request: pytest.FixtureRequest, azurite: Azurite, container: ContainerHandle,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[BlobsyncFileSystem]:
        """The suite runs with the emulator's key and with the SAS of one container (what a platform hands a
        job): folders, writes and reads must all work without any right over the account."""
        journal = tmp_path_factory.mktemp("fsspec") / "j.db"
        sas = container_sas(azurite.account, azurite.key, container.name) if request.param != "key" else None
        fs = BlobsyncFileSystem(azurite.blob_endpoint, credential=sas, config=TransferConfig(journal_path=journal),
                                env={} if sas else None, skip_instance_cache=True)
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


def test_a_partitioned_dataset_is_written_under_a_container_sas(
        azurite: Azurite, container: ContainerHandle, tmp_path: Path) -> None:
    """pyarrow's write_dataset (as Dask's to_parquet and pandas' partition_cols) makes a folder per partition
    before writing: with a container SAS, which may not create containers, that must work."""
    pa = pytest.importorskip("pyarrow")
    ds = pytest.importorskip("pyarrow.dataset")
    pq = pytest.importorskip("pyarrow.parquet")
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    sas = container_sas(azurite.account, azurite.key, container.name)
    fs = BlobsyncFileSystem(azurite.blob_endpoint, credential=sas, env={},
                            config=TransferConfig(journal_path=tmp_path / "j.db"), skip_instance_cache=True)
    try:
        table = pa.table({"split": ["train", "val"] * 500, "x": list(range(1000))})
        ds.write_dataset(table, f"{container.name}/data", format="parquet", partitioning=["split"],
                         filesystem=PyFileSystem(FSSpecHandler(fs)))
    finally:
        fs.client.close()
    names = container.blob_names()
    assert {n.rsplit("/", 1)[0] for n in names} == {"data/train", "data/val"}, names
    import io

    back = pa.concat_tables([pq.read_table(io.BytesIO(container.download(n))) for n in names])
    assert sorted(back.column("x").to_pylist()) == list(range(1000))
