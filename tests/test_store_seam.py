"""The storage seam from outside: a store registered by a package that is not blobsync carries a sync both ways,
and the engine's recovery paths run against the in-memory store's injected faults (no HTTP, no Azurite)."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import blobsync
from blobsync import TransferConfig
from blobsync.backends import memory
from blobsync.backends.base import PLACEHOLDER
from blobsync.config import MiB
from blobsync.errors import NetworkError, ThrottledError
from blobsync.events import Progress
from blobsync.jobs.sync import DeleteMode
from support import toystore
from support.cli import random_file


def _config(tmp_path: Path, **kwargs: object) -> TransferConfig:
    return TransferConfig.from_mib(block_size_mb=1, journal_path=tmp_path / "j.db", max_retries=3, **kwargs)


def _tree(root: Path) -> dict[str, bytes]:
    files = {"a.txt": 10, "sub/b.bin": 2 * MiB + 17, "sub/deep/c.bin": 0, "big.bin": 5 * MiB + 1}
    return {rel: random_file(root / rel, size, seed=i) for i, (rel, size) in enumerate(files.items())}


@pytest.fixture
def toy_box(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "toy-box"
    root.mkdir()
    name = f"box{uuid.uuid4().hex[:8]}"
    toystore.ROOTS[name] = root
    yield name, root
    del toystore.ROOTS[name]


def _toy_bytes(root: Path, name: str) -> bytes:
    from urllib.parse import quote

    return (root / quote(name, safe="")).read_bytes()  # read from the toy's own files, not through blobsync


def test_a_store_registered_from_outside_carries_a_sync_both_ways(tmp_path: Path, toy_box: tuple[str, Path]
                                                                  ) -> None:
    name, root = toy_box
    files = _tree(tmp_path / "src")
    report = blobsync.sync(tmp_path / "src", f"toy://{name}/run1", _config(tmp_path))
    assert report.ok and report.files_transferred == len(files)
    for rel, data in files.items():
        assert _toy_bytes(root, f"run1/{rel}") == data

    again = blobsync.sync(tmp_path / "src", f"toy://{name}/run1", _config(tmp_path))
    assert again.ok and again.files_transferred == 0  # compared through the toy's listing: in sync

    down = blobsync.sync(f"toy://{name}/run1", tmp_path / "down", _config(tmp_path))
    assert down.ok and down.files_transferred == len(files)
    for rel, data in files.items():
        assert (tmp_path / "down" / rel).read_bytes() == data

    (tmp_path / "src" / "a.txt").unlink()  # a toy has no batch deletes: the engine deletes one by one
    pruned = blobsync.sync(tmp_path / "src", f"toy://{name}/run1", _config(tmp_path), delete=DeleteMode.TRUE)
    assert pruned.ok and pruned.files_deleted == 1
    assert not (root / "run1%2Fa.txt").exists()


@pytest.fixture
def box() -> Iterator[memory.Container]:
    container = memory.container(f"seam-{uuid.uuid4().hex[:10]}")
    yield container
    memory.drop(container.name)


def test_parts_and_puts_that_fail_for_a_moment_are_retried(tmp_path: Path, box: memory.Container) -> None:
    files = _tree(tmp_path / "src")
    box.faults.add("stage", lambda: NetworkError("connection reset"), times=3)
    box.faults.add("put", lambda: ThrottledError("503 ServerBusy", status=503, retry_after=0.01), times=1)
    report = blobsync.sync(tmp_path / "src", f"memory://{box.name}", _config(tmp_path))
    assert report.ok and report.retries >= 4
    assert {n: o.data for n, o in box.objects.items()} == files


def test_a_commit_whose_answer_was_lost_is_found_landed(tmp_path: Path, box: memory.Container) -> None:
    """The commit took effect, its answer never came: the retry is refused (its parts are committed now), and the
    engine finds its own parts committed instead of reporting work never done or sending it all again."""
    data = random_file(tmp_path / "f.bin", 3 * MiB + 5, seed=3)
    box.faults.add("commit", lambda: NetworkError("read timed out"), after=True)
    report = blobsync.copy(tmp_path / "f.bin", f"memory://{box.name}/f.bin", _config(tmp_path))
    assert report.ok and report.files_transferred == 1
    assert box.objects["f.bin"].data == data
    assert box.faults.calls["stage"] == 4  # every part once: nothing was sent twice
    assert box.faults.calls["commit"] == 2  # landed (answer lost), then refused (parts gone): found as ours


def _lose_the_commit_answer(box: memory.Container) -> None:
    box.faults.add("commit", lambda: NetworkError("read timed out"), after=True)


def test_a_create_only_commit_whose_answer_was_lost_is_ours_not_a_conflict(tmp_path: Path, box: memory.Container
                                                                           ) -> None:
    """--overwrite false: the retry of a commit that landed is refused as 'exists'; the blob is this job's own."""
    data = random_file(tmp_path / "f.bin", 3 * MiB + 5, seed=3)
    _lose_the_commit_answer(box)
    report = blobsync.copy(tmp_path / "f.bin", f"memory://{box.name}/f.bin", _config(tmp_path, overwrite="false"))
    assert report.ok and report.files_transferred == 1, report.failures
    assert box.objects["f.bin"].data == data
    assert box.faults.calls["stage"] == 4


