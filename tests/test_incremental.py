"""Incremental writes against Azurite (issue 50): a blob written with `block_digests` keeps its blocks' digests
beside it; a later write with `blocks_from` naming it has the service stage every unchanged block from it (Put
Block From URL with the new block's CRC64, no body, seen at the proxy) and sends only the changed ones, through a
stream and a file upload alike. A record that lies costs a block sent, never a wrong byte. Bytes checked with the
SDK."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from blobsync import Client, TransferConfig
from blobsync.config import MiB
from blobsync.engine.prior import SUFFIX
from conftest import Side
from support.proxy import FaultProxy, Rule, respond

BLOCK = 4 * MiB


def _data(blocks: int, seed: int) -> bytearray:
    return bytearray(np.random.default_rng(seed).integers(0, 256, blocks * BLOCK - 1000, dtype=np.uint8).tobytes())


def _check(side: Side, name: str, data: bytes) -> None:
    assert side.download(name) == data
    props = side.client.get_blob_client(name).get_blob_properties()
    assert bytes(props.content_settings.content_md5) == hashlib.md5(data).digest()


def _copies(proxy: FaultProxy) -> list[dict[str, str]]:
    return [e.headers for e in proxy.log if e.op == "put_block_from_url"]


def test_a_stream_sends_only_the_blocks_that_changed(source: Side, proxy: FaultProxy) -> None:
    first = _data(8, 1)
    second = bytearray(first)
    second[5 * BLOCK + 7:5 * BLOCK + 99] = b"x" * 92  # one block changed
    config = TransferConfig(block_size=BLOCK, block_digests=True)
    with Client(source.url(proxy.url), config) as client:
        with client.open("run/a.bin", "wb") as out:
            out.write(first)
        record = json.loads(source.download("run/a.bin" + SUFFIX))
        assert record["block_size"] == BLOCK and len(record["xxh3_128"]) == 8 * 32
        proxy.reset_stats()
        # Another block size asked for: the write takes the earlier blob's, so that the blocks line up.
        with client.open("run/b.bin", "wb", config=TransferConfig(block_size=2 * BLOCK, block_digests=True,
                                                                  blocks_from="run/a.bin")) as out:
            out.write(second)
        assert out.result is not None
        assert out.result.bytes_copied == 7 * BLOCK - 1000 and out.result.bytes_sent == BLOCK
    assert proxy.stats.bytes_in["put_block"] == BLOCK and proxy.stats.requests["put_block"] == 1
    copies = _copies(proxy)
    assert len(copies) == 7 and all(h.get("x-ms-source-content-crc64") for h in copies)
    assert proxy.stats.bytes_in["put_block_from_url"] == 0  # no body: the service reads the earlier blob
    _check(source, "run/b.bin", bytes(second))
    assert json.loads(source.download("run/b.bin" + SUFFIX))["block_size"] == BLOCK  # the next save's base


def test_a_record_that_lies_costs_a_block_sent_never_a_wrong_byte(source: Side, proxy: FaultProxy) -> None:
    import xxhash

    first = _data(3, 2)
    second = _data(3, 3)  # every block differs
    config = TransferConfig(block_size=BLOCK, block_digests=True)
    with Client(source.url(proxy.url), config) as client:
        client.put(bytes(first), "a.bin", config)
        record = json.loads(source.download("a.bin" + SUFFIX))
        # The record now claims the new bytes: each block is asked of the service, which refuses it by its CRC64.
        record["xxh3_128"] = "".join(xxhash.xxh3_128_hexdigest(bytes(second[i:i + BLOCK]))
                                     for i in range(0, len(second), BLOCK))
        source.client.upload_blob("a.bin" + SUFFIX, json.dumps(record).encode(), overwrite=True)
        proxy.reset_stats()
        result = client.put(bytes(second), "b.bin", TransferConfig(block_size=BLOCK, blocks_from="a.bin"))
    assert len(_copies(proxy)) == 3 and proxy.stats.ok("put_block_from_url") == 0
    assert result.bytes_copied == 0 and result.bytes_sent == len(second)
    _check(source, "b.bin", bytes(second))


@pytest.mark.parametrize("record", ["missing", "garbage", "blob changed", "tiny blocks"])
def test_without_a_usable_record_everything_is_sent_and_the_result_says_why(source: Side, proxy: FaultProxy,
                                                                           tmp_path: Path, record: str) -> None:
    data = _data(3, 4)
    config = TransferConfig(block_size=BLOCK, block_digests=record != "missing")
    with Client(source.url(proxy.url), config) as client:
        client.put(bytes(data), "a.bin", config)
        if record == "garbage":
            source.client.upload_blob("a.bin" + SUFFIX, b"{not json" * 1000, overwrite=True)
        elif record == "blob changed":
            source.client.upload_blob("a.bin", bytes(data), overwrite=True)
        elif record == "tiny blocks":  # a planted record: blocks of 16 bytes, each "equal"
            planted = json.loads(source.download("a.bin" + SUFFIX))
            planted.update(block_size=16, xxh3_128="00" * 16 * -(-len(data) // 16))
            source.client.upload_blob("a.bin" + SUFFIX, json.dumps(planted).encode(), overwrite=True)
        src = tmp_path / "b.bin"
        src.write_bytes(data)
        proxy.reset_stats()
        report = client.copy(src, client.url_for("b.bin"), TransferConfig(block_size=BLOCK, blocks_from="a.bin"))
    result = report.written[0]
    assert result.bytes_copied == 0 and result.bytes_sent == len(data) and not _copies(proxy)
    assert "incremental: sent whole" in result.reason
    _check(source, "b.bin", bytes(data))


@pytest.mark.parametrize("cluster", [None, "processes:2"])
def test_a_folder_upload_compares_each_file_with_its_namesake(source: Side, proxy: FaultProxy, tmp_path: Path,
                                                             cluster: str | None) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    files = {"x.bin": _data(3, 5), "sub/y.bin": _data(2, 6)}
    for rel, data in files.items():
        (old / rel).parent.mkdir(parents=True, exist_ok=True)
        (old / rel).write_bytes(data)
    config = TransferConfig(block_size=BLOCK, block_digests=True, recursive=True)
    with Client(source.url(proxy.url), config) as client:
        client.copy(old, client.url_for("step-1"), config, as_subdir=False)
        files["x.bin"][:10] = b"0123456789"  # block 0 of x.bin changed; y.bin unchanged
        for rel, data in files.items():
            (new / rel).parent.mkdir(parents=True, exist_ok=True)
            (new / rel).write_bytes(data)
        proxy.reset_stats()
        later = TransferConfig(block_size=BLOCK, block_digests=True, recursive=True, blocks_from="step-1/")
        report = client.copy(new, client.url_for("step-2"), later, as_subdir=False, cluster=cluster)
    assert not report.failures
    assert report.bytes_sent == BLOCK and report.bytes_copied == sum(map(len, files.values())) - BLOCK
    assert proxy.stats.bytes_in["put_block"] == BLOCK and len(_copies(proxy)) == 4
    for rel, data in files.items():
        _check(source, f"step-2/{rel}", bytes(data))


def test_a_service_that_fails_its_copies_gets_the_blocks_sent(source: Side, proxy: FaultProxy) -> None:
    data = _data(6, 7)
    config = TransferConfig(block_size=BLOCK, block_digests=True, max_retries=1)
    with Client(source.url(proxy.url), config) as client:
        client.put(bytes(data), "a.bin", config)
        proxy.add_rule(Rule("put_block_from_url", respond(500, "InternalError")))
        proxy.reset_stats()
        result = client.put(bytes(data), "b.bin", TransferConfig(block_size=BLOCK, max_retries=1, blocks_from="a.bin"))
    assert result.bytes_copied == 0 and result.bytes_sent == len(data)
    # Each copy in flight tried through its retries, then none more: the earlier blob is given up on.
    assert len(_copies(proxy)) <= 2 * 6
    _check(source, "b.bin", bytes(data))
