"""Blob to blob (issue 30): `cp URL URL` between two accounts of one Azurite, the service moving the bytes (Copy Blob
From URL for small blobs, Put Block From URL ranges for large ones, journaled per block and resumed after a
SIGKILL), properties carried, the fallback through this machine when the service cannot reach the source, and
the source's SAS kept out of everything but the copy request. Every blob checked with an SDK download."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from azure.storage.blob import (
    BlobServiceClient,
    ContentSettings,
    StandardBlobTier,
)

from blobsync.config import MiB
from conftest import Side, container_sas
from support.azurite import Azurite
from support.cli import kill_when_held, run
from support.proxy import FaultProxy, Rule, reset_after, respond


def _journal_text(path: Path) -> str:
    with sqlite3.connect(path) as db:
        return "\n".join(str(row) for table in ("jobs", "files", "blocks")
                         for row in db.execute(f"select * from {table}"))


def test_cp_between_accounts_lets_the_service_move_the_bytes_and_keeps_the_properties(
        source: Side, dest: Side, proxy: FaultProxy, tmp_path: Path) -> None:
    small, big = os.urandom(3000), os.urandom(10 * MiB + 17)
    source.client.upload_blob("run/a.txt", small, metadata={"owner": "ml"}, tags={"stage": "raw"},
                              content_settings=ContentSettings(content_type="text/plain", cache_control="max-age=9"))
    source.client.upload_blob("run/sub/w.bin", big, standard_blob_tier=StandardBlobTier.COOL, tags={"k": "v 1"})
    source.client.upload_blob("other.txt", b"not under run/")
    ep = proxy.url
    journal = tmp_path / "j.db"
    out = run(["cp", source.url(ep, "run"), dest.url(ep, "copies"), "-r", "--block-size-mb", "4",
               "--s2s-preserve-blob-tags", "--journal", str(journal)])
    assert out.returncode == 0, out.stderr
    assert dest.download("copies/run/a.txt") == small and dest.download("copies/run/sub/w.bin") == big
    assert sorted(b.name for b in dest.client.list_blobs()) == ["copies/run/a.txt", "copies/run/sub/w.bin"]
    a = dest.client.get_blob_client("copies/run/a.txt").get_blob_properties()
    assert (a.content_settings.content_type, a.content_settings.cache_control, a.metadata) == (
        "text/plain", "max-age=9", {"owner": "ml"})
    w = dest.client.get_blob_client("copies/run/sub/w.bin").get_blob_properties()
    assert w.blob_tier == "Cool"
    assert dest.client.get_blob_client("copies/run/a.txt").get_blob_tags() == {"stage": "raw"}  # in the copy
    assert dest.client.get_blob_client("copies/run/sub/w.bin").get_blob_tags() == {"k": "v 1"}  # at the commit
    stats = proxy.stats
    assert stats.ok("copy_blob") == 1  # the small blob: one Copy Blob From URL
    assert stats.ok("put_block_from_url") == 3  # 10 MiB in 4 MiB ranges, read by the service
    assert stats.ok("put_block_list") == 1
    assert stats.requests["get_blob"] == 0 and stats.requests["put_block"] == 0  # no byte through this machine
    assert source.sas.split("sig=")[1][:10] not in out.stdout + out.stderr  # the source's SAS is not shown
    source_sig = source.sas.split("sig=")[1].split("&")[0]
    copies = 0
    for entry in proxy.log:  # a request to the destination carries the source's SAS in x-ms-copy-source alone
        if entry.container == dest.name:
            carried = [k for k, v in entry.headers.items() if source_sig in v]
            assert carried in ([], ["x-ms-copy-source"]), (entry.op, carried)
            assert all(source_sig not in v for v in entry.query.values())
            copies += carried == ["x-ms-copy-source"]
    assert copies == 4  # the one Copy Blob From URL and the three Put Block From URL
    text = _journal_text(journal)
    assert "sig=" not in text and source.sas not in text


def test_a_killed_copy_resumes_with_only_the_missing_ranges(
        source: Side, dest: Side, proxy: FaultProxy, tmp_path: Path) -> None:
    big = os.urandom(24 * MiB)
    source.client.upload_blob("big.bin", big)
    ep = proxy.url
    args = ["cp", source.url(ep, "big.bin"), dest.url(ep, "big.bin"), "--block-size-mb", "2", "--concurrency", "4",
            "--journal", str(tmp_path / "j.db")]
    proxy.hold_after("put_block_from_url", 6)
    kill_when_held(args, proxy)
    first = proxy.stats.ok("put_block_from_url")
    assert first == 6 and dest.client.get_blob_client("big.bin").exists() is False
    proxy.reset_stats()
    out = run(args)
    assert out.returncode == 0, out.stderr
    assert proxy.stats.ok("put_block_from_url") == 12 - first  # only the ranges the first run did not stage
    assert dest.download("big.bin") == big


def test_when_the_service_cannot_reach_the_source_the_bytes_go_through_this_machine(
        dest: Side, tmp_path: Path) -> None:
    """The source is on another Azurite the destination's cannot read from (CannotVerifyCopySource): the copy says
    so on one line and streams through here, with the blocks checked and the whole MD5 compared."""
    small, big = os.urandom(2000), os.urandom(9 * MiB + 3)
    with Azurite() as other:
        service = BlobServiceClient.from_connection_string(other.connection_string)
        box = service.create_container("far")
        box.upload_blob("f/small.txt", small, content_settings=ContentSettings(content_type="text/csv"))
        box.upload_blob("f/big.bin", big)
        far = Side(other.account, "far", container_sas(other.account, other.key, "far"), box)
        dest_endpoint = dest.client.url.rsplit("/", 2)[0]
        out = run(["cp", far.url(other.base_url + "", "f/*"), dest.url(dest_endpoint, "in/"),
                   "--block-size-mb", "4", "--journal", str(tmp_path / "j.db")])
    assert out.returncode == 0, out.stderr
    assert "the service could not read the copy source" in out.stderr
    assert "through this machine" in out.stderr + out.stdout
    assert dest.download("in/small.txt") == small and dest.download("in/big.bin") == big
    props = dest.client.get_blob_client("in/small.txt").get_blob_properties()
    assert props.content_settings.content_type == "text/csv"


def test_bad_blob_to_blob_arguments_get_one_line(source: Side, dest: Side, azurite: Azurite, tmp_path: Path) -> None:
    ep = azurite.base_url
    source.client.upload_blob("dir/x.txt", b"x")
    journal = ["--journal", str(tmp_path / "j.db")]
    missing = run(["cp", source.url(ep, "nope.txt"), dest.url(ep), *journal])
    assert missing.returncode != 0 and "not found" in missing.stderr and "Traceback" not in missing.stderr
    folder = run(["cp", source.url(ep, "dir"), dest.url(ep), *journal])
    assert folder.returncode == 2 and "-r" in folder.stderr and "Traceback" not in folder.stderr
    contradicted = run(["cp", source.url(ep, "dir/x.txt"), dest.url(ep), "--from-to", "LocalBlob", *journal])
    assert contradicted.returncode == 2 and "copy between two URLs" in contradicted.stderr
    assert dest.client.get_blob_client("x.txt").exists() is False


def test_sync_between_accounts_copies_what_differs_and_deletes_only_when_asked(
        source: Side, dest: Side, proxy: FaultProxy, tmp_path: Path) -> None:
    files = {"a.txt": os.urandom(100), "sub/b.bin": os.urandom(6 * MiB + 1), "c.txt": b"c"}
    for name, data in files.items():
        source.client.upload_blob(f"data/{name}", data)
    dest.client.upload_blob("mirror/orphan.txt", b"only here")
    ep = proxy.url
    args = ["sync", source.url(ep, "data"), dest.url(ep, "mirror"), "--block-size-mb", "4",
            "--journal", str(tmp_path / "j.db")]
    first = run(args)
    assert first.returncode == 0, first.stderr
    for name, data in files.items():
        assert dest.download(f"mirror/{name}") == data
    assert dest.download("mirror/orphan.txt") == b"only here"  # no --delete-destination: kept
    assert proxy.stats.requests["get_blob"] == 0  # the service moved every byte
    proxy.reset_stats()
    again = run(args)
    assert again.returncode == 0, again.stderr
    stats = proxy.stats
    assert stats.requests["copy_blob"] == 0 and stats.requests["put_block_from_url"] == 0  # all in sync
    source.client.upload_blob("data/c.txt", b"changed", overwrite=True)
    proxy.reset_stats()
    third = run([*args, "--delete-destination", "true"])
    assert third.returncode == 0, third.stderr
    assert proxy.stats.ok("copy_blob") == 1  # only the changed blob
    assert dest.download("mirror/c.txt") == b"changed"
    assert sorted(b.name for b in dest.client.list_blobs()) == sorted(f"mirror/{n}" for n in files)


def test_a_copy_through_faults_retries_to_the_right_bytes(source: Side, dest: Side, proxy: FaultProxy,
                                                          tmp_path: Path) -> None:
    """Throttled ranges are staged again, a copy whose answer was lost is asked again; exit 0 means the bytes."""
    small, big = os.urandom(5000), os.urandom(10 * MiB + 3)
    source.client.upload_blob("f/small.bin", small)
    source.client.upload_blob("f/big.bin", big)
    proxy.add_rule(Rule("put_block_from_url", respond(503, "ServerBusy", retry_after=0), nth={2, 3}))
    proxy.add_rule(Rule("copy_blob", reset_after(), nth={1}))  # the service copied; its answer never came back
    for overwrite in ("true", "false"):
        out = run(["cp", "-r", source.url(proxy.url, "f"), dest.url(proxy.url, overwrite), "--block-size-mb", "4",
                   "--overwrite", overwrite, "--journal", str(tmp_path / f"{overwrite}.db")])
        assert out.returncode == 0, (overwrite, out.stderr)
        assert dest.download(f"{overwrite}/f/small.bin") == small and dest.download(f"{overwrite}/f/big.bin") == big
        proxy.clear_rules()
        proxy.add_rule(Rule("copy_blob", reset_after(), nth={1}))


def test_a_copy_on_worker_processes_keeps_what_the_plain_copy_keeps(source: Side, dest: Side, azurite: Azurite,
                                                                   tmp_path: Path) -> None:
    """--processes runs the operations the plain job makes (one FileOp): the same bytes and the source's tier land,
    for a blob copied in one request and one staged in ranges."""
    small, big = os.urandom(3000), os.urandom(6 * MiB + 5)
    source.client.upload_blob("run/a.bin", small, standard_blob_tier=StandardBlobTier.COOL)
    source.client.upload_blob("run/w.bin", big, standard_blob_tier=StandardBlobTier.COOL)
    ep = azurite.base_url
    out = run(["cp", source.url(ep, "run"), dest.url(ep, "copies"), "-r", "--block-size-mb", "4",
               "--processes", "2", "--journal", str(tmp_path / "j.db")])
    assert out.returncode == 0, out.stderr
    for name, data in (("a.bin", small), ("w.bin", big)):
        assert dest.download(f"copies/run/{name}") == data
        props = dest.client.get_blob_client(f"copies/run/{name}").get_blob_properties()
        assert props.blob_tier == "Cool", name


def test_leftover_blocks_at_the_destination_do_not_break_a_service_copy(source: Side, dest: Side, azurite: Azurite,
                                                                       tmp_path: Path) -> None:
    big = os.urandom(9 * MiB + 5)
    source.client.upload_blob("w.bin", big)
    left = dest.client.get_blob_client("w.bin")
    left.stage_block("eA==", b"stale")  # another tool's aborted upload: a block ID of another length
    out = run(["cp", source.url(azurite.base_url, "w.bin"), dest.url(azurite.base_url, "w.bin"), "--block-size-mb", "4",
               "--journal", str(tmp_path / "j.db")])
    assert out.returncode == 0, out.stderr
    assert dest.download("w.bin") == big
    assert left.get_block_list("uncommitted")[1] == []
