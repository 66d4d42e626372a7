"""blobsync.Client and blobsync.aio.Client against Azurite: one session across calls, bytes in and out, background
pushes; every byte checked with an SDK download (issue 27, part 1, 3 and 4)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
from dataclasses import replace
from pathlib import Path

import pytest

import blobsync
from blobsync import TransferConfig
from blobsync.config import CheckMd5, MiB
from conftest import ContainerHandle
from support.proxy import FaultProxy, Rule, reset_mid_response


def _config(tmp_path: Path) -> TransferConfig:
    return TransferConfig.from_mib(block_size_mb=1, journal_path=tmp_path / "j.db")


def test_put_and_get_bytes_small_and_in_blocks_with_what_landed(container: ContainerHandle, tmp_path: Path) -> None:
    small, big = b"hello world", os.urandom(5 * MiB + 3)
    with blobsync.Client(container.url, _config(tmp_path)) as client:
        first = client.put(small, "a/b.txt")
        second = client.put(big, "big.bin")
        third = client.put(io.BytesIO(big[7:]), "obj.bin")
        assert client.get("big.bin") == big
        buf = bytearray(6 * MiB)
        view = client.get("big.bin", into=buf)
        assert len(view) == len(big) and bytes(view) == big
        assert sorted(p.name for p in client.ls()) == ["a/b.txt", "big.bin", "obj.bin"]
        assert [p.name for p in client.ls("a")] == ["a/b.txt"]
        stores = client.aio._session._stores if client.aio._session else {}
        assert len(stores) == 1  # every call went through one store: one connection pool, one credential
    for result, name, data in ((first, "a/b.txt", small), (second, "big.bin", big), (third, "obj.bin", big[7:])):
        assert container.download(name) == data
        props = container.client.get_blob_client(name).get_blob_properties()
        assert result.etag == props.etag and result.size == len(data)
        assert result.content_md5 == hashlib.md5(data).digest() == bytes(props.content_settings.content_md5)
    assert second.bytes_sent == len(big)


def test_get_refuses_a_short_buffer_and_names_a_missing_blob(container: ContainerHandle, tmp_path: Path) -> None:
    container.client.upload_blob("x.bin", b"0123456789")
    with blobsync.Client(container.url, _config(tmp_path)) as client:
        with pytest.raises(blobsync.UsageError, match="holds 4 bytes"):
            client.get("x.bin", into=bytearray(4))
        with pytest.raises(blobsync.BlobNotFoundError) as caught:
            client.get("missing.bin")
        assert caught.value.status == 404


@pytest.mark.parametrize("size", [1000, 3 * MiB + 5])  # one request; the first bytes, then ranges
def test_get_checks_the_md5_as_a_download_does(container: ContainerHandle, tmp_path: Path, size: int,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """--check-md5 (the Client's config) decides for bytes read into memory as for a file: a wrong stored MD5
    fails FailIfDifferent, is logged by LogOnly and not even hashed by NoCheck; a missing one fails only
    FailIfDifferentOrMissing."""
    from azure.storage.blob import ContentSettings

    data = os.urandom(size)
    container.client.upload_blob("wrong.bin", data)
    container.client.get_blob_client("wrong.bin").set_http_headers(ContentSettings(content_md5=bytearray(16)))
    container.client.get_blob_client("none.bin").upload_blob(data)
    container.client.get_blob_client("none.bin").set_http_headers(ContentSettings())  # no Content-MD5 kept

    def client(mode: str) -> blobsync.Client:
        return blobsync.Client(container.url, replace(_config(tmp_path), check_md5=CheckMd5.parse(mode)))

    with client("FailIfDifferent") as c:
        with pytest.raises(blobsync.ChecksumMismatchError, match="nothing returned"):
            c.get("wrong.bin")
        assert c.get("none.bin") == data
    with client("LogOnly") as c:
        assert c.get("wrong.bin") == data and "LogOnly: kept" in caplog.text
    with client("NoCheck") as c:
        assert c.get("wrong.bin") == data
    with client("FailIfDifferentOrMissing") as c, pytest.raises(blobsync.IntegrityError, match="no Content-MD5"):
        c.get("none.bin")


def test_copy_and_sync_through_the_client_share_its_session(container: ContainerHandle, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "one.pt").write_bytes(b"one")
    (src / "two.h5").write_bytes(b"two")
    container.client.upload_blob("run/orphan.txt", b"keep me")
    with blobsync.Client(container.url, _config(tmp_path)) as client:
        report = client.sync(src, client.url_for("run"), delete=False)
        assert report.files_transferred == 2
        copied = client.copy(src / "two.h5", client.url_for("single/two.h5"))
        assert copied.files_transferred == 1
        down = client.copy(client.url_for("run"), tmp_path / "down", TransferConfig(recursive=True,
                                                                                     journal_path=tmp_path / "j.db"))
        assert down.files_failed == 0
        session = client.aio._session
        assert session is not None and len(session._stores) == 1
    assert container.download("run/d/one.pt") == b"one"
    assert container.download("run/orphan.txt") == b"keep me"
    assert container.download("single/two.h5") == b"two"
    assert (tmp_path / "down" / "run" / "d" / "one.pt").read_bytes() == b"one"


def test_submit_pushes_in_the_background_and_returns_a_future(container: ContainerHandle, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB)
    with blobsync.Client(container.url, _config(tmp_path)) as client:
        futures = [client.submit(client.aio.put, data, f"ckpt/ep{i}.pt") for i in range(4)]
        steps = 0
        while not all(f.done() for f in futures):  # the training loop goes on meanwhile
            steps += 1
            asyncio.run(asyncio.sleep(0.001))
        results = [f.result() for f in futures]
    assert all(r.etag for r in results)
    for i in range(4):
        assert container.download(f"ckpt/ep{i}.pt") == data


def test_the_async_client_runs_concurrent_calls_under_one_budget(container: ContainerHandle, tmp_path: Path) -> None:
    async def main() -> list[blobsync.FileResult]:
        config = TransferConfig.from_mib(block_size_mb=1, memory_mb=4, journal_path=tmp_path / "j.db",
                                         concurrency=4)
        async with blobsync.aio.Client(container.url, config) as client:
            results = await asyncio.gather(*(client.put(bytes([i]) * (2 * MiB + i), f"p/{i}.bin")
                                             for i in range(6)))
            session = client._session
            assert session is not None and session.memory.limit == 4 * MiB
            return list(results)

    results = asyncio.run(main())
    for i, result in enumerate(results):
        assert result.size == 2 * MiB + i
        assert container.download(f"p/{i}.bin") == bytes([i]) * (2 * MiB + i)


def test_put_refuses_what_is_not_bytes_or_a_seekable_file(container: ContainerHandle, tmp_path: Path) -> None:
    with blobsync.Client(container.url, _config(tmp_path)) as client:
        with pytest.raises(blobsync.UsageError, match="put\\(\\) takes bytes"):
            client.put("text, not bytes", "x.txt")  # type: ignore[arg-type]
        with pytest.raises(blobsync.UsageError, match="needs a blob name"):
            client.put(b"x", "folder/")
    assert container.blob_names() == []


def test_the_report_lists_what_landed_with_urls_free_of_the_sas(azurite: object, container: ContainerHandle,
                                                                 tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas("devstoreaccount1", container.name, account_key=azurite.key,  # type: ignore[attr-defined]
                                 permission=ContainerSasPermissions(read=True, write=True, create=True, list=True),
                                 expiry=datetime.now(UTC) + timedelta(hours=1))
    src = tmp_path / "ckpt"
    files = {"a.pt": os.urandom(1000), "sub/b.pt": os.urandom(3 * MiB + 1)}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    report = blobsync.copy(src, f"{container.url}?{sas}", TransferConfig.from_mib(
        block_size_mb=1, recursive=True, journal_path=tmp_path / "j.db"), as_subdir=False)
    assert report.written_complete and len(report.written) == 2
    for result in report.written:
        data = files[result.blob]
        props = container.client.get_blob_client(result.blob).get_blob_properties()
        assert result.url == f"{container.url}/{result.blob}" and "sig=" not in (result.url or "")
        assert result.etag == props.etag and result.size == len(data)
        assert result.content_md5 == hashlib.md5(data).digest()


def test_a_small_put_is_one_request_with_its_md5_and_overwrite_false_keeps_the_blob(
        container: ContainerHandle, tmp_path: Path) -> None:
    from blobsync.config import Overwrite

    with blobsync.Client(container.url, _config(tmp_path)) as client:
        first = client.put(b"v1", "k.txt")
        assert client.put(b"v2", "k.txt").content_md5 == hashlib.md5(b"v2").digest()  # overwrite true: replaced
        with pytest.raises(blobsync.BlobsyncError, match="exists: not overwritten"):
            client.put(b"v3", "k.txt", TransferConfig(overwrite=Overwrite.FALSE, journal_path=tmp_path / "j.db"))
        assert blobsync.list_jobs(tmp_path / "j.db") == []  # nothing a journal could resume: none written
    assert container.download("k.txt") == b"v2" and first.etag


def test_a_small_put_whose_answer_is_lost_is_sent_again_and_lands(
        container: ContainerHandle, proxy: object, tmp_path: Path) -> None:
    from support.proxy import FaultProxy, Rule, reset_after

    assert isinstance(proxy, FaultProxy)
    proxy.add_rule(Rule("put_blob", reset_after(), nth=1))  # the first put lands, its answer never arrives
    data = os.urandom(20_000)
    with blobsync.Client(f"{proxy.endpoint()}/{container.name}", _config(tmp_path)) as client:
        result = client.put(data, "lost.bin")
    assert proxy.stats.requests["put_blob"] == 2
    assert container.download("lost.bin") == data
    assert result.etag == container.client.get_blob_client("lost.bin").get_blob_properties().etag


def test_read_into_fills_a_range_in_parallel_and_refuses_a_bad_offset(container: ContainerHandle,
                                                                      tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 123)
    container.client.upload_blob("r.bin", data)
    with blobsync.Client(container.url, _config(tmp_path)) as client:
        buf = bytearray(2 * MiB + 5)  # more than one 1 MiB block: ranges in parallel
        view = client.read_into("r.bin", buf, 1000)
        assert bytes(view) == data[1000:1000 + len(buf)] == container.download("r.bin")[1000:1000 + len(buf)]
        assert bytes(client.read_into("r.bin", bytearray(10))) == data[:10]
        for bad in (-1, "10", True):
            with pytest.raises(blobsync.UsageError, match="invalid offset"):
                client.read_into("r.bin", bytearray(10), bad)  # type: ignore[arg-type]
        with pytest.raises(blobsync.BlobsyncError):
            client.read_into("r.bin", bytearray(10), len(data) + 100)  # past the end: an error, never short bytes


def test_large_reads_into_memory_span_blocks_and_a_span_cut_short_goes_on(container: ContainerHandle,
                                                                          proxy: FaultProxy, tmp_path: Path) -> None:
    """read_into and get of a blob without a stored MD5 (nothing hashed in order) read several blocks a GET,
    straight into the caller's buffer, as a download does; a GET reset mid-span asks again for the rest only."""
    data = os.urandom(40 * MiB + 11)
    blob = container.client.get_blob_client("s.bin")
    ids = [f"{i:04d}".encode().hex() for i in range(3)]
    for i, block_id in enumerate(ids):  # staged and committed: the blob has no Content-MD5
        blob.stage_block(block_id, data[i * 16 * MiB:(i + 1) * 16 * MiB])
    blob.commit_block_list(ids)
    assert blob.get_blob_properties().content_settings.content_md5 is None
    config = TransferConfig.from_mib(block_size_mb=8, concurrency=2, journal_path=tmp_path / "j.db")
    with blobsync.Client(f"{proxy.endpoint()}/{container.name}", config) as client:
        buf = bytearray(len(data) - 100)
        assert bytes(client.read_into("s.bin", buf, 100)) == data[100:]
        assert proxy.stats.requests["get_blob"] == 2  # 5 ranges of 8 MiB in 2 GETs (3 and 2 blocks), 2 in flight
        assert client.get("s.bin") == data  # the first 256 KiB, then the rest in spans
        proxy.add_rule(Rule("get_blob", reset_mid_response(0.6), nth=1))
        before = proxy.stats.requests["get_blob"]
        assert bytes(client.read_into("s.bin", bytearray(len(data)))) == data
        assert proxy.stats.requests["get_blob"] - before == 3  # the cut span once more, from its first block missing
