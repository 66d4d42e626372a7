"""Downloads against Azurite, byte for byte: sizes, prefixes, resume after SIGKILL, ETag change, MD5, names."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.storage.blob import ContentSettings

import blobsync
from blobsync import CheckMd5, TransferConfig
from blobsync.config import MiB
from blobsync.local.target import PART_SUFFIX
from conftest import ContainerHandle, container_sas
from support.azurite import Azurite
from support.cli import kill_when_held, random_file, run
from support.proxy import FaultProxy, Rule, reset_mid_response, shift_range

BLOCKS = 24
SIZE = BLOCKS * MiB - 1000
CONCURRENCY = 4


def _put(container: ContainerHandle, name: str, data: bytes, *, md5: bytes | None = None) -> None:
    """Upload with the plain SDK, then store a Content-MD5 (the right one unless `md5` says otherwise).

    Set afterwards because the SDK sets none for block uploads, and Azurite checks one sent with the data."""
    blob = container.client.get_blob_client(name)
    blob.upload_blob(data, overwrite=True)
    digest = md5 if md5 is not None else hashlib.md5(data).digest()
    blob.set_http_headers(ContentSettings(content_type="application/octet-stream", content_md5=bytearray(digest)))


def _get(url: str, dest: Path, tmp_path: Path, **options: object) -> blobsync.Report:
    config = TransferConfig.from_mib(journal_path=tmp_path / "journal.db", **options)  # type: ignore[arg-type]
    return blobsync.copy(url, str(dest), config, env={})


@pytest.mark.parametrize(("size", "block_mb"), [(0, 1), (1, 1), (2 * MiB, 1), (MiB + 1, 1), (200 * MiB + 7, 8)])
def test_sizes_round_trip(size: int, block_mb: int, container: ContainerHandle, tmp_path: Path,
                          proxy: FaultProxy) -> None:
    data = random_file(tmp_path / "src.bin", size, seed=size)
    _put(container, "dir/f.bin", data)
    report = _get(f"{proxy.endpoint()}/{container.name}/dir/f.bin", tmp_path / "out.bin", tmp_path,
                  block_size_mb=block_mb, put_blob_size_mb=0)
    assert (report.files_transferred, report.files_failed) == (1, 0), report.failures
    assert (tmp_path / "out.bin").read_bytes() == data
    assert not list(tmp_path.glob(f"*{PART_SUFFIX}"))
    ranged = [e for e in proxy.log if e.op == "get_blob"]
    assert len(ranged) == max(1, -(-size // (block_mb * MiB))) or size == 0
    assert all(e.headers.get("if-match") for e in ranged)  # every read pinned to one version


def test_prefix_into_folder_and_single_blob_naming(container: ContainerHandle, tmp_path: Path) -> None:
    files = {"run7/a.pt": b"a" * 10, "run7/sub dir/naïve.txt": b"b" * 20, "run8/c.pt": b"c"}
    for name, data in files.items():
        _put(container, name, data)
    report = _get(f"{container.url}/run7", tmp_path / "dl", tmp_path, recursive=True)
    assert report.files_transferred == 2  # the prefix's last segment is a level, as AzCopy makes it
    assert (tmp_path / "dl" / "run7" / "a.pt").read_bytes() == files["run7/a.pt"]
    assert (tmp_path / "dl" / "run7" / "sub dir" / "naïve.txt").read_bytes() == files["run7/sub dir/naïve.txt"]
    assert not (tmp_path / "dl" / "run7" / "c.pt").exists() and not (tmp_path / "dl" / "run8").exists()
    (tmp_path / "one").mkdir()
    _get(f"{container.url}/run8/c.pt", tmp_path / "one", tmp_path)  # existing folder: keeps the name
    _get(f"{container.url}/run8/c.pt", tmp_path / "named.pt", tmp_path)  # a file name
    assert (tmp_path / "one" / "c.pt").read_bytes() == b"c" and (tmp_path / "named.pt").read_bytes() == b"c"


def _args(url: str, dest: Path, journal: Path, *extra: str) -> list[str]:
    return ["cp", url, str(dest), "--journal", str(journal), "--block-size-mb", "1", "--put-blob-size-mb", "0",
            "--concurrency", str(CONCURRENCY), "--quiet", *extra]


def _distinct_ranges(proxy: FaultProxy) -> int:
    """Bytes of the distinct ranges the proxy delivered whole (by the range asked for)."""
    whole = {e.headers.get("x-ms-range") or e.headers.get("range"): e.response_bytes for e in proxy.log
             if e.op == "get_blob" and e.status == 206}
    return sum(whole.values())


@pytest.mark.parametrize("acked", [0, 7, BLOCKS - 3])
def test_sigkill_then_resume_fetches_only_the_remainder(
    acked: int, container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = random_file(tmp_path / "src.bin", SIZE, seed=acked)
    _put(container, "model.bin", data)
    dest = tmp_path / "out" / "model.bin"
    args = _args(f"{proxy.endpoint()}/{container.name}/model.bin", dest, tmp_path / "j.db")
    proxy.hold_after("get_blob", acked)
    kill_when_held(args, proxy)
    assert not dest.exists()  # never a partial file at the final name
    got = _distinct_ranges(proxy)  # a range fetched twice (retried under load) counts once
    proxy.reset_stats()
    second = run(args)
    assert second.returncode == 0, second.stderr
    fetched = _distinct_ranges(proxy)
    # Ranges received but not yet written and journaled when the process died are fetched again: at most the
    # download's window of them (engine/budget.Window: the request limit plus two ranges fetched ahead).
    ranges = [(e.status, e.response_bytes, e.headers.get("x-ms-range")) for e in proxy.log if e.op == "get_blob"]
    assert SIZE - got <= fetched <= SIZE - got + (CONCURRENCY + 2) * MiB, (got, fetched, ranges)
    assert dest.read_bytes() == data
    assert not list(dest.parent.glob(f"*{PART_SUFFIX}"))


def test_blob_changed_between_kill_and_resume_restarts(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    _put(container, "model.bin", random_file(tmp_path / "src.bin", SIZE, seed=1))
    dest = tmp_path / "model.bin"
    args = _args(f"{proxy.endpoint()}/{container.name}/model.bin", dest, tmp_path / "j.db")
    proxy.hold_after("get_blob", 9)
    kill_when_held(args, proxy)
    new = random_file(tmp_path / "src.bin", SIZE, seed=2)
    _put(container, "model.bin", new)  # same size, new ETag
    proxy.reset_stats()
    second = run(args)
    assert second.returncode == 0, second.stderr
    assert proxy.stats.bytes_out["get_blob"] == SIZE  # nothing of the old version was kept
    assert dest.read_bytes() == new


def test_wrong_stored_md5_fails_or_logs(container: ContainerHandle, tmp_path: Path) -> None:
    data = random_file(tmp_path / "src.bin", 3 * MiB, seed=5)
    _put(container, "bad.bin", data, md5=hashlib.md5(b"something else").digest())
    url = f"{container.url}/bad.bin"
    failed = run(["cp", url, str(tmp_path / "bad.bin"), "--journal", str(tmp_path / "j.db"), "--block-size-mb", "1"])
    assert failed.returncode == 4, failed.stderr
    assert "differs from the blob's Content-MD5" in failed.stdout
    assert not (tmp_path / "bad.bin").exists() and not list(tmp_path.glob(f"*{PART_SUFFIX}"))
    logged = run(["cp", url, str(tmp_path / "bad.bin"), "--journal", str(tmp_path / "j2.db"),
                  "--check-md5", "LogOnly"])
    assert logged.returncode == 0, logged.stderr
    assert "LogOnly" in logged.stderr and (tmp_path / "bad.bin").read_bytes() == data


def test_missing_md5_fails_only_when_asked(container: ContainerHandle, tmp_path: Path) -> None:
    container.client.get_blob_client("nomd5.bin").stage_block("YQ==", b"abc")
    container.client.get_blob_client("nomd5.bin").commit_block_list(["YQ=="])
    report = _get(f"{container.url}/nomd5.bin", tmp_path / "a.bin", tmp_path)
    assert report.files_transferred == 1
    report = _get(f"{container.url}/nomd5.bin", tmp_path / "b.bin", tmp_path,
                  check_md5=CheckMd5.FAIL_IF_DIFFERENT_OR_MISSING)
    assert report.files_failed == 1 and "no Content-MD5" in report.failures[0].reason
    assert not (tmp_path / "b.bin").exists()


def test_response_cut_mid_body_is_fetched_again(container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    data = random_file(tmp_path / "src.bin", 4 * MiB + 3, seed=7)
    _put(container, "f.bin", data)
    proxy.add_rule(Rule("get_blob", reset_mid_response(0.5), nth=2))
    report = _get(f"{proxy.endpoint()}/{container.name}/f.bin", tmp_path / "out.bin", tmp_path,
                  block_size_mb=1, put_blob_size_mb=0)
    assert report.files_transferred == 1 and report.retries == 1
    assert proxy.stats.requests["get_blob"] == 5 + 1
    assert (tmp_path / "out.bin").read_bytes() == data


def _put_unhashed(container: ContainerHandle, name: str, data: bytes) -> None:
    """Stored without a Content-MD5, as rclone's, AzCopy's and the SDK's chunked uploads leave a blob."""
    blob = container.client.get_blob_client(name)
    ids = []
    for at in range(0, len(data), 4 * MiB):
        ids.append(base64.b64encode(f"{at:012d}".encode()).decode())
        blob.stage_block(ids[-1], data[at:at + 4 * MiB])
    blob.commit_block_list(ids)
    assert blob.get_blob_properties().content_settings.content_md5 is None


