"""blobsync's fsspec filesystem against Azurite: fsspec's own abstract test suite (copy, get, put, open, pipe), the
entry point, and pandas-style use (issue 27, part 5)."""

from __future__ import annotations

import concurrent.futures
import os
import posixpath
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import pytest
from azure.storage.blob import ContentSettings
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)

import blobsync
from blobsync import TransferConfig
from blobsync.fsspec import BlobsyncFileSystem
from conftest import ContainerHandle, container_sas
from support.azurite import Azurite
from support.proxy import FaultProxy, Rule, hold


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


def _fs(azurite: Azurite, tmp_path: Path, endpoint: str | None = None) -> BlobsyncFileSystem:
    return BlobsyncFileSystem(endpoint or azurite.blob_endpoint, config=TransferConfig(journal_path=tmp_path / "j.db"),
                              env={"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"},
                              skip_instance_cache=True)


def test_files_opened_for_reading_are_fsspec_files(azurite: Azurite, container: ContainerHandle,
                                                   tmp_path: Path) -> None:
    container.client.upload_blob("d/a.bin", b"0123456789" * 1000)
    fs = _fs(azurite, tmp_path)
    try:
        with fs.open(f"{container.name}/d/a.bin", "rb") as f:
            assert (f.size, f.path, f.fs) == (10_000, f"{container.name}/d/a.bin", fs)
            assert f.info()["size"] == 10_000 and f.info()["type"] == "file"
            f.seek(9_995)
            assert f.read() == b"56789"
        with fs.open(f"{container.name}/d/b.bin", "wb") as w:
            assert (w.path, w.fs) == (f"{container.name}/d/b.bin", fs)
            w.write(b"written")
        with pytest.raises(blobsync.errors.UsageError, match="cannot be appended to in place"):
            fs.open(f"{container.name}/d/a.bin", "ab")
    finally:
        fs.client.close()
    assert container.download("d/b.bin") == b"written"


def test_cp_file_is_a_copy_the_service_makes(azurite: Azurite, container: ContainerHandle, proxy: FaultProxy,
                                             tmp_path: Path) -> None:
    """fs.cp (pandas, Dask and pyarrow call it) is `cp URL URL`: one Copy Blob From URL, no byte of the blob
    through this machine, the source's content type and metadata kept; a missing source is FileNotFoundError."""
    data = bytes(range(256)) * 4000
    container.client.upload_blob("src/a.bin", data, metadata={"team": "ml"},
                                 content_settings=ContentSettings(content_type="application/x-test"))
    fs = _fs(azurite, tmp_path, proxy.endpoint())
    try:
        fs.cp(f"{container.name}/src/a.bin", f"{container.name}/dst/b.bin")
        with pytest.raises(FileNotFoundError):
            fs.cp_file(f"{container.name}/src/nope.bin", f"{container.name}/dst/c.bin")
    finally:
        fs.client.close()
    assert proxy.stats.requests["copy_blob"] == 1
    assert proxy.stats.requests["get_blob"] == 0 and proxy.stats.requests["put_blob"] == 0
    assert container.download("dst/b.bin") == data
    props = container.client.get_blob_client("dst/b.bin").get_blob_properties()
    assert props.content_settings.content_type == "application/x-test" and props.metadata == {"team": "ml"}


def test_rm_of_a_folder_is_one_listing_and_batched_deletes(azurite: Azurite, container: ContainerHandle,
                                                             proxy: FaultProxy, tmp_path: Path) -> None:
    """fs.rm(folder, recursive=True) (Dask's and pandas' overwrite of an output folder) deletes through the
    Client's remove job: Blob Batch requests of up to 256, not a DELETE per blob; a name beside the folder that only
    shares its prefix stays; a folder that is not there is FileNotFoundError."""
    for i in range(300):
        container.client.upload_blob(f"out/part-{i:04d}.parquet", b"x")
    container.client.upload_blob("out2/keep.txt", b"keep")
    container.client.upload_blob("outx", b"keep too")
    fs = _fs(azurite, tmp_path, proxy.endpoint())
    try:
        fs.rm(f"{container.name}/out", recursive=True)
        with pytest.raises(FileNotFoundError):
            fs.rm(f"{container.name}/out", recursive=True)
    finally:
        fs.client.close()
    assert container.blob_names() == ["out2/keep.txt", "outx"]
    assert proxy.stats.requests["batch"] == 2 and proxy.stats.requests["delete_blob"] == 0  # 256 + 44