def test_a_streamed_write_whose_commit_answer_was_lost_lands_once(tmp_path: Path, box: memory.Container) -> None:
    chunks = [os.urandom(700 * 1024) for _ in range(5)]
    _lose_the_commit_answer(box)
    with blobsync.Client(f"memory://{box.name}", _config(tmp_path)) as client:
        result = client.put(iter(chunks), "stream.bin")
    assert box.objects["stream.bin"].data == b"".join(chunks)
    assert result.etag == box.objects["stream.bin"].etag and box.faults.calls["commit"] == 2


def test_a_service_copy_whose_commit_answer_was_lost_lands_once(tmp_path: Path, box: memory.Container) -> None:
    source = memory.container(f"seam-src-{uuid.uuid4().hex[:8]}")
    try:
        data = os.urandom(3 * MiB + 7)
        with blobsync.Client(f"memory://{source.name}", _config(tmp_path)) as client:
            client.put(data, "big.bin")
        _lose_the_commit_answer(box)
        report = blobsync.copy(f"memory://{source.name}/big.bin", f"memory://{box.name}/big.bin",
                               _config(tmp_path))
        assert report.ok and report.files_transferred == 1, report.failures
        assert box.objects["big.bin"].data == data
        assert box.faults.calls["stage_from"] == 4  # every part once
    finally:
        memory.drop(source.name)


def test_a_get_of_a_blob_that_changes_meanwhile_reads_the_new_version(tmp_path: Path, box: memory.Container
                                                                      ) -> None:
    from blobsync.errors import ConflictError

    with blobsync.Client(f"memory://{box.name}", _config(tmp_path)) as client:
        client.put(os.urandom(3 * MiB + 9), "f.bin")
        new = os.urandom(3 * MiB + 1)

        def overwritten() -> BaseException:  # the blob is rewritten between the first bytes and the rest
            old = box.objects["f.bin"]
            headers = replace(old.headers, content_md5=hashlib.md5(new).digest())
            box.objects["f.bin"] = memory._Object(new, '"0xNEW"', old.modified, headers)
            return ConflictError("get blob: HTTP 412 ConditionNotMet", status=412, code="ConditionNotMet")

        box.faults.add("read_into", overwritten)
        assert client.get("f.bin") == new


def test_parts_another_tool_left_are_cleared_and_the_file_goes_up(tmp_path: Path, box: memory.Container) -> None:
    data = random_file(tmp_path / "f.bin", 2 * MiB + 1, seed=4)
    box.staged["f.bin"] = {"another-tool-block-id-of-another-length": b"junk"}
    report = blobsync.copy(tmp_path / "f.bin", f"memory://{box.name}/f.bin", _config(tmp_path))
    assert report.ok
    assert box.objects["f.bin"].data == data


def test_clearing_parts_another_tool_left_makes_no_blob_a_later_run_would_skip(tmp_path: Path,
                                                                                box: memory.Container) -> None:
    """--overwrite false, no blob yet, another tool's parts there: clearing them must not leave an (empty) blob
    that the next run takes for the destination's own and skips: exit 0 with nothing uploaded."""
    from blobsync.errors import ServiceError

    data = random_file(tmp_path / "f.bin", 2 * MiB + 1, seed=6)
    box.staged["f.bin"] = {"another-tool-block-id-of-another-length": b"junk"}
    box.faults.add("commit", lambda: ServiceError("HTTP 500 InternalError", status=500), times=100)
    first = blobsync.copy(tmp_path / "f.bin", f"memory://{box.name}/f.bin", _config(tmp_path, overwrite="false"))
    assert not first.ok and "f.bin" not in box.objects
    box.faults.clear()
    again = blobsync.copy(tmp_path / "f.bin", f"memory://{box.name}/f.bin", _config(tmp_path, overwrite="false"))
    assert again.ok and again.files_transferred == 1, again.skipped_notes
    assert box.objects["f.bin"].data == data



