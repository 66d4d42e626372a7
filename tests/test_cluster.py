"""One job across Dask workers, against Azurite: real LocalClusters and real `dask scheduler` / `dask worker`
processes; every byte checked with the SDK."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import blobsync
from blobsync import TransferConfig
from blobsync.config import MiB
from conftest import ContainerHandle, Side
from support.azurite import Azurite
from support.cli import clean_env, random_file, run
from support.processes import kill_tree
from support.proxy import FaultProxy, Rule, respond

distributed = pytest.importorskip("distributed")
HUGE = 100 * MiB + 12_345  # over a shard's size: its blocks are staged by both workers, committed once


def _tree(root: Path, small: int = 300, *, huge: bool = True) -> dict[str, bytes]:
    files = {f"small/{i // 50:02d}/f{i:03d}.bin": random_file(root / f"small/{i // 50:02d}/f{i:03d}.bin",
                                                             1000 + 37 * i, seed=i) for i in range(small)}
    if huge:
        files["big/huge.bin"] = random_file(root / "big/huge.bin", HUGE, seed=999)
    return files


def _config(tmp_path: Path) -> TransferConfig:
    return TransferConfig.from_mib(journal_path=tmp_path / "j.db")


def _same_bytes(container: ContainerHandle, files: dict[str, bytes], prefix: str = "") -> None:
    assert container.blob_names() == sorted(prefix + rel for rel in files)
    for rel, data in files.items():
        assert container.download(prefix + rel) == data, rel


def _committed_indexes(container: ContainerHandle, name: str) -> list[int]:
    """The index in each committed block ID ('<nonce>-<index>', which the SDK hands back decoded)."""
    committed, _ = container.client.get_blob_client(name).get_block_list("committed")
    return [int(b.id.rsplit("-", 1)[1]) for b in committed]


def test_a_sync_runs_on_two_workers_and_one_huge_file_is_split_over_both(container: ContainerHandle,
                                                                         tmp_path: Path, azurite_env: str) -> None:
    files = _tree(tmp_path / "src")
    report = blobsync.sync(tmp_path / "src", container.url, _config(tmp_path), cluster="local:2")
    assert report.ok and report.files_transferred == len(files), report.failures[:3]
    assert len({s.worker for s in report.shards}) == 2  # both workers did work
    assert sum(s.bytes for s in report.shards) == sum(map(len, files.values()))  # each byte in one task's row
    huge = [s for s in report.shards if s.label.startswith("big/huge.bin blocks")]
    assert len(huge) >= 4 and len({s.worker for s in huge}) == 2  # the huge file itself went over both
    _same_bytes(container, files)
    assert _committed_indexes(container, "big/huge.bin") == list(range(-(-HUGE // (8 * MiB))))  # in order
    props = container.client.get_blob_client("big/huge.bin").get_blob_properties()
    assert props.content_settings.content_md5 is not None  # the whole file's MD5, hashed beside the ranges

    again = blobsync.sync(tmp_path / "src", container.url, _config(tmp_path), cluster="local:2")
    assert again.ok and again.files_transferred == 0 and again.files_in_sync == len(files)

    down = blobsync.sync(container.url, tmp_path / "down", _config(tmp_path), cluster="local:2")
    assert down.ok and down.files_transferred == len(files)
    for rel, data in files.items():
        assert (tmp_path / "down" / rel).read_bytes() == data, rel
    assert not list((tmp_path / "down").rglob("*.blobsync-part*"))


def test_cp_r_up_and_down_on_a_cluster_keeps_azcopys_layout(container: ContainerHandle, tmp_path: Path,
                                                             azurite_env: str) -> None:
    files = _tree(tmp_path / "run1", small=30, huge=False)
    config = TransferConfig.from_mib(journal_path=tmp_path / "j.db", recursive=True)
    up = blobsync.copy(tmp_path / "run1", container.url, config, cluster="local:2")
    assert up.ok and up.files_transferred == len(files) and up.shards
    _same_bytes(container, files, prefix="run1/")  # the folder is a level of its own, as without a cluster
    down = blobsync.copy(f"{container.url}/run1", tmp_path / "dl", config, cluster="local:2")
    assert down.ok and down.files_transferred == len(files)
    for rel, data in files.items():
        assert (tmp_path / "dl" / "run1" / rel).read_bytes() == data, rel


@pytest.fixture
def local_cluster(proxy_env: str) -> Iterator[object]:
    """A LocalCluster whose workers talk to Azurite through the fault proxy (they inherit its environment)."""
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                                       scheduler_kwargs={"dashboard_address": ":0"})
    client = distributed.Client(cluster)
    try:
        client.wait_for_workers(2, timeout=60)
        yield client
    finally:
        client.close()
        cluster.close()


def test_a_worker_killed_mid_job_costs_nothing_but_time(container: ContainerHandle, tmp_path: Path,
                                                         proxy: FaultProxy, local_cluster: object) -> None:
    client: distributed.Client = local_cluster  # type: ignore[assignment]
    files = _tree(tmp_path / "src", small=40)
    proxy.hold_after("put_block", 4)  # four blocks staged, then everything waits
    outcome: dict[str, object] = {}
    url = f"{proxy.endpoint()}/{container.name}"

    def job() -> None:
        try:
            outcome["report"] = blobsync.sync(tmp_path / "src", url, _config(tmp_path), cluster=client)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=job)
    thread.start()
    try:
        proxy.wait_for_held(1, timeout=120)
        pids = client.run(os.getpid)
        victim = sorted(pids.values())[0]
        os.kill(victim, signal.SIGKILL)  # the nanny starts a new worker; Dask runs the lost tasks again
    finally:
        proxy.release_holds()
        thread.join(timeout=180)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert victim not in client.run(os.getpid).values()  # it was killed, and another took its place
    report = outcome["report"]
    assert isinstance(report, blobsync.Report) and report.ok and report.files_transferred == len(files)
    _same_bytes(container, files)
    assert _committed_indexes(container, "big/huge.bin") == list(range(-(-HUGE // (8 * MiB))))


def test_a_shard_that_fails_three_times_fails_its_files_and_the_rest_go_up(
        container: ContainerHandle, tmp_path: Path, proxy: FaultProxy, local_cluster: object) -> None:
    files = _tree(tmp_path / "src", small=60, huge=False)
    doomed = "small/00/f007.bin"
    proxy.add_rule(Rule("put_blob", respond(500, "InternalError"), blob=doomed))  # on every try, on any worker
    config = TransferConfig.from_mib(journal_path=tmp_path / "j.db", max_retries=1)
    report = blobsync.sync(tmp_path / "src", f"{proxy.endpoint()}/{container.name}", config,
                           cluster=local_cluster)
    assert not report.ok and report.exit_code == 1
    failed = {f.rel for f in report.failures}
    assert doomed in failed and "failed on the cluster after its retries" in report.failures[0].reason
    assert proxy.stats.requests["put_blob"] >= 3  # the shard ran three times
    uploaded = set(container.blob_names())
    assert uploaded == set(files) - failed and len(uploaded) > len(files) // 2  # the rest went up
    for rel in uploaded:
        assert container.download(rel) == files[rel]


def test_sigterm_stops_a_cluster_job_with_one_line_and_it_resumes(container: ContainerHandle, tmp_path: Path,
                                                                  proxy: FaultProxy, azurite: object) -> None:
    """What a pipeline does to a job it stops: SIGTERM. The workers go with it; no Dask traceback on stderr."""
    env = clean_env({"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string_via(proxy.endpoint())})  # type: ignore[attr-defined]
    data = random_file(tmp_path / "src" / "f.bin", 48 * MiB, seed=7)
    args = ["sync", str(tmp_path / "src"), f"{proxy.endpoint()}/{container.name}", "--journal", str(tmp_path / "j.db")]
    proxy.hold_after("put_block", 2)
    proc = subprocess.Popen([sys.executable, "-m", "blobsync", *args, "--cluster", "local:1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        proxy.wait_for_held(1, timeout=120)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        kill_tree(proc.pid)
        proxy.release_holds()
    assert proc.returncode == 130, err
    assert "interrupted" in err.splitlines()[-1] and "Traceback" not in err and "never retrieved" not in err
    done = run([*args, "--output-type", "json"], env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert container.download("f.bin") == data


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DaskProcesses:
    """`dask scheduler` and `dask worker` as a user starts them; all killed in `close()`."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []
        self.scheduler = self._start([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port",
                                      str(self.port), "--no-dashboard"])

    def _start(self, cmd: list[str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def worker(self, prefix: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        return self._start([*prefix, sys.executable, "-m", "dask", "worker", self.address, "--nthreads", "1",
                            "--no-dashboard", "--nworkers", "1"])

    def wait_for_workers(self, n: int) -> None:
        with distributed.Client(self.address, timeout=60) as client:
            client.wait_for_workers(n, timeout=60)

    def close(self) -> None:
        for proc in self.procs:
            kill_tree(proc.pid)


@pytest.fixture
def dask_env(azurite_env: str) -> dict[str, str]:
    return {**os.environ, "AZURE_STORAGE_CONNECTION_STRING": azurite_env}


def _summary(stdout: str) -> dict[str, object]:
    return next(r for r in map(json.loads, stdout.splitlines()) if r["type"] == "summary")


def test_the_cli_runs_on_a_scheduler_and_workers_and_survives_losing_the_scheduler(
        container: ContainerHandle, tmp_path: Path, proxy: FaultProxy, azurite: object) -> None:
    env = clean_env({"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string_via(proxy.endpoint())})  # type: ignore[attr-defined]
    dask = DaskProcesses(env)
    try:
        dask.worker()
        dask.worker()
        dask.wait_for_workers(2)
        files = _tree(tmp_path / "src", small=60, huge=False)
        args = ["sync", str(tmp_path / "src"), f"{proxy.endpoint()}/{container.name}", "--journal",
                str(tmp_path / "j.db"), "--output-type", "json"]
        done = run([*args, "--cluster", dask.address], env=env, timeout=240)
        assert done.returncode == 0, done.stderr
        summary = _summary(done.stdout)
        assert len({s["worker"] for s in summary["shards"]}) == 2  # type: ignore[union-attr]
        _same_bytes(container, files)

        more = {f"more/m{i}.bin": random_file(tmp_path / "src" / f"more/m{i}.bin", 20 * MiB + i, seed=50 + i)
                for i in range(3)}
        proxy.hold_after("put_block", 2)
        proc = subprocess.Popen([sys.executable, "-m", "blobsync", *args, "--cluster", dask.address], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            proxy.wait_for_held(1, timeout=120)
            kill_tree(dask.scheduler.pid)
            _, err = proc.communicate(timeout=120)
        finally:
            kill_tree(proc.pid)
            proxy.release_holds()
        assert proc.returncode == 1, err
        assert "scheduler" in err.splitlines()[-1]
    finally:
        dask.close()
    finished = run(args, env=env, timeout=240)  # the same command without the cluster finishes the job here
    assert finished.returncode == 0, finished.stderr
    _same_bytes(container, {**files, **more})
    # ... from the blocks the workers staged: the client journaled the nonces they staged under.
    assert int(_summary(finished.stdout)["bytes_reused"]) >= 8 * MiB  # type: ignore[call-overload]


def test_a_worker_that_cannot_see_the_folder_is_named(container: ContainerHandle, tmp_path: Path,
                                                       dask_env: dict[str, str]) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a worker with its own mounts")
    share = tmp_path / "share"
    random_file(share / "src" / "a.bin", 1000)
    dask = DaskProcesses(dask_env)
    try:
        # This worker's /…/share is an empty tmpfs of its own: it sees another folder at the same path.
        dask.worker(("unshare", "-m", "--propagation", "private", "sh", "-c",
                     f'mount -t tmpfs tmpfs "{share}" && exec "$0" "$@"'))
        dask.wait_for_workers(1)
        done = run(["sync", str(share / "src"), container.url, "--journal", str(tmp_path / "j.db"), "--cluster",
                    dask.address], env=dask_env, timeout=120)
    finally:
        dask.close()
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "worker tcp://127.0.0.1:" in line and "cannot see" in line and str(share / "src") in line
    assert container.blob_names() == []


def test_cluster_without_the_dask_extra_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    fake = tmp_path / "no-dask"
    (fake / "distributed").mkdir(parents=True)
    (fake / "distributed" / "__init__.py").write_text("raise ImportError(\"No module named 'distributed'\")\n")
    (tmp_path / "src").mkdir()
    pythonpath = os.pathsep.join(p for p in (str(fake), os.environ.get("PYTHONPATH", "")) if p)
    done = run(["sync", str(tmp_path / "src"), "http://127.0.0.1:1/devstoreaccount1/cont", "--cluster", "local:2"],
               env={"PYTHONPATH": pythonpath})
    assert done.returncode == 2, done.stderr
    assert "pip install 'blobsync[dask]'" in done.stderr and "Traceback" not in done.stderr


def test_a_blob_to_blob_copy_runs_on_two_workers_and_one_large_blob_is_staged_by_both(
        source: Side, dest: Side, azurite: Azurite, tmp_path: Path) -> None:
    """Issue 30, part 6: shards of blobs copied by the workers, and the ranges of one large blob staged from the
    source's URL by both workers and committed once with the source's properties."""
    blobs = {f"run/small/f{i}.bin": os.urandom(1000 + i) for i in range(40)}
    blobs["run/big.bin"] = os.urandom(70 * MiB + 5)
    for name, data in blobs.items():
        source.client.upload_blob(name, data, metadata={"from": "source"},
                                  max_concurrency=8)  # the large one in parallel blocks, with its MD5 below
    big = source.client.get_blob_client("run/big.bin")
    from azure.storage.blob import ContentSettings

    big.set_http_headers(ContentSettings(content_type="application/x-big",
                                         content_md5=bytearray(hashlib.md5(blobs["run/big.bin"]).digest())))
    config = TransferConfig.from_mib(recursive=True, journal_path=tmp_path / "j.db")
    report = blobsync.copy(source.url(azurite.base_url, "run"), dest.url(azurite.base_url), config,
                           cluster="local:2")
    assert report.ok and report.files_transferred == len(blobs), report.failures[:3]
    ranges = [s for s in report.shards if s.label.startswith("big.bin blocks")]
    assert len(ranges) >= 2 and len({s.worker for s in ranges}) == 2  # the large blob went over both workers
    for name, data in blobs.items():
        assert dest.download(name) == data, name
    props = dest.client.get_blob_client("run/big.bin").get_blob_properties()
    assert props.content_settings.content_type == "application/x-big" and props.metadata == {"from": "source"}
    assert bytes(props.content_settings.content_md5) == hashlib.md5(blobs["run/big.bin"]).digest()
