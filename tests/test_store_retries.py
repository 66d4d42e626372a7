"""Every store operation, hit by a 503 through the fault proxy, is retried, counted in the report and does its work."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from blobsync.engine.retry import Retrier, RetryPolicy
from blobsync.errors import ThrottledError
from conftest import ContainerHandle
from support.cli import random_file, run
from support.proxy import FaultProxy, Rule, respond


def _busy(proxy: FaultProxy, *ops: str, times: int = 1) -> None:
    for op in ops:
        proxy.add_rule(Rule(op, respond(503, "ServerBusy"), nth=range(1, times + 1)))


def _summary(stdout: str) -> dict[str, object]:
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    summaries = [r for r in records if r.get("type") == "summary"]
    assert summaries, stdout
    return summaries[-1]


def _cli(*args: str, tmp_path: Path) -> dict[str, object]:
    done = run([*args, "--journal", str(tmp_path / "j.db"), "--output-type", "json", "--quiet"])
    assert "Traceback" not in done.stderr, done.stderr
    assert "never awaited" not in done.stderr, done.stderr
    assert done.returncode == 0, (done.stdout, done.stderr)
    return _summary(done.stdout)


def _faults(proxy: FaultProxy) -> int:
    return sum(proxy.stats.faults.values())


async def test_retrier_runs_a_lambda_attempt_again_after_a_transient_failure() -> None:
    calls = 0

    async def op() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ThrottledError("busy", status=503)
        return "done"

    retrier = Retrier(RetryPolicy(base_delay=0.001))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" fails the test
        assert await retrier.call(lambda: op()) == "done"
    assert calls == 3 and retrier.retries == 2


def test_upload_retries_create_container_put_blob_and_verification(container: ContainerHandle, proxy: FaultProxy,
                                                                   tmp_path: Path) -> None:
    small = random_file(tmp_path / "src" / "small.bin", 1000, seed=1)
    big = random_file(tmp_path / "src" / "big.bin", 3 * 1024 * 1024 + 5, seed=2)
    _busy(proxy, "create_container", "put_blob", "put_block", "put_block_list", "get_block_list")
    url = f"{proxy.endpoint()}/{container.name}/up"
    summary = _cli("cp", "-r", "--as-subdir=false", str(tmp_path / "src"), url, "--block-size-mb", "1",
                   tmp_path=tmp_path)
    injected = _faults(proxy)
    assert injected >= 4
    assert summary["retries"] == injected
    assert container.download("up/small.bin") == small
    assert container.download("up/big.bin") == big


def test_download_of_one_blob_retries_its_properties_and_body(container: ContainerHandle, proxy: FaultProxy,
                                                              tmp_path: Path) -> None:
    data = random_file(tmp_path / "orig.bin", 3 * 1024 * 1024 + 5, seed=3)
    container.client.upload_blob("one.bin", data)
    _busy(proxy, "get_properties", "get_blob", times=2)
    summary = _cli("cp", f"{proxy.endpoint()}/{container.name}/one.bin", str(tmp_path / "got.bin"),
                   "--block-size-mb", "1", tmp_path=tmp_path)
    injected = _faults(proxy)
    assert injected >= 2 and summary["retries"] == injected
    assert (tmp_path / "got.bin").read_bytes() == data


def test_download_of_a_prefix_retries_its_listing(container: ContainerHandle, proxy: FaultProxy,
                                                  tmp_path: Path) -> None:
    blobs = {f"p/{i}.bin": bytes([i]) * (100 + i) for i in range(5)}
    for name, data in blobs.items():
        container.client.upload_blob(name, data)
    _busy(proxy, "list_blobs", "get_blob", times=2)
    summary = _cli("cp", "-r", "--as-subdir=false", f"{proxy.endpoint()}/{container.name}/p", str(tmp_path / "dl"),
                   tmp_path=tmp_path)
    assert _faults(proxy) == 4 and summary["retries"] == 4
    got = {p.name: p.read_bytes() for p in (tmp_path / "dl").rglob("*") if p.is_file()}
    assert got == {name.removeprefix("p/"): data for name, data in blobs.items()}


@pytest.mark.parametrize(("busy_ops", "extra"), [(("list_blobs",), ()), (("batch",), ()),
                                                (("batch",), ("--max-delete", "30"))])
def test_sync_deletes_under_503_retry_and_every_reported_deletion_is_gone(
    busy_ops: tuple[str, ...], extra: tuple[str, ...], container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    keep = random_file(src / "keep.bin", 10, seed=4)
    for i in range(30):
        container.client.upload_blob(f"d/stale{i}.bin", b"x")
    container.client.upload_blob("d/keep.bin", keep)
    _busy(proxy, *busy_ops, times=3)
    summary = _cli("sync", str(src), f"{proxy.endpoint()}/{container.name}/d", "--delete-destination", "true",
                   *extra, tmp_path=tmp_path)
    assert _faults(proxy) == 3 and summary["retries"] == 3
    assert summary["files_deleted"] == 30
    assert container.blob_names() == ["d/keep.bin"]


@pytest.mark.parametrize("recursive", [True, False])
def test_rm_under_503_retries_and_removes(recursive: bool, container: ContainerHandle, proxy: FaultProxy,
                                          tmp_path: Path) -> None:
    for i in range(12):
        container.client.upload_blob(f"r/{i}.bin", b"x")
    container.client.upload_blob("other.bin", b"y")
    _busy(proxy, "list_blobs", "get_properties", "delete_blob", "batch", times=2)
    target = [f"{proxy.endpoint()}/{container.name}/r", "-r"] if recursive else \
        [f"{proxy.endpoint()}/{container.name}/r/3.bin"]
    done = run(["rm", *target, "--output-type", "json", "--quiet"])
    assert "Traceback" not in done.stderr and "never awaited" not in done.stderr, done.stderr
    assert done.returncode == 0, (done.stdout, done.stderr)
    summary = _summary(done.stdout)
    injected = _faults(proxy)
    assert injected >= 2 and summary["retries"] == injected
    remaining = container.blob_names()
    if recursive:
        assert summary["files_deleted"] == 12 and remaining == ["other.bin"]
    else:
        assert summary["files_deleted"] == 1 and "r/3.bin" not in remaining and len(remaining) == 12


def test_ls_retries_its_listing(container: ContainerHandle, proxy: FaultProxy) -> None:
    for i in range(3):
        container.client.upload_blob(f"l/{i}.bin", b"z" * i)
    _busy(proxy, "list_blobs", times=2)
    done = run(["ls", f"{proxy.endpoint()}/{container.name}/l", "--output-type", "json"])
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    names = [json.loads(line).get("name") for line in done.stdout.splitlines() if '"name"' in line]
    assert len([n for n in names if n]) == 3
    assert _faults(proxy) == 2