def test_cat_ranges_fetches_every_range_at_once(azurite: Azurite, container: ContainerHandle, proxy: FaultProxy,
                                                tmp_path: Path) -> None:
    data = bytes(range(256)) * 400
    container.client.upload_blob("r.bin", data)
    fs = _fs(azurite, tmp_path, proxy.endpoint())
    path = f"{container.name}/r.bin"
    starts, ends = [0, 100, 5000, -10, 90_000, None], [10, 300, 5100, None, 200_000, 7]
    try:
        proxy.add_rule(Rule("get_blob", hold()))  # every range held: they arrive together, or the test times out
        pending = concurrent.futures.ThreadPoolExecutor(1).submit(fs.cat_ranges, [path] * 6, starts, ends)
        proxy.wait_for_held(5, timeout=30)  # the sixth ends before it starts (beyond the blob's 102,400 bytes)
        proxy.clear_rules()
        proxy.release_holds()
        got = pending.result(60)
        assert got == [data[s:e] for s, e in zip(starts, ends, strict=True)]
        missing = fs.cat_ranges([path, f"{container.name}/nope.bin"], [0, 0], [4, 4])
        assert missing[0] == data[:4] and isinstance(missing[1], FileNotFoundError)
        with pytest.raises(FileNotFoundError):
            fs.cat_file(f"{container.name}/nope.bin", 0, 4)
        assert fs.cat_file(path, 10, 20) == data[10:20]
    finally:
        proxy.release_holds()
        fs.client.close()


def test_a_script_using_the_filesystem_exits_without_unclosed_sessions(azurite: Azurite, container: ContainerHandle,
                                                                        tmp_path: Path) -> None:
    import subprocess
    import sys

    container.client.upload_blob("x.txt", b"x")
    code = (f"import fsspec, blobsync\nfs = fsspec.filesystem('blobsync', account_url={azurite.blob_endpoint!r}, "
            f"config=blobsync.TransferConfig(journal_path={str(tmp_path / 'j.db')!r}))\n"
            f"fs.pipe_file({container.name + '/y.txt'!r}, b'y' * 5_000_000)\n"
            f"print(fs.cat_file({container.name + '/x.txt'!r}))\n")
    done = subprocess.run([sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"},
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == "b'x'", done.stderr
    assert "Unclosed" not in done.stderr and "Task was destroyed" not in done.stderr, done.stderr


def test_a_small_get_rides_out_a_busy_answer_and_refuses_bad_ranges(
        azurite: Azurite, container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    """The one-request get (read_first) goes through the retry path: a 503 on it is sent again and the bytes that
    arrive are the blob's (SDK read back); a range given as text is a UsageError before any request."""
    from support.proxy import respond

    data = os.urandom(3000)
    container.client.upload_blob("s.bin", data)
    proxy.add_rule(Rule("get_blob", respond(503, "ServerBusy", retry_after=0.1), nth=1))
    with blobsync.Client(f"{proxy.endpoint()}/{container.name}", TransferConfig(journal_path=tmp_path / "j.db"),
                         env={"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}) as client:
        assert client.get("s.bin") == data == container.download("s.bin")
        assert proxy.stats.faults["get_blob"] == 1
        with pytest.raises(blobsync.UsageError, match="a whole number of bytes"):
            client.read_ranges([("s.bin", "0", 10)])  # type: ignore[list-item]
