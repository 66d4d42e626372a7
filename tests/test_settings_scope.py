"""Every setting in its scope: a session's settings (connections, budgets, the cap, retries, the journal) reach every
call made on it, a call that sets one to another value gets it, and a cap is the job's across all its workers."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

import pytest

import blobsync
from blobsync.config import MiB, TransferConfig, mbps_to_bytes, session_fields
from blobsync.engine.bandwidth import BucketState, TokenBucket
from blobsync.engine.session import Session
from blobsync.errors import BlobsyncError
from blobsync.journal import Journal
from conftest import ContainerHandle
from support.cli import random_file, run
from support.proxy import FaultProxy, Rule, respond, stall


def test_each_field_declares_its_scope_and_a_call_takes_the_sessions_where_it_sets_none() -> None:
    assert set(session_fields()) == {"concurrency", "memory", "journal_path", "max_retries", "retry_deadline",
                                     "stall_timeout", "cap_mbps", "proxy", "trusted_suffixes"}
    session = TransferConfig(cap_mbps=40, max_retries=0, memory=64 * MiB, trusted_suffixes=("a.example",))
    call = TransferConfig(block_size=4 * MiB, overwrite="false").in_session(session)
    assert (call.cap_mbps, call.max_retries, call.memory, call.trusted_suffixes) == (40, 0, 64 * MiB, ("a.example",))
    assert call.block_size == 4 * MiB and call.overwrite.value == "false"  # what the job does stays the call's
    assert call.session_key() == session.session_key()
    own = TransferConfig(cap_mbps=8).in_session(session)
    assert own.cap_mbps == 8 and own.session_key() != session.session_key()


def test_a_call_with_other_session_settings_runs_on_a_session_of_its_own_kept_and_closed_with_the_client(
        container: ContainerHandle, tmp_path: Path) -> None:
    async def scenario() -> None:
        session = Session(TransferConfig(journal_path=tmp_path / "j.db"), dict(os.environ), lambda: _no_journal())
        try:
            plain = session.context(container.url, TransferConfig(block_size=MiB), progress=blobsync.Progress())
            assert plain.store is session.store(container.url)
            capped = session.context(container.url, TransferConfig(cap_mbps=8), progress=blobsync.Progress())
            again = session.context(container.url, TransferConfig(cap_mbps=8), progress=blobsync.Progress())
            assert capped.store is again.store and capped.store is not plain.store  # made once, then reused
            assert capped.bandwidth is not None and capped.bandwidth.rate == mbps_to_bytes(8)
            stalled = session.context(container.url, TransferConfig(stall_timeout=2), progress=blobsync.Progress())
            assert stalled.store is not plain.store and stalled.config.stall_timeout == 2
        finally:
            await session.close()
        assert all(child.closed for child in session._children.values()) or not session._children

    asyncio.run(scenario())


def _no_journal() -> Journal:
    raise AssertionError("these calls never open the journal")


def _rate(nbytes: int, started: float) -> float:
    return nbytes / (time.monotonic() - started)


def test_a_clients_call_with_a_cap_is_capped_as_the_module_call_is(container: ContainerHandle,
                                                                    tmp_path: Path) -> None:
    size, cap = 3 * MiB, 16
    data = random_file(tmp_path / "f.bin", size)
    config = TransferConfig(cap_mbps=cap, block_size=MiB, journal_path=tmp_path / "j.db")
    env = {"AZURE_STORAGE_CONNECTION_STRING": os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")}
    with blobsync.Client(container.url, TransferConfig(journal_path=tmp_path / "j.db"), env=env) as client:
        started = time.monotonic()
        client.copy(tmp_path / "f.bin", f"{container.url}/client.bin", config, raise_on_error=True)
        assert _rate(size, started) <= mbps_to_bytes(cap) * 1.1
    started = time.monotonic()
    blobsync.copy(tmp_path / "f.bin", f"{container.url}/module.bin", config, env=env, raise_on_error=True)
    assert _rate(size, started) <= mbps_to_bytes(cap) * 1.1
    assert container.download("client.bin") == data and container.download("module.bin") == data


def test_run_files_session_flags_reach_every_line(container: ContainerHandle, azurite_env: str, tmp_path: Path
                                                   ) -> None:
    size, cap = 3 * MiB, 16
    data = random_file(tmp_path / "f.bin", size)
    lines = tmp_path / "lines.txt"
    lines.write_text(f"cp {tmp_path / 'f.bin'} {container.url}/a.bin --block-size-mb 1\n", encoding="utf-8")
    started = time.monotonic()
    done = run(["run", str(lines), "--cap-mbps", str(cap), "--journal", str(tmp_path / "j.db")],
               env={"AZURE_STORAGE_CONNECTION_STRING": azurite_env})
    assert done.returncode == 0, done.stderr
    assert _rate(size, started) <= mbps_to_bytes(cap) * 1.1
    assert container.download("a.bin") == data


def test_run_files_max_retries_reaches_its_lines(container: ContainerHandle, proxy: FaultProxy, proxy_env: str,
                                                 tmp_path: Path) -> None:
    random_file(tmp_path / "f.bin", 1000)
    proxy.add_rule(Rule("put_blob", respond(503, "ServerBusy", retry_after=0)))
    lines = tmp_path / "lines.txt"
    lines.write_text(f"cp {tmp_path / 'f.bin'} {proxy.endpoint()}/{container.name}/a.bin\n", encoding="utf-8")
    done = run(["run", str(lines), "--max-retries", "0", "--journal", str(tmp_path / "j.db")],
               env={"AZURE_STORAGE_CONNECTION_STRING": proxy_env})
    assert done.returncode != 0
    assert proxy.stats.requests["put_blob"] == 1, proxy.stats  # one attempt: no retry


@pytest.mark.parametrize("where", [["--processes", "2"], ["--cluster", "local:2"]], ids=["processes", "cluster"])
def test_a_cap_on_workers_is_the_jobs_shared_by_them(where: list[str], container: ContainerHandle, azurite_env: str,
                                                     tmp_path: Path) -> None:
    """--processes: one bucket in shared memory; --cluster: each worker process its share, across all its tasks
    (each task used to start a fresh bucket with a full burst)."""
    src = tmp_path / "src"
    files = {f"f{i:02d}.bin": random_file(src / f"f{i:02d}.bin", 40_000, seed=i) for i in range(30)}
    size, cap = 30 * 40_000, 2
    started = time.monotonic()
    done = run(["cp", "-r", "--as-subdir=false", str(src), container.url, *where, "--cap-mbps", str(cap),
                "--journal", str(tmp_path / "j.db")], env={"AZURE_STORAGE_CONNECTION_STRING": azurite_env})
    assert done.returncode == 0, done.stderr
    # Each bucket starts with one burst (256 KiB) in it; the rest is paced at the cap, however many workers.
    bursts = 256 * 1024 * (1 if where[0] == "--processes" else 2)
    assert _rate(size - bursts, started) <= mbps_to_bytes(cap) * 1.1
    for name, data in files.items():
        assert container.download(name) == data


def test_a_calls_stall_timeout_is_its_own(container: ContainerHandle, proxy: FaultProxy, proxy_env: str,
                                          tmp_path: Path) -> None:
    random_file(tmp_path / "f.bin", 1000)
    url = f"{proxy.endpoint()}/{container.name}"
    env = {"AZURE_STORAGE_CONNECTION_STRING": proxy_env}
    with blobsync.Client(url, TransferConfig(journal_path=tmp_path / "j.db"), env=env) as client:
        proxy.add_rule(Rule("put_blob", stall(30)))
        started = time.monotonic()
        with pytest.raises(BlobsyncError):
            client.copy(tmp_path / "f.bin", f"{url}/a.bin", TransferConfig(stall_timeout=1, max_retries=0,
                                                                           journal_path=tmp_path / "j.db"),
                        raise_on_error=True)
        assert time.monotonic() - started < 20  # the session's own 120 s would still be waiting


def test_a_bucket_is_shared_across_event_loops_and_a_cancelled_taker_holds_nobody_up() -> None:
    bucket = TokenBucket(rate=2 * MiB, burst=256 * 1024)

    def taker() -> None:
        async def take() -> None:
            for _ in range(4):
                await bucket.take(256 * 1024)

        asyncio.run(take())

    started = time.monotonic()
    threads = [threading.Thread(target=taker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - started >= (2 * MiB - 256 * 1024) / (2 * MiB) / 1.1  # 2 MiB in all at 2 MiB/s

    async def cancelled() -> float:
        slow = TokenBucket(rate=100_000, burst=256 * 1024)
        await slow.take(256 * 1024)
        first = asyncio.create_task(slow.take(256 * 1024))  # would wait ~2.6 s
        await asyncio.sleep(0.05)
        first.cancel()
        slow.set_rate(100 * MiB)
        began = time.monotonic()
        await asyncio.wait_for(slow.take(1024), 3)
        return time.monotonic() - began

    assert asyncio.run(cancelled()) < 2


def test_a_shared_state_carries_the_buckets_numbers() -> None:
    bucket = TokenBucket(rate=MiB)
    asyncio.run(bucket.take(100_000))
    before = bucket.tokens
    shared = BucketState.shared()
    bucket.move_to(shared)
    assert bucket.state is shared and bucket.rate == MiB and bucket.tokens >= before
    other = TokenBucket(1.0, state=shared)  # a worker's bucket over the same numbers: the job's rate, not its own
    bucket.set_rate(2 * MiB)
    assert other.rate == 2 * MiB


def _hold_bucket(job: str, rate: float) -> None:
    from blobsync.cluster.work import MACHINE_CAP

    with MACHINE_CAP._lock:  # as a worker's first task of the job makes it (its share of the cap)
        MACHINE_CAP._buckets[job] = TokenBucket(rate)


def _bucket_rate(job: str) -> float | None:
    from blobsync.cluster.work import MACHINE_CAP

    return MACHINE_CAP.rate(job)


def test_a_cluster_jobs_cap_goes_to_the_workers_busy_with_it() -> None:
    """On Dask the workers cannot share one bucket: the client splits the cap among those running tasks now, so a
    worker left alone at the end of a job gets all of it, and an idle one goes back to its 1/N share."""
    import cloudpickle

    from blobsync.cluster.dask_adapter import DaskExecutor

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module

    async def scenario() -> dict[str, float | None]:
        executor = await DaskExecutor.open("local:2")
        try:
            client = executor.client
            await client.run(_hold_bucket, "job1", 4e6)
            busy = client.submit(time.sleep, 5, pure=False)  # one worker busy, the other idle
            for _ in range(100):
                if any((await client.processing()).values()):
                    break
                await asyncio.sleep(0.05)
            await executor.share_cap("job1", 8e6)
            rates: dict[str, float | None] = await client.run(_bucket_rate, "job1")
            busy_worker = next(w for w, keys in (await client.processing()).items() if keys)
            await busy.cancel()
            return {("busy" if w == busy_worker else "idle"): r for w, r in rates.items()}
        finally:
            await executor.close()

    assert asyncio.run(scenario()) == {"busy": 8e6, "idle": 4e6}


def test_a_client_keeps_a_bounded_number_of_sessions_for_calls_with_other_settings(tmp_path: Path) -> None:
    from blobsync.engine.session import MAX_CHILDREN
    from blobsync.errors import UsageError

    async def scenario() -> None:
        session = Session(TransferConfig(journal_path=tmp_path / "j.db"), {}, _no_journal)
        try:
            for i in range(MAX_CHILDREN):
                session.child(TransferConfig(cap_mbps=i + 1, journal_path=tmp_path / "j.db"))
            again = session.child(TransferConfig(cap_mbps=1, journal_path=tmp_path / "j.db"))  # the same: reused
            assert again is session.child(TransferConfig(cap_mbps=1, journal_path=tmp_path / "j.db"))
            with pytest.raises(UsageError, match="this call sets stall_timeout, cap_mbps"):
                session.child(TransferConfig(cap_mbps=99, stall_timeout=5, journal_path=tmp_path / "j.db"))
        finally:
            await session.close()

    asyncio.run(scenario())
