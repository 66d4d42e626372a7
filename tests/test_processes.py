"""One job over worker processes of blobsync's own (--processes N, no Dask), against Azurite: real spawned
processes, a real SIGKILL of one of them, every byte checked with the SDK."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import blobsync
from blobsync import TransferConfig
from blobsync.config import MiB
from blobsync.events import BaseSubscriber
from conftest import ContainerHandle
from support.azurite import Azurite
from support.cli import clean_env, random_file, run
from support.processes import kill_tree
from support.proxy import FaultProxy, Rule, flip_response_byte, reset_before, respond

BIG = 66 * MiB + 4321  # over a shard's 64 MiB: its ranges go to both processes, committed once


def _tree(root: Path, small: int, *, big: bool) -> dict[str, bytes]:
    files = {f"small/{i // 40:02d}/f{i:03d}.bin": random_file(root / f"small/{i // 40:02d}/f{i:03d}.bin",
                                                             700 + 31 * i, seed=i) for i in range(small)}
    if big:
        files["big/model.pt"] = random_file(root / "big/model.pt", BIG, seed=77)
    return files


def _same_bytes(container: ContainerHandle, files: dict[str, bytes]) -> None:
    assert container.blob_names() == sorted(files)
    for rel, data in files.items():
        assert container.download(rel) == data, rel


def test_a_sync_runs_in_two_processes_and_a_big_file_is_staged_by_both(container: ContainerHandle,
                                                                      tmp_path: Path, azurite_env: str) -> None:
    files = _tree(tmp_path / "src", 120, big=True)
    config = TransferConfig.from_mib(journal_path=tmp_path / "j.db")
    moved: list[int] = []
    # Another tool's aborted upload of the big file: its block ID length refuses every part of ours until cleared.
    container.client.get_blob_client("big/model.pt").stage_block("eA==", b"stale")

    class Bytes(BaseSubscriber):
        def on_progress(self, rel: str, nbytes: int) -> None:
            moved.append(nbytes)

    report = blobsync.sync(tmp_path / "src", container.url, config, cluster="processes:2", subscribers=[Bytes()])
    assert report.ok and report.files_transferred == len(files), report.failures[:3]
    assert sum(moved) == sum(map(len, files.values()))  # the workers' progress reached the caller, every byte
    workers = {s.worker for s in report.shards}
    assert len(workers) == 2 and f":{os.getpid()}" not in "".join(workers)  # two processes, neither this one
    big = [s for s in report.shards if s.label.startswith("big/model.pt blocks")]
    assert len(big) >= 2 and len({s.worker for s in big}) == 2
    _same_bytes(container, files)
    committed, uncommitted = container.client.get_blob_client("big/model.pt").get_block_list("all")
    assert [int(b.id.rsplit("-", 1)[1]) for b in committed] == list(range(-(-BIG // (8 * MiB)))) and not uncommitted

    again = blobsync.sync(tmp_path / "src", container.url, config, cluster="processes:2")
    assert again.ok and again.files_transferred == 0 and again.files_in_sync == len(files)
    down = blobsync.copy(container.url + "/small", tmp_path / "down", replace(config, recursive=True),
                         cluster="processes:2")  # AzCopy's layout: down/small/...
    assert down.ok and down.files_transferred == len(files) - 1
    for rel, data in files.items():
        if rel.startswith("small/"):
            assert (tmp_path / "down" / rel).read_bytes() == data, rel


def _workers_of(pid: int) -> list[int]:
    """The pool workers among a process's children (not multiprocessing's resource tracker): forked by the command,
    or spawned."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if int(stat[1]) == pid and "resource_tracker" not in cmdline:
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def _held_job(args: list[str], env: dict[str, str], proxy: FaultProxy, puts: int
              ) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """`blobsync ARGS --processes 2` started, with `puts` Put Blobs let through and the rest held by the proxy;
    yields the process and its two workers once a request is held. Killed (with its group) afterwards."""
    proxy.hold_after("put_blob", puts)
    proc = subprocess.Popen([sys.executable, "-m", "blobsync", *args, "--processes", "2"], env=clean_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        proxy.wait_for_held(1, timeout=120)
        yield proc, _workers_of(proc.pid)
    finally:
        kill_tree(proc.pid)
        proxy.release_holds()


def test_a_worker_process_killed_mid_job_stops_it_with_one_line_and_it_resumes(
        container: ContainerHandle, tmp_path: Path, proxy: FaultProxy, azurite: Azurite) -> None:
    files = _tree(tmp_path / "src", 200, big=False)
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string_via(proxy.endpoint())}
    args = ["cp", str(tmp_path / "src"), f"{proxy.endpoint()}/{container.name}", "-r", "--journal",
            str(tmp_path / "j.db")]
    with _held_job(args, env, proxy, 20) as (proc, workers):
        assert len(workers) == 2, workers
        # Forked by the command before it started anything (cluster.processes.prestart), not spawned.
        assert all(b"spawn_main" not in Path(f"/proc/{w}/cmdline").read_bytes() for w in workers)
        os.kill(workers[0], signal.SIGKILL)  # killed as the OOM killer would
        proxy.release_holds()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err  # a run to repeat: neither success nor a usage error
    last = err.strip().splitlines()[-1]
    assert "worker process" in last and "run the same command again" in last, err
    assert "Traceback" not in err
    assert not [w for w in workers if Path(f"/proc/{w}").exists()]  # no worker outlives the job

    done = run(args, env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    _same_bytes(container, {f"src/{rel}": data for rel, data in files.items()})


def test_a_file_is_split_only_where_a_core_is_left_beside_what_one_process_keeps_busy(
        container: ContainerHandle, tmp_path: Path, azurite_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On two cores one process keeps one busy with its loop and one with the file's MD5: a split there is slower
    (bench/RESULTS.md), so the file goes whole to one worker; without the MD5 a core is left, and it is split."""
    monkeypatch.setenv("BLOBSYNC_SPLIT_CORES", "2")
    data = random_file(tmp_path / "src" / "big.bin", BIG, seed=5)
    config = TransferConfig.from_mib(journal_path=tmp_path / "j.db")
    for put_md5, ranges in ((True, 0), (False, 2)):
        report = blobsync.copy(tmp_path / "src" / "big.bin", f"{container.url}/md5-{put_md5}.bin",
                               replace(config, put_md5=put_md5), cluster="processes:2")
        assert report.ok and report.files_transferred == 1
        split = [s for s in report.shards if " blocks " in s.label]
        assert len({s.worker for s in split}) == ranges, report.shards
        blob = container.client.get_blob_client(f"md5-{put_md5}.bin")
        assert blob.download_blob().readall() == data
        assert (blob.get_blob_properties().content_settings.content_md5 is not None) == put_md5


@pytest.mark.parametrize(("extra", "words"), [
    (["--processes", "0"], "invalid --processes '0'"),
    (["--processes", "many"], "invalid --processes 'many'"),
    (["--processes", "2", "--cluster", "local:2"], "choose one of --cluster and --processes"),
])
def test_bad_processes_flags_are_one_line_and_exit_2(tmp_path: Path, extra: list[str], words: str) -> None:
    random_file(tmp_path / "src" / "a.bin", 10)
    result = run(["cp", str(tmp_path / "src"), "http://127.0.0.1:9/devstoreaccount1/cont", "-r", *extra,
                  "--journal", str(tmp_path / "j.db")])
    assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2  # the error and at most a hint


def test_processes_with_watch_and_in_the_library_are_checked(tmp_path: Path) -> None:
    result = run(["sync", str(tmp_path), "http://127.0.0.1:9/devstoreaccount1/cont", "--watch", "--processes", "2",
                  "--journal", str(tmp_path / "j.db")])
    assert result.returncode == 2 and "--watch" in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(blobsync.UsageError, match="invalid --processes '-1'"):
        blobsync.copy(tmp_path, "http://127.0.0.1:9/devstoreaccount1/cont", cluster="processes:-1")
    with pytest.raises(blobsync.UsageError, match="invalid cluster=2"):
        blobsync.sync(tmp_path, "http://127.0.0.1:9/devstoreaccount1/cont", cluster=2)


def test_workers_a_command_started_end_with_it_when_it_stops_before_its_job(tmp_path: Path) -> None:
    """The command forks its workers first thing; one that then stops on a usage error leaves none behind."""
    proc = subprocess.Popen([sys.executable, "-m", "blobsync", "sync", str(tmp_path), "http://127.0.0.1:9/x/cont",
                             "--watch", "--processes", "3", "--journal", str(tmp_path / "j.db")],
                            env=clean_env({}), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2 and "--watch" in err and "Traceback" not in err
        # multiprocessing's resource tracker ends once it reads the command's end: a moment later, under load
        deadline = time.monotonic() + 20
        while _running_in_group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running_in_group(proc.pid)
    finally:
        kill_tree(proc.pid)


def _running_in_group(pgid: int) -> list[int]:
    """The processes of a process group that still run (an exited child reparented to a PID 1 that reaps nothing
    stays a zombie: not running)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            state, _ppid, group = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            if int(group) == pgid and state != "Z":
                found.append(int(entry.name))
    return found


def test_workers_are_forked_only_where_no_other_thread_runs() -> None:
    from blobsync.cluster.processes import prestart

    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert prestart(2) is None  # a library's host, or a command past its start: spawned workers
    finally:
        stop.set()
        other.join()


def test_sigterm_stops_a_job_and_its_worker_processes_with_one_line_and_it_resumes(
        container: ContainerHandle, tmp_path: Path, proxy: FaultProxy, azurite: Azurite) -> None:
    """What a pipeline does to a job it stops: SIGTERM. The workers go with it, nothing is left running, and the
    same command finishes the job."""
    files = _tree(tmp_path / "src", 120, big=False)
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string_via(proxy.endpoint())}
    args = ["sync", str(tmp_path / "src"), f"{proxy.endpoint()}/{container.name}", "--journal", str(tmp_path / "j.db")]
    with _held_job(args, env, proxy, 10) as (proc, workers):
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err.strip().splitlines()[-1] and "Traceback" not in err
    assert workers and not [w for w in workers if Path(f"/proc/{w}").exists()]
    done = run(args, env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    _same_bytes(container, files)


def _hold_the_event_lock() -> None:
    """In a worker: take the lock of the progress pipe and keep it, as a worker terminated mid-write does."""
    from blobsync.cluster import processes

    processes._events._lock.acquire()
    time.sleep(120)


def test_closing_the_workers_ends_though_one_was_stopped_holding_the_progress_lock() -> None:
    """A worker terminated while it wrote a progress event keeps that lock for good: close() must not wait on it
    (it did: a job stopped by SIGTERM under load never ended)."""
    import asyncio

    from blobsync.cluster.processes import ProcessExecutor

    ended: list[float] = []

    async def main() -> None:
        executor = await ProcessExecutor.open(2)
        executor._pool.submit(_hold_the_event_lock)
        deadline = time.monotonic() + 60
        while executor._queue._lock.acquire(False):  # not taken yet
            executor._queue._lock.release()
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        start = time.monotonic()
        await executor.close()
        ended.append(time.monotonic() - start)

    closer = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    closer.start()
    closer.join(90)
    assert not closer.is_alive() and ended and ended[0] < 15, ended


def test_throttled_and_reset_requests_in_the_workers_are_retried_to_the_right_bytes(
        container: ContainerHandle, tmp_path: Path, proxy: FaultProxy, proxy_env: str) -> None:
    """Faults reach the workers' own engines: 503s with a Retry-After on Put Blob and Put Block, and a connection
    reset mid-job, are retried there; the job ends ok only with every byte in place."""
    files = _tree(tmp_path / "src", 80, big=True)
    proxy.add_rule(Rule("put_blob", respond(503, "ServerBusy", retry_after=0.1), probability=0.2, seed=3))
    proxy.add_rule(Rule("put_block", respond(503, "ServerBusy", retry_after=0.1), probability=0.2, seed=4))
    proxy.add_rule(Rule("put_blob", reset_before(), nth=5))
    config = TransferConfig.from_mib(journal_path=tmp_path / "j.db", max_retries=8)
    report = blobsync.sync(tmp_path / "src", f"{proxy.endpoint()}/{container.name}", config,
                           cluster="processes:2")
    assert report.ok and report.files_transferred == len(files), report.failures[:3]
    assert sum(proxy.stats.faults.values()) >= 5  # the faults did happen, and were ridden out
    _same_bytes(container, files)


def test_a_split_download_whose_md5_differs_is_fetched_again_as_the_plain_download_is(
        container: ContainerHandle, tmp_path: Path, proxy: FaultProxy, proxy_env: str) -> None:
    """A byte flipped in an 8 MiB range (too large for the service's range MD5) of a file split over both
    processes: the whole MD5 differs at the finish; the client fetches the file again instead of failing it."""
    data = random_file(tmp_path / "big.bin", BIG, seed=78)
    config = TransferConfig.from_mib(journal_path=tmp_path / "j.db")
    assert blobsync.copy(tmp_path / "big.bin", f"{container.url}/big.bin", config).ok  # its MD5 stored
    proxy.add_rule(Rule("get_blob", flip_response_byte(), nth=3))
    report = blobsync.copy(f"{proxy.endpoint()}/{container.name}/big.bin", tmp_path / "down.bin", config,
                           cluster="processes:2")
    assert report.ok and report.files_transferred == 1, report.failures
    assert (tmp_path / "down.bin").read_bytes() == data
    assert proxy.stats.faults["get_blob"] == 1 and len({s.worker for s in report.shards}) == 2

    from azure.storage.blob import ContentSettings  # a stored MD5 that is simply wrong: the same bytes twice fail

    container.client.get_blob_client("big.bin").set_http_headers(ContentSettings(content_md5=bytearray(16)))
    before = proxy.stats.requests["get_blob"]
    wrong = blobsync.copy(f"{proxy.endpoint()}/{container.name}/big.bin", tmp_path / "again.bin", config,
                          cluster="processes:2")
    assert [f.exit_code for f in wrong.failures] == [blobsync.ExitCode.INTEGRITY]
    assert not (tmp_path / "again.bin").exists()
    assert proxy.stats.requests["get_blob"] - before == 2 * -(-BIG // (8 * MiB))  # every range, twice


def test_a_split_upload_killed_mid_way_resumes_with_only_the_blocks_not_staged(
        container: ContainerHandle, tmp_path: Path, proxy: FaultProxy, azurite: Azurite) -> None:
    """The range tasks run the engine's own chunked write over their window: a kill after 4 blocks landed leaves
    them staged under the client's nonce, and the same command sends only the other blocks. With --no-put-md5 no
    task hashes the file and the blob gets no Content-MD5, as in the plain job (its CRC64 is still composed)."""
    data = random_file(tmp_path / "src" / "big.bin", BIG, seed=91)
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string_via(proxy.endpoint())}
    args = ["cp", str(tmp_path / "src" / "big.bin"), f"{proxy.endpoint()}/{container.name}/big.bin", "--journal",
            str(tmp_path / "j.db"), "--processes", "2", "--no-put-md5"]
    _killed_when_held(proxy, args, env, "put_block", 4)
    done = run(args, env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    assert proxy.stats.bytes_in["put_block"] == BIG - 4 * 8 * MiB  # the 4 blocks that landed are not sent again
    assert container.download("big.bin") == data
    props = container.client.get_blob_client("big.bin").get_blob_properties()
    assert props.content_settings.content_md5 is None and "blobsynccrc64" in props.metadata


def test_a_split_download_killed_mid_way_resumes_with_only_the_ranges_not_fetched(
        container: ContainerHandle, tmp_path: Path, proxy: FaultProxy, azurite: Azurite) -> None:
    """A file fetched by both processes into one partial file, killed once 3 GETs had answered and the client had
    journaled the ranges written: the same command fetches none of those again, and the file is right, checked by
    its MD5, which the client takes as the ranges land (those kept from the first run included)."""
    import hashlib

    from azure.storage.blob import ContentSettings

    data = os.urandom(BIG)
    container.client.upload_blob("big.bin", data,
                                 content_settings=ContentSettings(content_md5=bytearray(hashlib.md5(data).digest())))
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string_via(proxy.endpoint())}
    journal = tmp_path / "j.db"
    args = ["cp", f"{proxy.endpoint()}/{container.name}/big.bin", str(tmp_path / "down.bin"), "--journal",
            str(journal), "--processes", "2", "--check-md5", "FailIfDifferent"]
    journaled = _killed_when_held(proxy, args, env, "get_blob", 3, lambda: _ranges_journaled(journal, at_least=1))
    done = run(args, env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "down.bin").read_bytes() == data
    assert proxy.stats.bytes_out["get_blob"] <= BIG - journaled, (journaled, proxy.stats.bytes_out)


def _killed_when_held(proxy: FaultProxy, args: list[str], env: dict[str, str], op: str, count: int,
                      before_kill: Callable[[], int] = lambda: 0) -> int:
    """`blobsync *args` run until `count` `op` requests have landed and the next is held at the proxy, then killed
    with its workers (`before_kill()` first: what it returns is returned); the proxy left clean for the rerun."""
    proxy.hold_after(op, count)
    proc = subprocess.Popen([sys.executable, "-m", "blobsync", *args], env=clean_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        proxy.wait_for_held(1, timeout=120)
        seen = before_kill()
    finally:
        kill_tree(proc.pid)
        proc.communicate(timeout=30)
        proxy.release_holds()
    proxy.clear_rules()
    proxy.wait_idle()
    proxy.reset_stats()
    return seen


def _ranges_journaled(journal: Path, at_least: int, timeout: float = 60) -> int:
    """The bytes of ranges the client's journal holds as written, once at least `at_least` are there and the count
    has settled (the GETs that answered are all written and reported)."""
    import sqlite3
    import time

    deadline, last, steady = time.monotonic() + timeout, (-1, -1), 0
    while time.monotonic() < deadline:
        with contextlib.suppress(sqlite3.OperationalError), contextlib.closing(  # not made yet
                sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)) as db:
            count, nbytes = db.execute("select count(*), coalesce(sum(size), 0) from blocks").fetchone()
            steady = steady + 1 if (count, nbytes) == last else 0
            last = (count, nbytes)
            if count >= at_least and steady >= 3:
                return int(nbytes)
        time.sleep(0.2)  # polling another process's journal: no event to wait on
    raise AssertionError(f"the client journaled {last} ranges in {timeout} s")
