"""Responses damaged in transit (a byte flipped in the body, headers intact) are fetched again, never kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blobsync.config import MiB
from conftest import ContainerHandle
from support.cli import random_file, run
from support.proxy import FaultProxy, Rule, flip_response_byte


def _summary(stdout: str) -> dict[str, object]:
    return [json.loads(line) for line in stdout.splitlines() if '"summary"' in line][-1]


@pytest.mark.parametrize("check", ["FailIfDifferent", "NoCheck"])
def test_small_blobs_damaged_in_transit_are_refetched(check: str, container: ContainerHandle, proxy: FaultProxy,
                                                     tmp_path: Path) -> None:
    blobs = {f"d/{i:03}.bin": random_file(tmp_path / "src" / f"{i}", 1000 + 37 * i, seed=i) for i in range(60)}
    for name, data in blobs.items():
        container.client.upload_blob(name, data)
    proxy.add_rule(Rule("get_blob", flip_response_byte(), probability=0.15, seed=3))
    done = run(["sync", f"{proxy.endpoint()}/{container.name}/d", str(tmp_path / "dl"), "--check-md5", check,
                "--journal", str(tmp_path / "j.db"), "--output-type", "json", "--quiet"])
    assert done.returncode == 0, (done.stdout, done.stderr)
    injected = proxy.stats.faults["get_blob"]
    assert injected >= 3
    assert _summary(done.stdout)["retries"] == injected
    for name, data in blobs.items():
        assert (tmp_path / "dl" / name.removeprefix("d/")).read_bytes() == data, name


def test_a_damaged_range_of_a_large_blob_is_refetched_alone(container: ContainerHandle, proxy: FaultProxy,
                                                            tmp_path: Path) -> None:
    data = random_file(tmp_path / "orig.bin", 12 * MiB + 5, seed=9)
    container.client.upload_blob("big.bin", data)  # the SDK stores no Content-MD5 for a chunked upload
    proxy.add_rule(Rule("get_blob", flip_response_byte(), nth={3, 7}))
    done = run(["cp", f"{proxy.endpoint()}/{container.name}/big.bin", str(tmp_path / "got.bin"), "--block-size-mb",
                "1", "--check-md5", "NoCheck", "--journal", str(tmp_path / "j.db"), "--output-type", "json",
                "--quiet"])
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert _summary(done.stdout)["retries"] == 2
    assert proxy.stats.requests["get_blob"] == 13 + 2  # 13 ranges, and the two damaged ones again
    assert (tmp_path / "got.bin").read_bytes() == data


def test_damage_in_a_range_too_large_for_a_range_md5_refetches_the_file_once(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = random_file(tmp_path / "orig.bin", 24 * MiB, seed=10)
    up = run(["cp", str(tmp_path / "orig.bin"), f"{container.url}/big.bin", "--journal", str(tmp_path / "u.db"),
              "--quiet"])  # blobsync stores the whole-file Content-MD5
    assert up.returncode == 0, up.stderr
    proxy.add_rule(Rule("get_blob", flip_response_byte(), nth=2))
    done = run(["cp", f"{proxy.endpoint()}/{container.name}/big.bin", str(tmp_path / "got.bin"),
                "--block-size-mb", "8", "--check-md5", "FailIfDifferent", "--journal", str(tmp_path / "j.db"),
                "--output-type", "json", "--quiet"])
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert _summary(done.stdout)["retries"] == 1
    assert proxy.stats.requests["get_blob"] == 3 + 3  # 8 MiB ranges get no range MD5: the file again
    assert (tmp_path / "got.bin").read_bytes() == data


def test_a_get_whose_large_range_arrives_damaged_reads_again_as_a_download_does(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    import blobsync

    data = random_file(tmp_path / "orig.bin", 24 * MiB, seed=12)
    config = blobsync.TransferConfig.from_mib(journal_path=tmp_path / "j.db")  # 8 MiB ranges: no range MD5
    with blobsync.Client(container.url, config) as client:
        client.put(data, "big.bin")  # its whole MD5 stored as the Content-MD5
    proxy.add_rule(Rule("get_blob", flip_response_byte(), nth=2))
    with blobsync.Client(f"{proxy.endpoint()}/{container.name}", config) as client:
        assert client.get("big.bin") == data
    assert proxy.stats.faults["get_blob"] == 1 and proxy.stats.requests["get_blob"] > 2


def test_a_blob_whose_stored_md5_is_wrong_fails_with_exit_4_after_one_refetch(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    from azure.storage.blob import ContentSettings

    data = random_file(tmp_path / "orig.bin", 9 * MiB, seed=11)
    blob = container.client.upload_blob("bad.bin", data)
    blob.set_http_headers(ContentSettings(content_md5=bytearray(16)))  # a stored MD5 that is simply wrong
    done = run(["cp", f"{proxy.endpoint()}/{container.name}/bad.bin", str(tmp_path / "got.bin"),
                "--block-size-mb", "8", "--journal", str(tmp_path / "j.db"), "--quiet"])
    assert done.returncode == 4, done.stderr
    assert "MD5" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "got.bin").exists()
    assert proxy.stats.requests["get_blob"] == 2 * 2  # two 8 MiB-or-less ranges, fetched twice