def test_a_placeholder_is_this_writes_own_or_it_is_a_users_blob(tmp_path: Path, box: memory.Container) -> None:
    """An empty object made to drop another tool's parts carries the write's nonce: one its crash left is taken
    for no object by that write's resume; any other (another tool's `blobsyncplaceholder: 1`) is a blob like any
    other, which --overwrite false leaves alone on the job paths and the Client alike (issue 51: they disagreed)."""
    import sqlite3

    from blobsync.errors import ConflictError, ServiceError

    with blobsync.Client(f"memory://{box.name}", _config(tmp_path, overwrite="false")) as client:
        client.put(b"", "g.bin")
        box.objects["g.bin"].headers = replace(box.objects["g.bin"].headers, metadata={PLACEHOLDER: "1"})
        random_file(tmp_path / "g.bin", 100, seed=7)
        third = blobsync.copy(tmp_path / "g.bin", f"memory://{box.name}/g.bin", _config(tmp_path, overwrite="false"))
        assert third.ok and third.files_transferred == 0 and box.objects["g.bin"].data == b""
        with pytest.raises(ConflictError):
            client.put(b"x" * 100, "g.bin")
        assert box.objects["g.bin"].data == b""

    data = random_file(tmp_path / "h.bin", 2 * MiB + 1, seed=8)  # in blocks: its nonce is journaled
    box.faults.add("commit", lambda: ServiceError("HTTP 500 InternalError", status=500), times=100)
    first = blobsync.copy(tmp_path / "h.bin", f"memory://{box.name}/h.bin", _config(tmp_path, overwrite="false"))
    assert not first.ok
    box.faults.clear()
    with sqlite3.connect(tmp_path / "j.db") as db:
        (nonce,) = db.execute("select nonce from files where rel = 'h.bin'").fetchone()
    with blobsync.Client(f"memory://{box.name}", _config(tmp_path)) as client:  # its crash's leftover
        client.put(b"", "h.bin")
    box.objects["h.bin"].headers = replace(box.objects["h.bin"].headers, metadata={PLACEHOLDER: nonce})
    again = blobsync.copy(tmp_path / "h.bin", f"memory://{box.name}/h.bin", _config(tmp_path, overwrite="false"))
    assert again.ok and again.files_transferred == 1 and box.objects["h.bin"].data == data


def test_a_store_that_keeps_failing_stops_the_job_resumable(tmp_path: Path, box: memory.Container) -> None:
    data = random_file(tmp_path / "f.bin", 4 * MiB, seed=5)
    box.faults.add("stage", lambda: NetworkError("connection refused"), times=100, name="f.bin")
    with pytest.raises(NetworkError):
        blobsync.copy(tmp_path / "f.bin", f"memory://{box.name}/f.bin", _config(tmp_path))
    assert "f.bin" not in box.objects
    box.faults.clear()
    report = blobsync.copy(tmp_path / "f.bin", f"memory://{box.name}/f.bin", _config(tmp_path))
    assert report.ok and box.objects["f.bin"].data == data


def test_an_error_that_no_retry_fixes_fails_the_file_and_the_rest_go_up(tmp_path: Path, box: memory.Container
                                                                         ) -> None:
    from blobsync.errors import ServiceError

    files = _tree(tmp_path / "src")
    box.faults.add("put", lambda: ServiceError("HTTP 400 InvalidHeaderValue", status=400), name="a.txt")
    report = blobsync.sync(tmp_path / "src", f"memory://{box.name}", _config(tmp_path))
    assert not report.ok and [f.rel for f in report.failures] == ["a.txt"]
    assert sorted(box.objects) == sorted(set(files) - {"a.txt"})


def test_a_download_whose_range_arrives_damaged_is_fetched_again(tmp_path: Path, box: memory.Container) -> None:
    files = _tree(tmp_path / "src")
    assert blobsync.sync(tmp_path / "src", f"memory://{box.name}", _config(tmp_path)).ok
    real_read = memory.MemoryStore.read_into
    damaged: list[int] = []

    async def flaky(self: memory.MemoryStore, name: str, offset: int, buf: memoryview, if_match: str | None = None,
                    *, range_md5: bool = False) -> blobsync.BlobProperties:
        props = await real_read(self, name, offset, buf, if_match, range_md5=range_md5)
        if name == "big.bin" and offset == MiB and not damaged:
            damaged.append(offset)
            buf[0] ^= 0xFF  # one bit flipped on the way
        return props

    mp = pytest.MonkeyPatch()
    mp.setattr(memory.MemoryStore, "read_into", flaky)
    try:
        report = blobsync.sync(f"memory://{box.name}", tmp_path / "down", _config(tmp_path))
    finally:
        mp.undo()
    assert report.ok and damaged == [MiB] and report.retries >= 1
    for rel, data in files.items():
        assert (tmp_path / "down" / rel).read_bytes() == data
    assert os.path.exists(tmp_path / "down" / "sub" / "deep" / "c.bin")