def _ranges(proxy: FaultProxy) -> list[tuple[int, int]]:
    got = [e.headers["x-ms-range"].removeprefix("bytes=").split("-") for e in proxy.log if e.op == "get_blob"]
    return sorted((int(first), int(last)) for first, last in got)


SPANNED = 6 * 8 * MiB + 5  # six blocks of 8 MiB and one of 5 bytes; two requests in flight: spans of 4 and 3


def test_with_nothing_to_hash_one_get_spans_several_blocks(container: ContainerHandle, proxy: FaultProxy,
                                                          tmp_path: Path) -> None:
    data = random_file(tmp_path / "src.bin", SPANNED, seed=11)
    _put_unhashed(container, "big.bin", data)
    report = _get(f"{proxy.endpoint()}/{container.name}/big.bin", tmp_path / "out.bin", tmp_path, concurrency=2,
                  put_blob_size_mb=0)
    assert (report.files_transferred, report.files_failed) == (1, 0), report.failures
    assert (tmp_path / "out.bin").read_bytes() == data
    assert _ranges(proxy) == [(0, 32 * MiB - 1), (32 * MiB, SPANNED - 1)]  # two GETs, not seven
    assert all(e.headers.get("if-match") for e in proxy.log if e.op == "get_blob")


def test_a_span_cut_mid_body_goes_on_from_the_first_block_not_stored(container: ContainerHandle, proxy: FaultProxy,
                                                                     tmp_path: Path) -> None:
    data = random_file(tmp_path / "src.bin", SPANNED, seed=12)
    _put_unhashed(container, "big.bin", data)
    proxy.add_rule(Rule("get_blob", reset_mid_response(0.6), nth=1))
    report = _get(f"{proxy.endpoint()}/{container.name}/big.bin", tmp_path / "out.bin", tmp_path, concurrency=2,
                  put_blob_size_mb=0)
    assert report.files_transferred == 1 and report.retries == 1, report.failures
    assert (tmp_path / "out.bin").read_bytes() == data
    cut = next(e for e in proxy.log if e.op == "get_blob" and e.fault)
    first, last = (int(x) for x in cut.headers["x-ms-range"].removeprefix("bytes=").split("-"))
    # 60% of the cut span arrived: its whole blocks were stored, and the retry asks for the rest only.
    kept = int(0.6 * (last + 1 - first)) // (8 * MiB) * 8 * MiB
    assert kept >= 8 * MiB and (first + kept, last) in _ranges(proxy)
    assert sum(b + 1 - a for a, b in _ranges(proxy)) == SPANNED + (last + 1 - first - kept)  # nothing else again


