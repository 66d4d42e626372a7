"""Library arguments mean what a Python caller writes: False is false, "false" is false, and anything else is a
UsageError naming the argument, raised before any request (issue 26, point 1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import blobsync
from blobsync import DeleteMode, Overwrite, TransferConfig, UsageError
from blobsync.config import BlockCheck, CheckMd5, Flag
from conftest import ContainerHandle
from support.proxy import FaultProxy

NOWHERE = "http://127.0.0.1:1/devstoreaccount1/cont"  # nothing listens: an error here proves no request was made


def _tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "keep.txt").write_bytes(b"keep")
    return src


@pytest.mark.parametrize("delete", [False, "false", "FALSE", DeleteMode.FALSE])
def test_delete_false_in_any_spelling_keeps_the_destinations_orphans(
        container: ContainerHandle, tmp_path: Path, delete: Any) -> None:
    container.client.upload_blob("orphan.txt", b"precious")
    report = blobsync.sync(_tree(tmp_path), container.url, TransferConfig(journal_path=tmp_path / "j.db"),
                           delete=delete)
    assert report.files_failed == 0
    assert container.blob_names() == ["keep.txt", "orphan.txt"]
    assert container.download("orphan.txt") == b"precious"


@pytest.mark.parametrize("delete", [True, "true", DeleteMode.TRUE])
def test_delete_true_in_any_spelling_deletes_them(container: ContainerHandle, tmp_path: Path, delete: Any) -> None:
    container.client.upload_blob("orphan.txt", b"old")
    blobsync.sync(_tree(tmp_path), container.url, TransferConfig(journal_path=tmp_path / "j.db"), delete=delete)
    assert container.blob_names() == ["keep.txt"]


@pytest.mark.parametrize("overwrite", [False, "false", Overwrite.FALSE])
def test_overwrite_false_in_any_spelling_keeps_the_existing_blob(
        container: ContainerHandle, tmp_path: Path, overwrite: Any) -> None:
    container.client.upload_blob("keep.txt", b"already there")
    config = TransferConfig(overwrite=overwrite, journal_path=tmp_path / "j.db")
    assert config.overwrite is Overwrite.FALSE
    report = blobsync.copy(_tree(tmp_path) / "keep.txt", container.url, config)
    assert report.files_skipped == 1
    assert container.download("keep.txt") == b"already there"


@pytest.mark.parametrize(("call", "named"), [
    (lambda src: blobsync.sync(src, NOWHERE, delete="yes"), "delete"),
    (lambda src: blobsync.sync(src, NOWHERE, delete=0), "delete"),
    (lambda src: blobsync.sync(src, NOWHERE, delete=None), "delete"),
    (lambda src: blobsync.sync(src, NOWHERE, compare="newest"), "compare"),
    (lambda src: blobsync.sync(src, NOWHERE, dry_run="false"), "dry_run"),
    (lambda src: blobsync.sync(src, NOWHERE, raise_on_error="no"), "raise_on_error"),
    (lambda src: blobsync.sync(src, NOWHERE, subscribers=print), "subscribers"),
    (lambda src: blobsync.sync(src, NOWHERE, subscribers=[print]), "subscriber"),
    (lambda src: blobsync.sync(src, NOWHERE, max_delete="lots"), "--max-delete"),
    (lambda src: blobsync.sync(src, NOWHERE, on_action="print"), "on_action"),
    (lambda src: blobsync.sync(src, NOWHERE, config={"concurrency": 4}), "config"),
    (lambda src: blobsync.copy(src, NOWHERE, as_subdir="false"), "as_subdir"),
    (lambda src: blobsync.copy(src, 42), "dest"),
    (lambda src: blobsync.copy(src, NOWHERE, filters="*.pt"), "filters"),
    (lambda src: blobsync.watch(src, NOWHERE, settle=float("nan")), "settle"),
    (lambda src: blobsync.watch(src, NOWHERE, stop="now"), "stop"),
    (lambda src: blobsync.remove(NOWHERE, recursive="yes"), "recursive"),
    (lambda src: blobsync.resume("abc", overrides={"concurency": 4}), "concurency"),
    (lambda src: blobsync.list_blobs(NOWHERE, max_retries=-1), "max_retries"),
    (lambda src: TransferConfig(overwrite="sometimes"), "overwrite"),
    (lambda src: TransferConfig(overwrite=None), "overwrite"),
    (lambda src: TransferConfig(recursive="false"), "recursive"),
    (lambda src: TransferConfig(concurrency="lots"), "--concurrency"),
    (lambda src: TransferConfig(concurrency=True), "--concurrency"),
    (lambda src: TransferConfig(block_size=1), "block_size"),
    (lambda src: TransferConfig(cap_mbps=float("nan")), "cap_mbps"),
    (lambda src: TransferConfig(cap_mbps=float("inf")), "cap_mbps"),
    (lambda src: TransferConfig(stall_timeout=float("nan")), "stall_timeout"),
    (lambda src: TransferConfig(retry_deadline=float("inf")), "retry_deadline"),
    (lambda src: TransferConfig(max_retries=2.5), "max_retries"),
    (lambda src: TransferConfig.from_mib(block_size_mb=0.000001), "--block-size-mb"),
    (lambda src: TransferConfig.from_mib(memory_mb=float("nan")), "--memory-mb"),
])
def test_a_bad_argument_is_a_usage_error_naming_it_before_any_request(
        tmp_path: Path, call: Any, named: str) -> None:
    with pytest.raises(UsageError) as caught:
        call(_tree(tmp_path))
    assert named in str(caught.value)
    assert "\n" not in str(caught.value)


def test_ranges_are_stated_as_a_person_writes_them() -> None:
    with pytest.raises(UsageError) as caught:
        TransferConfig.from_mib(block_size_mb=0.000001)
    assert "1 KiB to 4000 MiB" in str(caught.value)
    with pytest.raises(UsageError) as caught:
        TransferConfig(cap_mbps=float("inf"))
    assert "Mbit/s" in str(caught.value) and "inf" in str(caught.value)


def test_a_reused_progress_gets_its_subscribers_once(container: ContainerHandle, tmp_path: Path) -> None:
    done: list[str] = []

    class Count(blobsync.BaseSubscriber):
        def on_done(self, result: blobsync.FileResult) -> None:
            done.append(result.rel)

    progress, counter = blobsync.Progress(), Count()
    src = _tree(tmp_path)
    for i in range(3):
        (src / "keep.txt").write_bytes(b"v%d" % i)
        blobsync.copy(src / "keep.txt", container.url, TransferConfig(journal_path=tmp_path / "j.db"),
                      progress=progress, subscribers=[counter])
    assert len(progress.subscribers) == 1
    assert len(done) == 3


def test_two_threads_running_one_job_refuse_the_second(container: ContainerHandle, tmp_path: Path) -> None:
    import threading

    from blobsync.journal import Journal

    src = _tree(tmp_path)
    journal_path = tmp_path / "j.db"
    first = Journal(journal_path)
    job = first.create_job(*_job_args(src, container.url))
    first.claim_job(job)  # as a running call in another thread of this process holds it
    errors: list[BaseException] = []

    def second() -> None:
        other = Journal(journal_path)
        try:
            other.claim_job(other.get_job(job.id))
        except BaseException as exc:
            errors.append(exc)
        finally:
            other.close()

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], blobsync.JobBusyError), errors
    first.close()  # released: now it may run again
    again = Journal(journal_path)
    again.claim_job(again.get_job(job.id))
    again.close()


def _job_args(src: Path, url: str) -> tuple[object, ...]:
    from blobsync.journal import JobKind

    return (JobKind.UPLOAD, str(src), url, {})


def test_the_library_logger_has_a_null_handler_and_not_found_has_a_status(
        container: ContainerHandle, tmp_path: Path) -> None:
    import subprocess
    import sys

    # In a fresh process: the CLI tests run in this one set the command's own handlers.
    probe = "import blobsync, logging; print(any(isinstance(h, logging.NullHandler) " \
            "for h in logging.getLogger('blobsync').handlers))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60).stdout.strip() == "True"
    with pytest.raises(blobsync.BlobNotFoundError) as caught:
        blobsync.copy(container.url + "/missing.bin", tmp_path / "out.bin",
                      TransferConfig(journal_path=tmp_path / "j.db"))
    assert caught.value.status == 404 and caught.value.code == "BlobNotFound"


def test_an_error_that_stops_a_job_carries_its_id_and_the_partial_report(
        container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    from blobsync.config import MiB
    from support.cli import random_file
    from support.proxy import Rule, reset_before

    src = tmp_path / "many"
    for i in range(3):
        random_file(src / f"small{i}.bin", 1000, seed=i)
    random_file(src / "zbig.bin", 3 * MiB, seed=9)
    proxy.add_rule(Rule("put_block", reset_before()))  # the network is gone for blocks: the job stops
    config = TransferConfig.from_mib(block_size_mb=1, put_blob_size_mb=1, journal_path=tmp_path / "j.db",
                                     max_retries=0, recursive=True, concurrency=1)
    with pytest.raises(blobsync.BlobsyncError) as caught:
        blobsync.copy(src, f"{proxy.endpoint()}/{container.name}", config, as_subdir=False)
    err = caught.value
    assert err.scope is not blobsync.Scope.FILE
    assert err.job_id and err.report is not None
    assert err.report.job_id == err.job_id
    assert err.report.files_transferred == 3  # the small files landed before the big one stopped the job
    assert sorted(container.blob_names()) == ["small0.bin", "small1.bin", "small2.bin"]


@dataclass(frozen=True)
class _Extended(TransferConfig):
    """A config with fields added later: an enum and a bool, as a new flag would add them."""

    mode: CheckMd5 = field(default=CheckMd5.NO_CHECK, metadata={"flag": Flag("--mode")})
    strict: bool = field(default=False, metadata={"flag": Flag("--strict/--lenient", kind=bool)})


def test_a_new_enum_field_round_trips_through_the_journal_options() -> None:
    config = _Extended(mode=CheckMd5.FAIL_IF_DIFFERENT_OR_MISSING, strict=True, overwrite=Overwrite.FALSE,
                       block_check=BlockCheck.MD5)
    stored = config.journal_options()
    assert stored["mode"] == "FailIfDifferentOrMissing"  # plain words in the journal
    back = _Extended.from_journal(stored)
    assert back.mode is CheckMd5.FAIL_IF_DIFFERENT_OR_MISSING and back.strict is True
    assert back.overwrite is Overwrite.FALSE and back.block_check is BlockCheck.MD5
    assert back == config


def test_max_delete_is_read_once_into_a_typed_value() -> None:
    """--max-delete and sync(max_delete=...) become a MaxDelete where they enter (issue 39, point 4)."""
    import pytest

    from blobsync import MaxDelete, UsageError

    assert MaxDelete.parse(None) is None
    assert MaxDelete.parse(12) == MaxDelete("12", count=12)
    assert MaxDelete.parse(" 5% ") == MaxDelete("5%", percent=5.0)
    same = MaxDelete("7", count=7)
    assert MaxDelete.parse(same) is same
    for bad in ("-1", "101%", "lots", True, 2.5, "%"):
        with pytest.raises(UsageError, match="invalid --max-delete"):
            MaxDelete.parse(bad)


def test_wrong_arguments_that_reached_inside_are_one_line(container: ContainerHandle, tmp_path: Path) -> None:
    """Issue 51: each of these was a TypeError from inside, a silent empty answer, or a date moved a day."""
    from blobsync.engine.mtime import parse_mtime
    from blobsync.torch import IterableBlobDataset

    assert parse_mtime("2024-02-30T00:00:00Z") is None and parse_mtime("2023-02-29T00:00:00Z") is None
    assert parse_mtime("2024-02-29T00:00:00Z") == 1709164800 * 10**9
    for kwargs in ({"seed": "x"}, {"rank": 0.5}, {"world_size": "2"}, {"read_ahead_bytes": 1.5}):
        with pytest.raises(UsageError, match=f"invalid {next(iter(kwargs))}="):
            IterableBlobDataset(f"{container.url}/x", **kwargs)  # type: ignore[arg-type]
    config = TransferConfig(journal_path=tmp_path / "j.db")
    env = {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}
    with blobsync.Client(container.url, config, env=env) as client:
        with pytest.raises(UsageError, match="a chunk of str, where bytes-like data is written"):
            client.put(iter(["text", "chunks"]), "x.txt")
        assert "x.txt" not in container.blob_names()
        client.put(b"hello", "y.txt")
        with pytest.raises(UsageError, match="the end is before the start"):
            client.read_ranges([("y.txt", 3, 1)])
        assert client.read_ranges([("y.txt", 1, 3), ("y.txt", -2, None), ("y.txt", 2, 2)]) == [b"el", b"lo", b""]
