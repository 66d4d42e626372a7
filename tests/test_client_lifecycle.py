"""The Client inside a training process (issue 38, points 1-3): background pushes that land whatever ends the
process, done-callbacks that may call the Client, fork and spawn. Every push is read back with the SDK."""

from __future__ import annotations

import multiprocessing
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import blobsync
from blobsync.config import MiB
from blobsync.errors import BlobsyncError, DroppedError
from conftest import ContainerHandle
from support.cli import clean_env

EMULATOR = {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}


def _script(body: str, container: ContainerHandle, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`body` as a script of its own, with URL and JOURNAL set, run to its end (no close() unless it says so)."""
    code = f"import blobsync, os, pickle\nURL = {container.url!r}\nJOURNAL = {str(tmp_path / 'j.db')!r}\n"
    code += textwrap.dedent(body)
    return subprocess.run([sys.executable, "-X", "dev", "-c", code], env=clean_env(EMULATOR), capture_output=True,
                          text=True, timeout=180, check=False)


def _config(tmp_path: Path) -> blobsync.TransferConfig:
    return blobsync.TransferConfig(journal_path=tmp_path / "j.db")


def test_the_readme_push_lands_when_the_with_block_ends(container: ContainerHandle, tmp_path: Path) -> None:
    done = _script("""
        with blobsync.Client(URL, blobsync.TransferConfig(journal_path=JOURNAL)) as client:
            pushing = client.submit(client.aio.put, pickle.dumps({"epoch": 3}), "run7/ep3.pkl")
        print(pushing.result().etag)
    """, container, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Task was destroyed" not in done.stderr and "Unclosed" not in done.stderr, done.stderr
    assert pickle.loads(container.download("run7/ep3.pkl")) == {"epoch": 3}


def test_many_pending_pushes_all_land_and_resolve(container: ContainerHandle, tmp_path: Path) -> None:
    blobs = {f"ckpt/{i}.bin": bytes([i]) * (4 * MiB + i) for i in range(8)}
    blobs.update({f"big/{i}.bin": bytes([100 + i]) * (32 * MiB) for i in range(2)})
    with blobsync.Client(container.url, _config(tmp_path)) as client:
        futures = [client.submit(client.aio.put, data, name) for name, data in blobs.items()]
    assert all(f.done() for f in futures)
    assert [f.result().size for f in futures] == [len(d) for d in blobs.values()]
    for name, data in blobs.items():
        assert container.download(name) == data


def test_a_script_that_never_closes_its_client_still_lands_its_push(container: ContainerHandle,
                                                                    tmp_path: Path) -> None:
    done = _script("""
        client = blobsync.Client(URL, blobsync.TransferConfig(journal_path=JOURNAL))
        client.submit(client.aio.put, b"w" * (32 * 1024 * 1024), "weights.bin")
    """, container, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "waiting for them to finish" in done.stderr
    assert "Task was destroyed" not in done.stderr, done.stderr
    assert container.download("weights.bin") == b"w" * (32 * MiB)


def test_close_with_cancel_drops_the_work_and_every_future_says_so(container: ContainerHandle,
                                                                   tmp_path: Path) -> None:
    client = blobsync.Client(container.url, _config(tmp_path))
    futures = [client.submit(client.aio.put, bytes([i]) * (64 * MiB), f"big{i}.bin") for i in range(3)]
    client.close(cancel=True)
    for future in futures:
        assert future.done()
        if future.exception() is not None:
            error = future.exception()
            assert isinstance(error, DroppedError) and isinstance(error, BlobsyncError)
            assert "blobsync jobs resume" in str(error) or "nothing of it was committed" in str(error)
        else:  # it finished before the drop: then it is whole
            result = future.result()
            assert container.download(result.blob) == bytes([int(result.blob[3])]) * (64 * MiB)
    with pytest.raises(blobsync.errors.UsageError, match="closed"):
        client.submit(client.aio.put, b"x", "late.bin")


def test_a_done_callback_may_call_the_client(container: ContainerHandle, tmp_path: Path) -> None:
    import threading

    landed = threading.Event()
    with blobsync.Client(container.url, _config(tmp_path)) as client:
        first = client.submit(client.aio.put, b"{}", "ep1.json")

        def after(_: object) -> None:
            client.put(b'{"latest": 1}', "latest.json")
            landed.set()

        first.add_done_callback(after)
        assert landed.wait(60), "the callback's put never finished"
        client.put(b"more", "after.json")  # and the Client still works
    assert container.download("latest.json") == b'{"latest": 1}'
    assert container.download("after.json") == b"more"


def _child_put(client: blobsync.Client, name: str) -> None:
    client.put(f"from {multiprocessing.current_process().name}".encode(), name)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_client_works_in_forked_and_spawned_children(container: ContainerHandle, tmp_path: Path,
                                                       method: str) -> None:
    with blobsync.Client(container.url, _config(tmp_path), env=EMULATOR) as client:
        client.put(b"parent first", "parent.txt")  # the parent's loop and session are in use when it forks
        context = multiprocessing.get_context(method)
        procs = [context.Process(target=_child_put, args=(client, f"{method}-{i}.txt"), name=f"w{i}")
                 for i in range(2)]
        try:
            for proc in procs:
                proc.start()
            for proc in procs:
                proc.join(60)
                assert proc.exitcode == 0
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
        client.put(b"parent after", "parent.txt")  # the parent's session is untouched by its children
    assert sorted(container.blob_names()) == sorted(["parent.txt", f"{method}-0.txt", f"{method}-1.txt"])
    assert container.download(f"{method}-1.txt") == b"from w1"
    assert container.download("parent.txt") == b"parent after"


def test_a_client_pickles_as_its_url_config_and_credential(container: ContainerHandle, tmp_path: Path) -> None:
    with blobsync.Client(container.url, _config(tmp_path), env=EMULATOR) as client, \
            pickle.loads(pickle.dumps(client)) as again:
        again.put(b"unpickled", "u.txt")
        assert again.url_for("u.txt") == client.url_for("u.txt")
    assert container.download("u.txt") == b"unpickled"


def _child_pipe(fs: object, path: str) -> None:
    fs.pipe_file(path, f"from {multiprocessing.current_process().name}".encode())  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_an_fsspec_filesystem_works_in_forked_and_spawned_children(container: ContainerHandle, azurite: object,
                                                                   tmp_path: Path, method: str) -> None:
    from blobsync.fsspec import BlobsyncFileSystem

    fs = BlobsyncFileSystem(azurite.blob_endpoint, config=_config(tmp_path), env=EMULATOR,  # type: ignore[attr-defined]
                            skip_instance_cache=True)
    try:
        fs.pipe_file(f"{container.name}/parent.txt", b"parent")
        proc = multiprocessing.get_context(method).Process(target=_child_pipe, name="w0",
                                                           args=(fs, f"{container.name}/{method}.txt"))
        proc.start()
        try:
            proc.join(60)
            assert proc.exitcode == 0
        finally:
            if proc.is_alive():
                proc.kill()
        assert fs.cat_file(f"{container.name}/{method}.txt") == b"from w0"
    finally:
        fs.client.close()
    assert container.download(f"{method}.txt") == b"from w0"