def test_a_file_that_changed_during_its_upload_commits_nothing_and_leaves_no_parts(tmp_path: Path,
                                                                                  box: memory.Container) -> None:
    path = tmp_path / "f.bin"
    random_file(path, 3 * MiB + 1, seed=6)

    def grow_then_fail() -> NetworkError:
        with open(path, "ab") as f:  # the writer of the file appends while the upload runs
            f.write(b"more")
        return NetworkError("connection reset")

    box.faults.add("stage", grow_then_fail)
    report = blobsync.copy(path, f"memory://{box.name}/f.bin", _config(tmp_path))
    assert not report.ok and "changed while it was being uploaded" in report.failures[0].reason
    assert "f.bin" not in box.objects
    assert not box.staged.get("f.bin")  # the parts of a version that no longer exists were dropped


class _InProcess:
    """A RemoteRunner that runs the items here, one by one: what a cluster does, without one."""

    def __init__(self) -> None:
        self.files = 0

    async def run(self, ctx: object, job_id: str, local_root: Path, report: blobsync.Report,
                  items: object, totals: tuple[int, int], settle: Callable[..., None], base: Path) -> None:
        from blobsync.jobs.ops import Performer

        perform = Performer(ctx, local_root)  # type: ignore[arg-type]
        for item in items:  # type: ignore[attr-defined]
            settle(report, item.row, await perform(item.row, item.op))
            self.files += 1


def test_a_job_for_a_cluster_lists_its_destination_one_prefix_at_a_time(tmp_path: Path, box: memory.Container
                                                                         ) -> None:
    import asyncio

    from blobsync.engine.session import Session
    from blobsync.filters import Filters
    from blobsync.jobs.spec import SyncSpec
    from blobsync.jobs.sync import SyncJob
    from blobsync.journal import Journal

    files = _tree(tmp_path / "src")
    assert blobsync.sync(tmp_path / "src", f"memory://{box.name}/run", _config(tmp_path)).ok
    box.faults.calls.clear()
    url = f"memory://{box.name}/run"
    runner = _InProcess()

    async def down() -> blobsync.Report:
        journal = Journal(tmp_path / "j2.db")
        config = TransferConfig(preserve_last_modified_time=True, recursive=True, journal_path=tmp_path / "j2.db")
        try:
            session = Session(config, os.environ, journal)
            try:
                ctx = session.context(url, config, progress=Progress())
                spec = SyncSpec(tmp_path / "down", ctx.store.location, False, Filters())
                return await SyncJob(spec, ctx, cluster=runner).run()
            finally:
                await session.close()
        finally:
            journal.close()

    report = asyncio.run(down())
    assert report.ok and runner.files == len(files)
    # Fanned out: each level of run/, run/sub/ and run/sub/deep/ (fewer folders than listings in flight).
    assert box.faults.calls["list_level"] == 3 and "list_page" not in box.faults.calls
    for rel, data in files.items():
        assert (tmp_path / "down" / rel).read_bytes() == data


def test_a_failed_cluster_shard_counts_a_download_done_only_if_the_planned_version_is_there(tmp_path: Path) -> None:
    """After a shard failed its tries, a file of the same size at the target may be the old one (a sync down of a
    changed blob of equal size): only the blob's own mtime, kept on the file, says it is the new one."""
    import asyncio
    from types import SimpleNamespace

    from blobsync.cluster.client import ClusterTransfer
    from blobsync.jobs.ops import FileOp, OpKind

    target = tmp_path / "f.bin"
    target.write_bytes(b"old bytes!")
    planned = FileOp(OpKind.DOWNLOAD, "f.bin", "f.bin", 10, 1_700_000_000_123_456_789, nonce="0" * 16)
    transfer = ClusterTransfer(None, "memory://c", upload=False)  # type: ignore[arg-type]
    transfer.local_root = tmp_path
    keeps = SimpleNamespace(config=TransferConfig(preserve_last_modified_time=True))

    def done(ctx: object) -> bool:
        return asyncio.run(transfer._completed(ctx, planned))  # type: ignore[arg-type]

    assert not done(keeps)  # same size, another mtime: the old file
    os.utime(target, ns=(planned.mtime_ns, planned.mtime_ns))
    assert done(keeps)  # the blob's mtime, as the finished download sets it
    assert not done(SimpleNamespace(config=TransferConfig()))  # mtimes not kept: nothing tells them apart