def test_a_span_answered_with_other_bytes_stores_none_of_them(container: ContainerHandle, proxy: FaultProxy,
                                                              azurite: Azurite, tmp_path: Path) -> None:
    # The answer's headers are checked before any block of the span is stored: another range (or another version)
    # must never be journaled as this one's blocks, which a blob without a Content-MD5 could not catch later.
    data = random_file(tmp_path / "src.bin", SPANNED, seed=14)
    _put_unhashed(container, "big.bin", data)
    proxy.add_rule(Rule("get_blob", shift_range(8 * MiB), nth=1))  # a SAS: Shared Key would sign the range
    sas = container_sas(azurite.account, azurite.key, container.name)
    report = _get(f"{proxy.endpoint()}/{container.name}/big.bin?{sas}", tmp_path / "out.bin", tmp_path,
                  concurrency=2, put_blob_size_mb=0)
    assert report.files_transferred == 1, report.failures
    assert (tmp_path / "out.bin").read_bytes() == data


def test_a_killed_spanned_download_resumes_with_every_block_it_stored(container: ContainerHandle, proxy: FaultProxy,
                                                                      tmp_path: Path) -> None:
    data = random_file(tmp_path / "src.bin", SPANNED, seed=13)
    _put_unhashed(container, "big.bin", data)
    dest = tmp_path / "out" / "big.bin"
    args = ["cp", f"{proxy.endpoint()}/{container.name}/big.bin", str(dest), "--journal", str(tmp_path / "j.db"),
            "--put-blob-size-mb", "0", "--concurrency", "2", "--quiet"]
    proxy.hold_after("get_blob", 1)  # the second span's GET waits; the first goes through
    # Killed once the first span's four blocks are stored and journaled (the journal itself asked: under CPU load a
    # second after the bytes arrived was not always enough).
    kill_when_held(args, proxy, until=lambda: _journaled_blocks(tmp_path / "j.db") >= 4)
    assert not dest.exists()
    proxy.reset_stats()
    second = run(args)
    assert second.returncode == 0, second.stderr
    # The first span's blocks were not fetched again; the rest once (in two spans: two requests in flight).
    assert _ranges(proxy) == [(32 * MiB, 48 * MiB - 1), (48 * MiB, SPANNED - 1)]
    assert dest.read_bytes() == data


