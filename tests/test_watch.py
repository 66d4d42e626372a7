"""sync --watch against Azurite: files go up once they settled (never half-written), bursts become one round,
a network outage is ridden out, and Ctrl-C stops cleanly. Requests are counted through the proxy."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import blobsync
from blobsync import Report, TransferConfig
from blobsync.config import MiB
from conftest import ContainerHandle
from support.cli import random_file, run, start
from support.proxy import FaultProxy, Rule, reset_before


def _commits(proxy: FaultProxy, blob: str) -> int:
    """Successful writes that make a version of `blob` visible (Put Blob or Put Block List)."""
    return sum(1 for e in proxy.log if e.blob == blob and e.op in ("put_blob", "put_block_list")
               and e.status == 201)


@contextmanager
def _watching(src: Path, url: str, tmp_path: Path, settle: float) -> Iterator[list[Report]]:
    """blobsync.watch in a thread beside the test, as beside a training loop; stopped on exit."""
    reports: list[Report] = []
    stop = threading.Event()
    config = TransferConfig.from_mib(block_size_mb=1, journal_path=tmp_path / "j.db")
    errors: list[BaseException] = []

    def target() -> None:
        try:
            blobsync.watch(src, url, config, settle=settle, stop=stop, env={}, on_round=reports.append)
        except BaseException as exc:  # surfaced by the test below
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    try:
        yield reports
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not thread.is_alive()
    assert not errors, errors


def test_a_file_written_slowly_is_uploaded_once_and_complete(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "ckpt"
    first = random_file(src / "epoch0.pt", 3 * MiB, seed=1)
    url = f"{proxy.endpoint()}/{container.name}/run7"
    with _watching(src, url, tmp_path, settle=2.0) as reports:
        proxy.wait_until(lambda: _commits(proxy, "run7/epoch0.pt") == 1)  # the initial sync
        # A checkpoint written in 20 chunks, 0.2 s apart (well inside the settle time). Early on, another
        # file is written at once: it settles while the checkpoint is still being written, and its round
        # must leave the checkpoint alone.
        chunks = [random_file(tmp_path / f"c{i}", 128 * 1024 + i, seed=10 + i) for i in range(20)]
        fd = os.open(src / "epoch1.pt", os.O_WRONLY | os.O_CREAT)
        try:
            for i, chunk in enumerate(chunks):
                os.write(fd, chunk)
                if i == 2:
                    metrics = random_file(src / "metrics.json", 500, seed=5)
                time.sleep(0.2)
        finally:
            os.close(fd)
        proxy.wait_until(lambda: _commits(proxy, "run7/epoch1.pt") >= 1, timeout=120)
    assert _commits(proxy, "run7/epoch1.pt") == 1  # never a half-written version first
    assert container.download("run7/epoch1.pt") == b"".join(chunks)
    props = container.client.get_blob_client("run7/epoch1.pt").get_blob_properties()
    assert bytes(props.content_settings.content_md5) == hashlib.md5(b"".join(chunks)).digest()
    assert container.download("run7/epoch0.pt") == first
    assert _commits(proxy, "run7/epoch0.pt") == 1
    assert container.download("run7/metrics.json") == metrics
    assert not any(r.files_failed for r in reports)


def test_a_burst_of_changes_becomes_one_round_and_edits_go_up_as_deltas(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "data"
    big = bytearray(random_file(src / "big.bin", 4 * MiB, seed=2))
    url = f"{proxy.endpoint()}/{container.name}"
    with _watching(src, url, tmp_path, settle=1.0) as reports:
        proxy.wait_until(lambda: _commits(proxy, "big.bin") == 1)
        proxy.reset_stats()
        files = {f"shard{i:02d}.bin": random_file(src / f"shard{i:02d}.bin", 1000 + i, seed=i) for i in range(20)}
        big[MiB + 5] ^= 0xFF
        with open(src / "big.bin", "r+b") as f:
            f.seek(MiB + 5)
            f.write(big[MiB + 5: MiB + 6])
        proxy.wait_until(lambda: all(_commits(proxy, name) == 1 for name in [*files, "big.bin"]), timeout=120)
    busy = [r for r in reports if r.files_transferred]
    assert len(busy) == 2, [(r.files_transferred, r.files_held) for r in reports]  # initial sync + one burst
    assert busy[1].files_transferred == 21 and busy[1].bytes_delta == 3 * MiB
    assert proxy.stats.bytes_in["put_block"] == MiB  # only the edited block of big.bin
    for name, data in files.items():
        assert container.download(name) == data
    assert container.download("big.bin") == bytes(big)


def test_cli_watch_rides_out_a_network_outage_and_stops_on_ctrl_c(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "ckpt"
    random_file(src / "a.bin", 2 * MiB, seed=3)
    url = f"{proxy.endpoint()}/{container.name}"
    proc = start(["sync", str(src), url, "--watch", "--settle", "0.5", "--journal", str(tmp_path / "j.db"),
                  "--block-size-mb", "1", "--max-retries", "1", "--retry-deadline", "2", "--output-type", "json"])
    rounds: queue.Queue[dict[str, object]] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    reader = threading.Thread(target=lambda: [rounds.put(json.loads(line)) for line in stdout])
    reader.start()

    def next_busy_round() -> dict[str, object]:
        while True:
            report = rounds.get(timeout=120)
            if report.get("type") == "summary" and report["files_transferred"]:  # after the start line
                return report

    try:
        assert next_busy_round()["files_transferred"] == 1  # a.bin, once it settled
        proxy.add_rule(Rule(None, reset_before))  # the network goes away
        data = random_file(src / "b.bin", 3 * MiB, seed=4)
        # Rounds keep trying. A round makes 2 attempts (--max-retries 1) and the HTTP client may retry a reset
        # pooled connection once more: 6 refused listings mean at least one round failed and a later one tried again.
        proxy.wait_until(lambda: proxy.stats.faults["list_blobs"] >= 6, timeout=120)
        proxy.clear_rules()  # and comes back
        back = next_busy_round()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        reader.join(timeout=60)
    assert back["files_transferred"] == 1 and back["exit_code"] == 0
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "retrying in" in err and "stopped watching" in err
    assert container.download("b.bin") == data
    assert _commits(proxy, "b.bin") == 1


def test_ctrl_c_in_the_middle_of_a_watch_upload_leaves_it_resumable(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "ckpt"
    data = random_file(src / "big.pt", 12 * MiB, seed=6)
    url = f"{proxy.endpoint()}/{container.name}"
    common = [str(src), url, "--journal", str(tmp_path / "j.db"), "--block-size-mb", "1", "--concurrency", "2"]
    proxy.hold_after("put_block", 4)
    proc = start(["sync", *common, "--watch", "--settle", "0.2"])
    try:
        proxy.wait_for_held(1, timeout=120)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    proxy.clear_rules()
    proxy.release_holds()
    proxy.wait_idle()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "stopped watching" in err
    acked = sum(e.request_bytes for e in proxy.log if e.op == "put_block" and e.status == 201)
    assert acked == 4 * MiB
    proxy.reset_stats()
    again = run(["sync", *common, "--quiet"])
    assert again.returncode == 0, again.stderr
    assert proxy.stats.bytes_in["put_block"] == len(data) - acked  # the staged blocks were kept
    assert container.download("big.pt") == data


def test_watch_usage_errors_are_one_line_and_exit_2(container: ContainerHandle, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    url = container.url
    cases = [
        ["sync", url, str(tmp_path / "dst"), "--watch"],  # watching a container is not supported
        ["sync", str(tmp_path / "src"), url, "--watch", "--dry-run"],
        ["sync", str(tmp_path / "src"), url, "--watch", "--delete-destination", "prompt"],
        ["sync", str(tmp_path / "src"), url, "--watch", "--settle", "-1"],
        ["sync", str(tmp_path / "missing"), url, "--watch"],
    ]
    for args in cases:
        done = run([*args, "--journal", str(tmp_path / "j.db")], timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert lines[-1].startswith("blobsync: error: ") and "Traceback" not in done.stderr, done.stderr