def test_a_store_from_outside_plans_its_own_part_sizes(tmp_path: Path, toy_box: tuple[str, Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine plans parts from the store's capabilities, not Azure's limits: a toy store that takes at most
    3 parts gets a 10 MiB file (1 MiB asked) in 3 parts of 4 MiB."""
    from dataclasses import replace as replaced

    from blobsync.engine.blocks import choose_block_size

    name, root = toy_box
    monkeypatch.setattr(toystore.ToyStore, "capabilities", replaced(toystore.ToyStore.capabilities, max_parts=3))
    data = random_file(tmp_path / "big.bin", 10 * MiB, seed=3)
    report = blobsync.copy(tmp_path / "big.bin", f"toy://{name}/big.bin", _config(tmp_path))
    assert report.files_transferred == 1 and _toy_bytes(root, "big.bin") == data
    committed = json.loads((root / "big.bin.json").read_text())["parts"]
    assert [size for _, size in committed] == [4 * MiB, 4 * MiB, 2 * MiB]  # the store's own limit planned them
    assert choose_block_size(10 * MiB, MiB, toystore.ToyStore.capabilities) == 4 * MiB
    with pytest.raises(blobsync.SourceError, match="3 parts"):
        choose_block_size(3 * toystore.ToyStore.capabilities.max_part_size + 1, MiB, toystore.ToyStore.capabilities)


@pytest.mark.parametrize(("options", "words"), [
    ({"tier": "Cool"}, "--block-blob-tier Cool: toy://"), ({"properties": {"cache_control": "no-cache"}},
                                                          "--cache-control: toy://"),
    ({"blob_tags": {"team": "ml"}}, "--blob-tags: toy://")])
def test_a_write_option_the_store_cannot_keep_is_refused_before_anything_moves(
        tmp_path: Path, toy_box: tuple[str, Path], options: dict[str, object], words: str) -> None:
    """A store's write options are its own (the toy keeps no tier, header property or tag): asking for one is a
    usage error before any file moves, never an option dropped in silence."""
    name, root = toy_box
    random_file(tmp_path / "src" / "a.bin", 1000, seed=1)
    with pytest.raises(blobsync.UsageError, match=words.replace(".", r"\.")):
        blobsync.sync(tmp_path / "src", f"toy://{name}/x", _config(tmp_path, **options))
    assert not list(root.iterdir())  # nothing written
    plain = blobsync.sync(tmp_path / "src", f"toy://{name}/x", _config(tmp_path))
    assert plain.ok and plain.files_transferred == 1


def test_a_backend_is_opened_with_its_connection_and_refuses_a_credential_it_cannot_use() -> None:
    """Backend.open takes the Connection (read once from the options) and the credential as declared parameters:
    no probing for which backends take one (issue 39, point 5)."""
    import pytest

    from blobsync.backends.registry import Connection, open_store
    from blobsync.config import TransferConfig
    from blobsync.errors import UsageError

    config = TransferConfig(concurrency=12, stall_timeout=30, trusted_suffixes=("example.org",))
    assert Connection.of(config) == Connection(16, 30.0, None, ("example.org",))
    for url in ("memory://seam/c", "s3://bucket/prefix"):
        with pytest.raises(UsageError, match="takes no credential object"):
            open_store(url, config, {}, credential="sv=1&sig=x")


def test_a_store_registered_from_outside_reaches_the_client_and_torch(tmp_path: Path, toy_box: tuple[str, Path]
                                                                      ) -> None:
    """The Client and blobsync.torch take their URL schemes from the backend registry: a new backend reaches them."""
    from blobsync.torch.dcp import BlobStorageWriter

    name, root = toy_box
    with blobsync.Client(f"toy://{name}", _config(tmp_path)) as client:
        client.put(b"weights" * 1000, "m/w.bin")
        assert client.get("m/w.bin") == b"weights" * 1000
    assert _toy_bytes(root, "m/w.bin") == b"weights" * 1000
    assert BlobStorageWriter.validate_checkpoint_id(f"toy://{name}/ckpt/step-1")
    assert not BlobStorageWriter.validate_checkpoint_id(str(tmp_path / "ckpt"))
