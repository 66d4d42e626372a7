"""Delta uploads against Azurite: only changed blocks travel (bytes counted by the proxy), and every result is
byte-identical with a correct Content-MD5 when downloaded independently."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote

import pytest
from azure.storage.blob import ContainerSasPermissions, generate_container_sas

import blobsync
from blobsync import TransferConfig
from blobsync.cli.output import summary
from blobsync.config import MiB
from conftest import ContainerHandle
from support.azurite import Azurite
from support.cli import kill_when_held, random_file, run, start
from support.proxy import FaultProxy, Rule, hold, reset_after


def _sync(src: Path, url: str, journal: Path, *extra: str) -> dict[str, object]:
    done = run(["sync", str(src), url, "--journal", str(journal), "--output-type", "json", *extra], timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def _sent(proxy: FaultProxy) -> int:
    return proxy.stats.bytes_in["put_block"] + proxy.stats.bytes_in["put_blob"]


def _check_blob(container: ContainerHandle, name: str, data: bytes) -> None:
    """Independent read-back (plain SDK, straight to Azurite): bytes, and the stored Content-MD5."""
    assert container.download(name) == data
    props = container.client.get_blob_client(name).get_blob_properties()
    assert bytes(props.content_settings.content_md5) == hashlib.md5(data).digest()


def _committed_ids(container: ContainerHandle, name: str) -> list[str]:
    committed, _ = container.client.get_blob_client(name).get_block_list("committed")
    return [b.id for b in committed]


def test_in_place_edit_of_256_mib_resends_only_the_two_touched_blocks(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "ckpt"
    size = 256 * MiB
    block = 8 * MiB  # the default block size
    data = bytearray(random_file(src / "model.pt", size, seed=1))
    url = f"{proxy.endpoint()}/{container.name}/run7"
    first = _sync(src, url, tmp_path / "j.db")
    assert first["bytes_sent"] == size and first["bytes_delta"] == 0
    before = _committed_ids(container, "run7/model.pt")

    # 1 MiB rewritten across the boundary of blocks 12 and 13, in place (same size, new mtime).
    offset = 13 * block - MiB // 2
    patch = random_file(tmp_path / "patch", MiB, seed=2)
    data[offset:offset + MiB] = patch
    with open(src / "model.pt", "r+b") as f:
        f.seek(offset)
        f.write(patch)
    proxy.reset_stats()
    second = _sync(src, url, tmp_path / "j.db")
    assert _sent(proxy) == 2 * block  # the two touched blocks, nothing else
    assert second["bytes_sent"] == 2 * block and second["bytes_delta"] == size - 2 * block
    assert proxy.stats.requests["put_block"] == 2
    commit = next(e for e in proxy.log if e.op == "put_block_list")
    assert commit.headers.get("if-match"), "a delta commit must be conditional on the version it builds on"
    after = _committed_ids(container, "run7/model.pt")
    assert len({len(bid) for bid in after}) == 1  # Azure's rule: every ID of a blob has one length
    unchanged = [i for i in range(size // block) if i not in (12, 13)]
    assert all(after[i] == before[i] for i in unchanged)  # reused by ID, as committed
    assert after[12] != before[12] and after[13] != before[13]
    _check_blob(container, "run7/model.pt", bytes(data))

    proxy.reset_stats()
    third = _sync(src, url, tmp_path / "j.db")
    assert third["files_transferred"] == 0 and _sent(proxy) == 0


def test_append_resends_the_last_partial_block_and_the_new_data(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "logs"
    block = 4 * MiB
    size = 30 * MiB + 123_456  # 7 full blocks and a partial one
    data = random_file(src / "train.log", size, seed=3)
    url = f"{proxy.endpoint()}/{container.name}"
    journal = tmp_path / "j.db"
    _sync(src, url, journal, "--block-size-mb", "4")

    tail = random_file(tmp_path / "tail", 10 * MiB, seed=4)
    with open(src / "train.log", "ab") as f:
        f.write(tail)
    proxy.reset_stats()
    report = _sync(src, url, journal, "--block-size-mb", "4")
    partial = size - 7 * block
    assert _sent(proxy) == 10 * MiB + partial  # at most 10 MiB plus one block, as the issue asks
    assert report["bytes_delta"] == 7 * block
    _check_blob(container, "train.log", data + tail)


def test_block_size_stays_stable_across_versions(container: ContainerHandle, proxy: FaultProxy,
                                                 tmp_path: Path) -> None:
    """A later run with another --block-size-mb keeps the committed block size so blocks still line up."""
    src = tmp_path / "d"
    data = bytearray(random_file(src / "a.bin", 6 * MiB, seed=5))
    url = f"{proxy.endpoint()}/{container.name}"
    _sync(src, url, tmp_path / "j.db", "--block-size-mb", "1")
    data[3 * MiB + 10] ^= 0xFF
    (src / "a.bin").write_bytes(data)
    proxy.reset_stats()
    report = _sync(src, url, tmp_path / "j.db", "--block-size-mb", "2")
    assert _sent(proxy) == MiB and report["bytes_delta"] == 5 * MiB
    sizes = [b.size for b in container.client.get_blob_client("a.bin").get_block_list("committed")[0]]
    assert sizes == [MiB] * 6
    _check_blob(container, "a.bin", bytes(data))


def test_blob_written_by_someone_else_gets_a_full_upload(container: ContainerHandle, proxy: FaultProxy,
                                                         tmp_path: Path) -> None:
    src = tmp_path / "d"
    data = bytearray(random_file(src / "m.bin", 8 * MiB, seed=6))
    url = f"{proxy.endpoint()}/{container.name}"
    _sync(src, url, tmp_path / "j.db", "--block-size-mb", "1")
    # Another writer replaces the blob: the journal's ETag no longer matches, so nothing of it is trusted.
    container.client.get_blob_client("m.bin").upload_blob(bytes(data[:7 * MiB]), overwrite=True)
    data[0] ^= 0xFF
    (src / "m.bin").write_bytes(data)
    proxy.reset_stats()
    report = _sync(src, url, tmp_path / "j.db", "--block-size-mb", "1")
    assert _sent(proxy) == len(data) and report["bytes_delta"] == 0
    _check_blob(container, "m.bin", bytes(data))


def test_blob_committed_by_someone_else_during_a_delta_falls_back_to_a_full_upload(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "d"
    data = bytearray(random_file(src / "m.bin", 8 * MiB, seed=7))
    url = f"{proxy.endpoint()}/{container.name}"
    args = ["sync", str(src), url, "--journal", str(tmp_path / "j.db"), "--block-size-mb", "1",
            "--output-type", "json"]
    assert run(args).returncode == 0
    data[5 * MiB] ^= 0xFF
    (src / "m.bin").write_bytes(data)
    proxy.reset_stats()
    proxy.add_rule(Rule("put_block_list", hold, times=1))
    proc = start(args)
    try:
        proxy.wait_for_held(1, timeout=120)
        # The delta's changed block is staged; now someone else commits the blob before we do.
        container.client.get_blob_client("m.bin").upload_blob(b"someone else's version", overwrite=True)
    finally:
        proxy.release_holds()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    statuses = [e.status for e in proxy.log if e.op == "put_block_list"]
    assert statuses == [412, 201]  # the conditional delta commit was refused, the full one went through
    # Every block went over the wire (the changed one possibly twice, had the service discarded it).
    assert len(data) <= _sent(proxy) <= len(data) + MiB
    assert json.loads(out.splitlines()[-1])["bytes_delta"] == 0
    _check_blob(container, "m.bin", bytes(data))


def test_cp_over_a_blob_blobsync_committed_is_a_delta_too(container: ContainerHandle, proxy: FaultProxy,
                                                           tmp_path: Path) -> None:
    """The library's copy() (a training loop pushing the same checkpoint name) reuses unchanged blocks."""
    path = tmp_path / "last.pt"
    data = bytearray(random_file(path, 5 * MiB + 17, seed=8))
    url = f"{proxy.endpoint()}/{container.name}/run7/last.pt"
    config = TransferConfig.from_mib(block_size_mb=1, journal_path=tmp_path / "j.db")
    env: dict[str, str] = {}  # the emulator's well-known key, through the proxy
    assert blobsync.copy(path, url, config, env=env).bytes_sent == len(data)
    data[2 * MiB: 2 * MiB + 3] = b"new"
    path.write_bytes(data)
    proxy.reset_stats()
    report = blobsync.copy(path, url, config, env=env)
    assert report.ok and report.bytes_sent == MiB == _sent(proxy)
    assert report.bytes_delta == len(data) - MiB
    assert "4.00 MiB reused by delta (unchanged blocks)" in summary(report)
    _check_blob(container, "run7/last.pt", bytes(data))
    ids = _committed_ids(container, "run7/last.pt")
    nonces = [bid.split("-")[0] for bid in ids]  # the SDK hands back the decoded IDs
    assert nonces[2] != nonces[0] == nonces[1] == nonces[3]  # only the changed block has the new nonce


