"""Crash and resume: a real blobsync process is SIGKILLed (or interrupted) mid-upload, then run again."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import pytest

from blobsync.config import MiB
from conftest import ContainerHandle
from support.cli import kill_when_held, random_file, run, start
from support.proxy import FaultProxy

BLOCKS = 24
SIZE = BLOCKS * MiB - 1000  # the last block is short
CONCURRENCY = 4


def _args(src: Path, url: str, journal: Path) -> list[str]:
    return ["cp", str(src), url, "--journal", str(journal), "--block-size-mb", "1",
            "--concurrency", str(CONCURRENCY), "--quiet"]


@pytest.mark.parametrize(
    ("hold_op", "count", "acked_blocks"),
    [
        ("put_block", 0, 0),  # killed before any block arrived
        ("put_block", 2, 2),  # early
        ("put_block", 15, 15),  # past the middle
        ("put_block", BLOCKS, BLOCKS),  # every block staged, killed before Put Block List
        ("put_block_list", 1, BLOCKS),  # committed, killed before verification and the journal update
    ],
)
def test_sigkill_then_resume_sends_only_the_remainder(
    hold_op: str, count: int, acked_blocks: int, container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = random_file(tmp_path / "model.bin", SIZE, seed=count)
    args = _args(tmp_path / "model.bin", f"{proxy.endpoint()}/{container.name}/model.bin", tmp_path / "j.db")
    proxy.hold_after(hold_op, count)
    kill_when_held(args, proxy)
    assert proxy.stats.ok("put_block") == acked_blocks
    # Blocks are staged concurrently, so which ones arrived is read from the proxy, not assumed.
    acked_bytes = sum(e.request_bytes for e in proxy.log if e.op == "put_block" and e.status == 201)

    proxy.reset_stats()
    second = run(args)
    assert second.returncode == 0, second.stderr
    remainder = SIZE - acked_bytes
    sent = proxy.stats.bytes_in["put_block"]
    assert sent <= remainder + CONCURRENCY * MiB
    assert sent == remainder  # hold_after let exactly `acked_blocks` through, and only those are skipped
    assert proxy.stats.requests["get_block_list"] >= 1  # asked the service what arrived
    assert container.download("model.bin") == data
    assert "resumed" in second.stdout or acked_blocks == 0


def test_source_changed_between_kill_and_resume_restarts_cleanly(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "model.bin"
    random_file(src, SIZE, seed=1)
    args = _args(src, f"{proxy.endpoint()}/{container.name}/model.bin", tmp_path / "j.db")
    proxy.hold_after("put_block", 10)
    kill_when_held(args, proxy)
    new = random_file(src, SIZE, seed=2)  # same size, new content, new mtime
    proxy.reset_stats()
    second = run(args)
    assert second.returncode == 0, second.stderr
    assert proxy.stats.bytes_in["put_block"] == SIZE  # nothing of the old content was reused
    assert container.download("model.bin") == new


def test_blocks_discarded_by_another_commit_are_sent_again(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = random_file(tmp_path / "model.bin", SIZE, seed=3)
    args = _args(tmp_path / "model.bin", f"{proxy.endpoint()}/{container.name}/model.bin", tmp_path / "j.db")
    proxy.hold_after("put_block", 12)
    kill_when_held(args, proxy)
    # Someone else commits the blob: the service discards every uncommitted block, ours included.
    container.client.get_blob_client("model.bin").commit_block_list([])
    proxy.reset_stats()
    second = run(args)
    assert second.returncode == 0, second.stderr
    assert proxy.stats.bytes_in["put_block"] == SIZE
    assert container.download("model.bin") == data


def test_ctrl_c_stops_cleanly_and_says_how_to_resume(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = random_file(tmp_path / "model.bin", SIZE, seed=4)
    args = _args(tmp_path / "model.bin", f"{proxy.endpoint()}/{container.name}/model.bin", tmp_path / "j.db")
    proxy.hold_after("put_block", 5)
    proc = start(args)
    proxy.wait_for_held(1, timeout=60)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    proxy.clear_rules()
    proxy.release_holds()
    proxy.wait_idle()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "blobsync jobs resume" in err and "Traceback" not in err
    with sqlite3.connect(tmp_path / "j.db") as db:
        assert db.execute("select state from jobs").fetchone()[0] == "interrupted"
    job_id = err.split("blobsync jobs resume ")[1].split("'")[0]
    acked_bytes = sum(e.request_bytes for e in proxy.log if e.op == "put_block" and e.status == 201)
    assert proxy.stats.ok("put_block") == 5
    proxy.reset_stats()
    resumed = run(["jobs", "resume", job_id, "--journal", str(tmp_path / "j.db"), "--quiet"])
    assert resumed.returncode == 0, resumed.stderr
    assert proxy.stats.bytes_in["put_block"] == SIZE - acked_bytes
    assert container.download("model.bin") == data
