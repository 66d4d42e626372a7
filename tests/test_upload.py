"""Uploads against Azurite, each checked by an independent SDK download: sizes, trees, naming, flags."""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from pathlib import Path

import pytest
from awscrt.checksums import crc64nvme

import blobsync
from blobsync import FileStatus, Overwrite, TransferConfig
from blobsync.config import BlockCheck, MiB
from conftest import ContainerHandle
from support.cli import random_file, run
from support.proxy import FaultProxy, Rule, flip_byte


def _copy(src: Path, url: str, tmp_path: Path, **options: object) -> blobsync.Report:
    config = TransferConfig.from_mib(journal_path=tmp_path / "journal.db", **options)  # type: ignore[arg-type]
    return blobsync.copy(src, url, config, env={})


def _check_blob(container: ContainerHandle, name: str, data: bytes) -> None:
    assert container.download(name) == data
    props = container.client.get_blob_client(name).get_blob_properties()
    assert props.size == len(data)
    assert props.content_settings.content_md5 == bytearray(hashlib.md5(data).digest())


@pytest.mark.parametrize(
    ("size", "put_blob_mb"),
    [
        (0, None),  # empty file: one Put Blob
        (1, None),
        (MiB, 0),  # exactly one block, through Put Block + Put Block List
        (MiB + 1, 0),  # one block plus one byte
        (MiB, None),  # exactly the single-put limit: one Put Blob
        (3 * MiB + 17, None),
    ],
)
def test_sizes_round_trip(
    size: int, put_blob_mb: float | None, container: ContainerHandle, tmp_path: Path, proxy: FaultProxy
) -> None:
    data = random_file(tmp_path / "src" / "f.bin", size, seed=size)
    url = f"{proxy.endpoint()}/{container.name}/f.bin"
    report = _copy(tmp_path / "src" / "f.bin", url, tmp_path, block_size_mb=1, put_blob_size_mb=put_blob_mb)
    assert (report.files_transferred, report.files_failed) == (1, 0)
    _check_blob(container, "f.bin", data)
    blocks = -(-size // MiB)
    single = put_blob_mb is None and size <= MiB
    assert proxy.stats.requests["put_blob"] == (1 if single else 0)
    assert proxy.stats.requests["put_block"] == (0 if single else blocks)
    if not single:
        # Every Put Block carried its own check (on the emulator an MD5 by default), and only one.
        sent = [e.headers for e in proxy.log if e.op == "put_block"]
        assert all("content-md5" in h and "x-ms-content-crc64" not in h for h in sent)
        committed = container.client.get_blob_client("f.bin").get_block_list("committed")[0]
        assert [b.size for b in committed] == [min(MiB, size - i * MiB) for i in range(blocks)]


def test_large_file_metadata_and_content_type(container: ContainerHandle, tmp_path: Path) -> None:
    data = random_file(tmp_path / "model.json", 150 * MiB + 5, seed=3)
    mtime_ns = 1_700_000_000_123_456_789
    os.utime(tmp_path / "model.json", ns=(mtime_ns, mtime_ns))
    report = _copy(tmp_path / "model.json", container.url + "/", tmp_path, metadata={"team": "ml"},
                   tier="Cool")
    assert report.files_transferred == 1
    _check_blob(container, "model.json", data)
    props = container.client.get_blob_client("model.json").get_blob_properties()
    assert props.content_settings.content_type == "application/json"
    # blobsync's own: the whole blob's CRC64 (CRC-64/NVME, 8 bytes little-endian), composed from the blocks'
    crc = struct.pack("<Q", crc64nvme(data, 0)).hex() + hashlib.md5(data).hexdigest()  # bound to the Content-MD5
    assert props.metadata == {"team": "ml", "mtime": "2023-11-14T22:13:20.123456789Z", "blobsynccrc64": crc}
    assert props.blob_tier == "Cool"


def test_tree_of_500_small_files_with_odd_names(container: ContainerHandle, tmp_path: Path) -> None:
    src = tmp_path / "tree"
    expected: dict[str, bytes] = {}
    names = ["a", "dir with spaces", "naïve-ünïcødé", "日本語", "deep/er/still"]
    for i in range(500):
        rel = f"{names[i % len(names)]}/file {i} é.txt" if i % 7 else f"top-{i}.bin"
        expected[f"pre/tree/{rel}"] = random_file(src / rel, (i * 37) % 5000, seed=i)  # AzCopy's layout
    report = _copy(src, container.url + "/pre", tmp_path, recursive=True)
    assert (report.files_transferred, report.files_failed) == (500, 0)
    assert container.blob_names() == sorted(expected)
    for name, data in expected.items():
        assert container.download(name) == data


def test_single_file_naming_follows_azcopy(container: ContainerHandle, tmp_path: Path) -> None:
    random_file(tmp_path / "w.pt", 10)
    _copy(tmp_path / "w.pt", container.url, tmp_path)  # container URL: takes the file name
    _copy(tmp_path / "w.pt", container.url + "/ckpt/", tmp_path)  # trailing '/': a folder
    _copy(tmp_path / "w.pt", container.url + "/ckpt/renamed.pt", tmp_path)  # a blob name
    assert container.blob_names() == ["ckpt/renamed.pt", "ckpt/w.pt", "w.pt"]


@pytest.mark.parametrize(("block_check", "code"), [("auto", "Md5Mismatch"), ("crc64", "Crc64Mismatch"),
                                                   ("md5", "Md5Mismatch")])
def test_flipped_byte_is_rejected_by_the_service_and_resent(
    container: ContainerHandle, tmp_path: Path, proxy: FaultProxy, block_check: str, code: str
) -> None:
    # On the emulator 'auto' sends MD5s (Azurite's CRC64 is JavaScript); either check is verified by the service.
    data = random_file(tmp_path / "f.bin", 4 * MiB + 3, seed=9)
    proxy.add_rule(Rule("put_block", flip_byte(), nth=2))
    report = _copy(tmp_path / "f.bin", f"{proxy.endpoint()}/{container.name}/f.bin", tmp_path, block_size_mb=1,
                   block_check=BlockCheck.parse(block_check))
    assert report.files_transferred == 1 and report.retries == 1
    rejected = [e for e in proxy.log if e.op == "put_block" and e.status == 400]
    assert len(rejected) == 1 and rejected[0].error_code == code
    assert proxy.stats.requests["put_block"] == 5 + 1
    _check_blob(container, "f.bin", data)


def test_leftover_blocks_with_other_id_length_do_not_break_the_upload(
    container: ContainerHandle, tmp_path: Path
) -> None:
    blob = container.client.get_blob_client("f.bin")
    blob.stage_block(base64.b64encode(b"x").decode(), b"stale")  # another tool's aborted upload
    data = random_file(tmp_path / "f.bin", 3 * MiB, seed=4)
    report = _copy(tmp_path / "f.bin", container.url + "/f.bin", tmp_path, block_size_mb=1)
    assert report.files_transferred == 1, report.failures
    _check_blob(container, "f.bin", data)
    assert blob.get_block_list("uncommitted")[1] == []


@pytest.mark.parametrize("overwrite", [Overwrite.TRUE, Overwrite.FALSE])
def test_leftover_blocks_do_not_break_a_streamed_write(container: ContainerHandle, tmp_path: Path,
                                                       overwrite: Overwrite) -> None:
    """Client.put of chunks (and open('wb'), fsspec): every part is refused until the leftovers are cleared."""
    blob = container.client.get_blob_client("s.bin")
    blob.stage_block(base64.b64encode(b"x").decode(), b"stale")
    chunks = [os.urandom(700 * 1024) for _ in range(6)]
    config = TransferConfig.from_mib(block_size_mb=1, journal_path=tmp_path / "j.db", overwrite=overwrite)
    with blobsync.Client(container.url, config, env={}) as client:
        client.put(iter(chunks), "s.bin")
    _check_blob(container, "s.bin", b"".join(chunks))
    assert blob.get_block_list("uncommitted")[1] == []


def test_overwrite_modes(container: ContainerHandle, tmp_path: Path) -> None:
    old = random_file(tmp_path / "f.bin", 100, seed=1)
    _copy(tmp_path / "f.bin", container.url + "/", tmp_path)
    new = random_file(tmp_path / "f.bin", 200, seed=2)
    os.utime(tmp_path / "f.bin", (1_000_000_000, 1_000_000_000))  # older than the blob's stored mtime
    report = _copy(tmp_path / "f.bin", container.url + "/", tmp_path, overwrite=Overwrite.FALSE)
    assert report.files_skipped == 1 and report.skipped_notes[0].status is FileStatus.SKIPPED
    assert container.download("f.bin") == old
    report = _copy(tmp_path / "f.bin", container.url + "/", tmp_path, overwrite=Overwrite.IF_SOURCE_NEWER)
    assert report.files_skipped == 1
    assert container.download("f.bin") == old
    os.utime(tmp_path / "f.bin", None)  # now newer
    report = _copy(tmp_path / "f.bin", container.url + "/", tmp_path, overwrite=Overwrite.IF_SOURCE_NEWER)
    assert report.files_transferred == 1
    assert container.download("f.bin") == new


def test_overwrite_false_creates_a_new_block_blob_and_then_skips_it(container: ContainerHandle, tmp_path: Path) -> None:
    data = random_file(tmp_path / "big.bin", 3 * MiB + 1)
    report = _copy(tmp_path / "big.bin", container.url + "/", tmp_path, block_size_mb=1, overwrite=Overwrite.FALSE)
    assert report.files_transferred == 1, report.failures
    random_file(tmp_path / "big.bin", 3 * MiB + 1, seed=8)
    report = _copy(tmp_path / "big.bin", container.url + "/", tmp_path, block_size_mb=1, overwrite=Overwrite.FALSE)
    assert report.files_skipped == 1
    _check_blob(container, "big.bin", data)


def test_cli_cp_summary_and_jobs_commands(container: ContainerHandle, tmp_path: Path) -> None:
    data = random_file(tmp_path / "src" / "a.bin", 3 * MiB, seed=5)
    journal = str(tmp_path / "j.db")
    done = run(["cp", "-r", str(tmp_path / "src"), container.url, "--journal", journal, "--block-size-mb", "1"])
    assert done.returncode == 0, done.stderr
    assert "1 uploaded, 0 skipped, 0 failed" in done.stdout
    assert container.download("src/a.bin") == data  # the folder is a level, as AzCopy makes it
    listed = run(["jobs", "list", "--journal", journal])
    job_id = listed.stdout.split()[0]
    assert "done" in listed.stdout and container.name in listed.stdout
    shown = run(["jobs", "show", job_id, "--journal", journal])
    assert "committed" in shown.stdout and "a.bin" in shown.stdout
    cleaned = run(["jobs", "clean", "--journal", journal])
    assert "removed 1 job(s)" in cleaned.stdout
    assert "no jobs" in run(["jobs", "list", "--journal", journal]).stdout