def test_small_file_put_blob_forgets_the_block_list(container: ContainerHandle, proxy: FaultProxy,
                                                    tmp_path: Path) -> None:
    """A version sent in one Put Blob has no blocks to reuse; the next large version is a full upload."""
    src = tmp_path / "d"
    random_file(src / "x.bin", 3 * MiB, seed=9)
    url = f"{proxy.endpoint()}/{container.name}"
    _sync(src, url, tmp_path / "j.db", "--block-size-mb", "1")
    small = random_file(src / "x.bin", 1000, seed=10)
    _sync(src, url, tmp_path / "j.db", "--block-size-mb", "1")
    _check_blob(container, "x.bin", small)
    big = random_file(src / "x.bin", 3 * MiB, seed=9)  # the first version's bytes again
    proxy.reset_stats()
    report = _sync(src, url, tmp_path / "j.db", "--block-size-mb", "1")
    assert _sent(proxy) == 3 * MiB and report["bytes_delta"] == 0
    _check_blob(container, "x.bin", big)


def test_killed_delta_upload_resumes_sending_only_the_changed_blocks_still_missing(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "d"
    data = bytearray(random_file(src / "m.bin", 16 * MiB, seed=11))
    url = f"{proxy.endpoint()}/{container.name}"
    args = ["sync", str(src), url, "--journal", str(tmp_path / "j.db"), "--block-size-mb", "1",
            "--concurrency", "2", "--output-type", "json"]
    assert run(args).returncode == 0
    changed = [1, 4, 7, 9, 12, 15]
    for idx in changed:
        data[idx * MiB + 100] ^= 0xFF
    (src / "m.bin").write_bytes(data)
    proxy.reset_stats()
    proxy.hold_after("put_block", 3)
    kill_when_held(args, proxy)
    assert proxy.stats.ok("put_block") == 3
    proxy.reset_stats()
    second = run(args)
    assert second.returncode == 0, second.stderr
    assert _sent(proxy) == (len(changed) - 3) * MiB  # the other unchanged blocks were never sent at all
    report = json.loads(second.stdout.splitlines()[-1])
    assert report["bytes_delta"] == (16 - len(changed)) * MiB
    _check_blob(container, "m.bin", bytes(data))


def test_delta_with_a_sas_url_keeps_no_secret_in_the_journal(azurite: Azurite, container: ContainerHandle,
                                                             tmp_path: Path) -> None:
    src = tmp_path / "d"
    data = bytearray(random_file(src / "m.bin", 4 * MiB, seed=12))
    sas = generate_container_sas(azurite.account, container.name, account_key=azurite.key,
                                 permission=ContainerSasPermissions.from_string("racwl"),
                                 expiry=datetime.now(UTC) + timedelta(hours=1))
    url = f"{container.url}?{sas}"
    journal = tmp_path / "j.db"
    _sync(src, url, journal, "--block-size-mb", "1")
    data[10] ^= 0xFF
    (src / "m.bin").write_bytes(data)
    report = _sync(src, url, journal, "--block-size-mb", "1")
    assert report["bytes_sent"] == MiB and report["bytes_delta"] == 3 * MiB
    _check_blob(container, "m.bin", bytes(data))
    with sqlite3.connect(journal) as db:
        assert db.execute("select container, blob from committed_blobs").fetchall() == [(container.url, "m.bin")]
    raw_sig = sas.split("sig=")[1].split("&")[0]
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("j.db*"))
    assert raw_sig.encode() not in stored and unquote(raw_sig).encode() not in stored


