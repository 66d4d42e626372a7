"""The whole blob's CRC64: composed from the blocks' as blobsync writes them (no second pass), stored with the blob
bound to its Content-MD5, and what a download of it checks, composed from the ranges as they land."""

from __future__ import annotations

import hashlib
import os
import random
import struct
from pathlib import Path

import pytest
from awscrt.checksums import crc64nvme
from azure.storage.blob import ContentSettings

import blobsync
from blobsync import TransferConfig
from blobsync.checksums import crc64_combine, crc64_compose
from blobsync.config import MiB
from conftest import ContainerHandle
from support.cli import random_file, run
from support.proxy import FaultProxy, Rule, flip_response_byte


def test_crc64s_compose_as_the_crc64_of_the_whole() -> None:
    rng = random.Random(5)
    for _ in range(40):
        a, b = os.urandom(rng.randint(0, 3000)), os.urandom(rng.randint(0, 3000))
        assert crc64_combine(crc64nvme(a, 0), crc64nvme(b, 0), len(b)) == crc64nvme(a + b, 0)
    data = os.urandom(3 * MiB + 17)
    step = MiB // 3
    parts = [(crc64nvme(data[i:i + step], 0), len(data[i:i + step])) for i in range(0, len(data), step)]
    assert crc64_compose(parts) == crc64nvme(data, 0)


def _stored(container: ContainerHandle, name: str) -> dict[str, str]:
    return dict(container.client.get_blob_client(name).get_blob_properties().metadata)


@pytest.mark.parametrize("put_md5", [True, False])
def test_a_blob_written_in_blocks_carries_its_crc64_bound_to_its_md5(put_md5: bool, container: ContainerHandle,
                                                                   tmp_path: Path) -> None:
    data = random_file(tmp_path / "f.bin", 5 * MiB + 3, seed=1)
    config = TransferConfig.from_mib(block_size_mb=1, journal_path=tmp_path / "j.db", put_md5=put_md5)
    assert blobsync.copy(tmp_path / "f.bin", f"{container.url}/f.bin", config).ok
    crc = struct.pack("<Q", crc64nvme(data, 0)).hex()
    assert _stored(container, "f.bin")["blobsynccrc64"] == crc + (hashlib.md5(data).hexdigest() if put_md5 else "")
    assert container.download("f.bin") == data


def test_a_range_damaged_in_transit_of_a_blob_with_no_md5_is_caught_by_its_crc64(
        container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    """--no-put-md5: before, a byte flipped in a range too large for the service's range MD5 reached the file."""
    data = random_file(tmp_path / "f.bin", 24 * MiB, seed=2)
    config = TransferConfig(journal_path=tmp_path / "j.db", put_md5=False)
    assert blobsync.copy(tmp_path / "f.bin", f"{container.url}/f.bin", config).ok
    proxy.add_rule(Rule("get_blob", flip_response_byte(), nth=2))
    url = f"{proxy.endpoint()}/{container.name}/f.bin"
    down = run(["cp", url, str(tmp_path / "back.bin"), "--journal", str(tmp_path / "j.db"), "--block-size-mb", "8"])
    assert down.returncode == 0, down.stderr
    assert proxy.stats.faults["get_blob"] == 1
    assert (tmp_path / "back.bin").read_bytes() == data
    got = blobsync.Client(f"{proxy.endpoint()}/{container.name}", TransferConfig(journal_path=tmp_path / "j.db"))
    with got as client:
        proxy.add_rule(Rule("get_blob", flip_response_byte(), nth=1))
        assert client.get("f.bin") == data


def test_a_stale_crc64_is_settled_by_the_md5_and_a_changed_md5_is_checked_as_such(
        container: ContainerHandle, tmp_path: Path) -> None:
    data = random_file(tmp_path / "f.bin", 10 * MiB + 1, seed=3)
    config = TransferConfig(journal_path=tmp_path / "j.db")
    assert blobsync.copy(tmp_path / "f.bin", f"{container.url}/f.bin", config).ok
    blob = container.client.get_blob_client("f.bin")
    metadata = _stored(container, "f.bin")
    # Another tool rewrote the metadata with a CRC64 that is not the bytes' (the MD5 part still the blob's).
    metadata["blobsynccrc64"] = "00" * 8 + metadata["blobsynccrc64"][16:]
    blob.set_blob_metadata(metadata)
    back = run(["cp", f"{container.url}/f.bin", str(tmp_path / "back.bin"), "--journal", str(tmp_path / "j.db")],
               env={"AZURE_STORAGE_CONNECTION_STRING": os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")})
    assert back.returncode == 0, back.stderr
    assert "CRC64 stored with the blob is not the bytes'" in back.stderr
    assert (tmp_path / "back.bin").read_bytes() == data
    # A Content-MD5 set since (wrongly) is the check again, as AzCopy's --check-md5 makes it: the file fails.
    blob.set_http_headers(ContentSettings(content_md5=bytearray(16)))
    wrong = blobsync.copy(f"{container.url}/f.bin", tmp_path / "again.bin", config)
    assert [f.exit_code for f in wrong.failures] == [blobsync.ExitCode.INTEGRITY]
    assert not (tmp_path / "again.bin").exists()


@pytest.mark.parametrize("put_md5", [True, False])
def test_a_stream_written_in_blocks_carries_its_crc64_too(put_md5: bool, container: ContainerHandle,
                                                           tmp_path: Path) -> None:
    """Client.open('wb') (torch.save, numpy.save) and put() of chunks: their parts' CRC64s make the blob's; with
    put_md5=False no whole MD5 is computed or stored (before, a stream hashed and stored it whatever the setting)."""
    data = os.urandom(3 * MiB + 11)
    config = TransferConfig.from_mib(block_size_mb=1, journal_path=tmp_path / "j.db", put_md5=put_md5)
    with blobsync.Client(container.url, config) as client:
        with client.open("s.bin", "wb") as f:
            for at in range(0, len(data), 100_000):
                f.write(data[at:at + 100_000])
        client.put(iter([data[:MiB + 5], data[MiB + 5:]]), "p.bin")
        assert client.get("s.bin") == data
    crc = struct.pack("<Q", crc64nvme(data, 0)).hex() + (hashlib.md5(data).hexdigest() if put_md5 else "")
    assert _stored(container, "s.bin")["blobsynccrc64"] == crc == _stored(container, "p.bin")["blobsynccrc64"]
    assert container.download("s.bin") == data == container.download("p.bin")
    for name in ("s.bin", "p.bin"):
        stored = container.client.get_blob_client(name).get_blob_properties().content_settings.content_md5
        assert (bytes(stored) if stored else None) == (hashlib.md5(data).digest() if put_md5 else None)