def _journaled_blocks(journal: Path) -> int:
    """How many blocks a running job's journal holds (read-only, beside the writer: WAL)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{journal}?mode=ro", uri=True)) as db:
            return int(db.execute("select count(*) from blocks").fetchone()[0])
    except sqlite3.Error:
        return 0  # not made yet


def test_malicious_names_are_refused_and_the_rest_continue(container: ContainerHandle, tmp_path: Path) -> None:
    for name in ("/abs.txt", "dir\\..\\..\\escape.txt", "C:/drive.txt", "fine/ok.txt"):
        container.client.upload_blob(name, b"x")
    names = {b.name for b in container.client.list_blobs()}
    done = run(["cp", "-r", container.url, str(tmp_path / "dl"), "--journal", str(tmp_path / "j.db")])
    assert done.returncode == 1
    assert (tmp_path / "dl" / container.name / "fine" / "ok.txt").read_bytes() == b"x"
    for name in names - {"fine/ok.txt"}:
        assert f"FAILED {name}" in done.stdout
    assert done.stdout.count("FAILED") == len(names) - 1
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and p.suffix == ".txt") == ["ok.txt"]


def test_blob_not_found_and_no_blob_name(container: ContainerHandle, tmp_path: Path) -> None:
    done = run(["cp", f"{container.url}/nope.bin", str(tmp_path / "x"), "--journal", str(tmp_path / "j.db")])
    assert done.returncode == 1 and "blob 'nope.bin' not found" in done.stderr and "Traceback" not in done.stderr
    done = run(["cp", container.url, str(tmp_path / "x"), "--journal", str(tmp_path / "j.db")])
    assert done.returncode == 2 and "names no blob" in done.stderr


def test_overwrite_false_and_preserved_mtime(container: ContainerHandle, tmp_path: Path) -> None:
    random_file(tmp_path / "src.bin", 100, seed=1)
    import os

    os.utime(tmp_path / "src.bin", ns=(1_600_000_000_500_000_000, 1_600_000_000_500_000_000))
    up = run(["cp", str(tmp_path / "src.bin"), f"{container.url}/", "--journal", str(tmp_path / "j.db")])
    assert up.returncode == 0, up.stderr
    report = _get(f"{container.url}/src.bin", tmp_path / "copy.bin", tmp_path, preserve_last_modified_time=True)
    assert report.files_transferred == 1
    assert (tmp_path / "copy.bin").stat().st_mtime_ns == 1_600_000_000_500_000_000
    (tmp_path / "copy.bin").write_bytes(b"local")
    report = _get(f"{container.url}/src.bin", tmp_path / "copy.bin", tmp_path, overwrite=blobsync.Overwrite.FALSE)
    assert report.files_skipped == 1 and (tmp_path / "copy.bin").read_bytes() == b"local"


def test_target_that_cannot_be_written_is_reported(container: ContainerHandle, tmp_path: Path) -> None:
    _put(container, "f.bin", b"data")
    (tmp_path / "a-file").write_bytes(b"")
    done = run(["cp", f"{container.url}/f.bin", str(tmp_path / "a-file" / "sub" / "f.bin"),
                "--journal", str(tmp_path / "j.db")])
    assert done.returncode == 1, done.stderr
    assert "FAILED f.bin" in done.stdout and "Not a directory" in done.stdout
    assert "Traceback" not in done.stderr


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB tmpfs, so that 'disk full' is real. Needs root (CI and this project's machines run as root)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)], capture_output=True,
                          check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_keeps_the_partial_file_and_resumes(
    container: ContainerHandle, proxy: FaultProxy, small_disk: Path, tmp_path: Path
) -> None:
    data = random_file(tmp_path / "src.bin", 4 * MiB, seed=11)
    _put(container, "big.bin", data)
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (3 * MiB))
    args = _args(f"{proxy.endpoint()}/{container.name}/big.bin", small_disk / "big.bin", tmp_path / "j.db")
    full = run(args)
    assert full.returncode == 1, (full.stdout, full.stderr)
    line = full.stderr.strip().splitlines()[-1]
    assert "disk full" in line and "run the same command again" in line and "Traceback" not in full.stderr
    assert not (small_disk / "big.bin").exists()
    assert (small_disk / f"big.bin{PART_SUFFIX}").exists()  # kept for the resume
    first = proxy.stats.bytes_out["get_blob"]
    filler.unlink()
    proxy.reset_stats()
    resumed = run(args)
    assert resumed.returncode == 0, resumed.stderr
    assert (small_disk / "big.bin").read_bytes() == data
    assert proxy.stats.bytes_out["get_blob"] < 4 * MiB or first == 0


def test_after_a_power_cut_only_fsynced_ranges_are_trusted(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    """Ranges written but not yet fsynced survive a killed process (page cache), not a reboot: the journal
    notes the boot they were written in, and a resume in another boot fetches them again."""
    import sqlite3

    data = random_file(tmp_path / "src.bin", SIZE, seed=11)
    _put(container, "model.bin", data)
    dest = tmp_path / "out" / "model.bin"
    args = _args(f"{proxy.endpoint()}/{container.name}/model.bin", dest, tmp_path / "j.db", "--cap-mbps", "40")
    proxy.hold_after("get_blob", 20)  # ~4 s at 5 MB/s: at least one fdatasync (every 2 s) happened
    kill_when_held(args, proxy)
    with sqlite3.connect(tmp_path / "j.db") as db:
        synced, unsynced = db.execute(
            "select coalesce(sum(case when boot is null then size end), 0), "
            "coalesce(sum(case when boot is not null then size end), 0) from blocks").fetchone()
    assert synced > 0 and unsynced > 0, (synced, unsynced)
    proxy.reset_stats()
    second = run(args[:-2], env={"BLOBSYNC_BOOT_ID": "a-later-boot"})
    assert second.returncode == 0, second.stderr
    assert proxy.stats.bytes_out["get_blob"] == SIZE - synced  # everything not known to be on disk
    assert dest.read_bytes() == data


def test_a_blob_without_md5_moves_bytes_only_and_fails_before_any_byte_when_asked(
        container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    """No stored Content-MD5 (rclone's, AzCopy's and the SDK's chunked uploads): nothing to compare a whole-file
    MD5 with, so none is computed (the record holds none); FailIfDifferentOrMissing refuses it before a GET."""
    data = random_file(tmp_path / "src.bin", 5 * MiB + 11, seed=9)
    blob = container.client.get_blob_client("plain.bin")  # staged blocks and a list: no Content-MD5 is stored
    ids = [base64.b64encode(f"{i:08d}".encode()).decode() for i in range(0, len(data), MiB)]
    for block_id, at in zip(ids, range(0, len(data), MiB), strict=True):
        blob.stage_block(block_id, data[at:at + MiB])
    blob.commit_block_list(ids)
    assert container.client.get_blob_client("plain.bin").get_blob_properties().content_settings.content_md5 is None
    url = f"{proxy.endpoint()}/{container.name}/plain.bin"
    report = _get(url, tmp_path / "a.bin", tmp_path, block_size_mb=1)
    assert report.files_transferred == 1 and report.written[0].content_md5 is None
    assert (tmp_path / "a.bin").read_bytes() == container.download("plain.bin") == data
    proxy.reset_stats()
    refused = _get(url, tmp_path / "b.bin", tmp_path, check_md5=CheckMd5.FAIL_IF_DIFFERENT_OR_MISSING)
    assert refused.files_failed == 1 and "no Content-MD5" in refused.failures[0].reason
    assert proxy.stats.requests["get_blob"] == 0 and not (tmp_path / "b.bin").exists()
    _put(container, "with.bin", data)  # a stored MD5: checked, and the record holds it
    report = _get(f"{container.url}/with.bin", tmp_path / "c.bin", tmp_path, block_size_mb=1)
    assert report.written[0].content_md5 == hashlib.md5(data).digest()


def test_a_download_killed_after_its_rename_but_before_its_record_is_not_fetched_again(
        container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    from support.proxy import hold

    big = random_file(tmp_path / "big.bin", 6 * MiB + 5, seed=3)
    _put(container, "d/big.bin", big)
    _put(container, "d/z.bin", b"last")
    dest = tmp_path / "out"
    args = ["cp", "-r", "--as-subdir=false", f"{proxy.endpoint()}/{container.name}/d", str(dest), "--journal",
            str(tmp_path / "j.db"), "--block-size-mb", "1", "--check-md5", "NoCheck", "--quiet"]
    proxy.add_rule(Rule("get_blob", hold(), blob="d/z.bin"))  # the job stays up while big.bin finishes
    # Killed once big.bin is at its final name: its record is queued, not yet in the journal's file.
    kill_when_held(args, proxy, until=lambda: (dest / "big.bin").exists(), linger=0.1)
    proxy.reset_stats()
    second = run(args)
    assert second.returncode == 0, second.stderr
    assert sum(e.response_bytes for e in proxy.log if e.blob == "d/big.bin" and e.op == "get_blob") == 0
    assert (dest / "big.bin").read_bytes() == big == container.download("d/big.bin")
    assert (dest / "z.bin").read_bytes() == b"last"