def test_delta_commit_whose_answer_was_lost_is_recognised_as_ours(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    """The commit lands but the connection drops before the answer: the retry meets its own If-Match (412)."""
    src = tmp_path / "d"
    data = bytearray(random_file(src / "m.bin", 6 * MiB, seed=13))
    url = f"{proxy.endpoint()}/{container.name}"
    _sync(src, url, tmp_path / "j.db", "--block-size-mb", "1")
    data[4 * MiB + 1] ^= 0xFF
    (src / "m.bin").write_bytes(data)
    proxy.reset_stats()
    proxy.add_rule(Rule("put_block_list", reset_after, times=1))
    report = _sync(src, url, tmp_path / "j.db", "--block-size-mb", "1")
    commits = [(e.status, e.fault) for e in proxy.log if e.op == "put_block_list"]
    assert commits == [(201, "reset_after"), (412, None)]  # applied but unanswered, then refused: it was ours
    assert _sent(proxy) == MiB and report["bytes_delta"] == 5 * MiB  # no needless full upload
    _check_blob(container, "m.bin", bytes(data))
    proxy.reset_stats()  # and the journal holds the version that landed: the next edit is a delta again
    data[0] ^= 0xFF
    (src / "m.bin").write_bytes(data)
    assert _sync(src, url, tmp_path / "j.db", "--block-size-mb", "1")["bytes_delta"] == 5 * MiB
    _check_blob(container, "m.bin", bytes(data))


@pytest.mark.parametrize("where", [["--processes", "2"], ["--cluster", "local:2"]], ids=["processes", "cluster"])
def test_workers_send_only_the_changed_blocks_of_split_and_whole_files(
        where: list[str], container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    """A delta on workers: a file split over them (72 MiB: its ranges on both) and one in a shard (12 MiB) each
    send the block an edit touched; the records come back to the client's journal for the next run."""
    src, block = tmp_path / "src", 8 * MiB
    big = bytearray(random_file(src / "big.bin", 9 * block, seed=4))
    small = bytearray(random_file(src / "small.bin", 12 * MiB, seed=5))
    url = f"{proxy.endpoint()}/{container.name}/w"
    first = _sync(src, url, tmp_path / "j.db", *where)
    assert first["bytes_sent"] == len(big) + len(small)
    before = _committed_ids(container, "w/big.bin")
    for name, data, offset in (("big.bin", big, 3 * block + 100), ("small.bin", small, block + 5)):
        patch = random_file(tmp_path / "patch", 1000, seed=offset)
        data[offset:offset + 1000] = patch
        with open(src / name, "r+b") as f:
            f.seek(offset)
            f.write(patch)
    proxy.reset_stats()
    second = _sync(src, url, tmp_path / "j.db", *where)
    assert _sent(proxy) == block + (len(small) - block), proxy.stats.bytes_in  # one block of each file
    assert second["bytes_delta"] == len(big) - block + block
    after = _committed_ids(container, "w/big.bin")
    assert [i for i in range(9) if after[i] != before[i]] == [3]  # the others named again, as committed
    _check_blob(container, "w/big.bin", bytes(big))
    _check_blob(container, "w/small.bin", bytes(small))
    proxy.reset_stats()
    plain = _sync(src, url, tmp_path / "j.db")  # the plain job finds what the workers recorded: nothing to send
    assert plain["files_transferred"] == 0 and _sent(proxy) == 0


def test_a_split_delta_over_a_blob_someone_else_replaced_sends_the_whole_file(
        container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    src, block = tmp_path / "src", 8 * MiB
    data = bytearray(random_file(src / "big.bin", 9 * block, seed=6))
    url = f"{proxy.endpoint()}/{container.name}/w"
    _sync(src, url, tmp_path / "j.db", "--processes", "2")
    container.client.upload_blob("w/big.bin", b"another writer's bytes", overwrite=True)
    data[5:10] = b"edits"
    (src / "big.bin").write_bytes(data)
    proxy.reset_stats()
    _sync(src, url, tmp_path / "j.db", "--processes", "2")
    assert _sent(proxy) == len(data)  # the blocks the record named are gone with the version they were in
    _check_blob(container, "w/big.bin", bytes(data))


def test_each_range_task_of_a_split_file_carries_only_its_windows_commit_record() -> None:
    import pickle

    from blobsync.cluster.shards import Sizing, cut
    from blobsync.cluster.spec import WorkerJob
    from blobsync.engine.delta import DeltaBase
    from blobsync.jobs.ops import FileOp, OpKind
    from blobsync.journal import CommittedBlob

    n, block = 20_000, MiB
    record = CommittedBlob(block, '"0x1"', n * block, None,
                           tuple((f"id-{i:08d}", block, bytes(16)) for i in range(n)))
    op = FileOp(OpKind.UPLOAD, "big.bin", "big.bin", n * block, 0, nonce="abc", delta=record)
    job = WorkerJob("j", True, "/data", "https://a.blob.core.windows.net/c", {})
    split = next(iter(cut([op], job, Sizing(64 * MiB, 10, 4), block_size_of=lambda f: block, split=True)))
    ranges = split.ranges  # type: ignore[union-attr]
    assert len(ranges) > 8
    whole = len(pickle.dumps(record))
    for r in ranges:
        assert len(pickle.dumps(r)) < whole / 4  # the window's blocks, the rest one shared hole
        base = DeltaBase(r.file.delta.block_size, r.file.delta.etag, r.file.delta.blocks)
        assert all(base.block_at(i, block) == (f"id-{i:08d}", bytes(16)) for i in range(r.first, r.last))
