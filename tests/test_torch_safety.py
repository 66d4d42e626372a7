"""blobsync.torch under an unlucky user and an attacker (issue 51): a save never deletes what it just saved, names
not in blobsync's one spelling are never steps, a planted pointer or `.metadata` or Lightning checkpoint runs
nothing, async saves are waited for at exit (or said lost) and run their collectives apart from training's, and
a load running while the same checkpoint is saved again never returns bytes of two saves. Bytes checked with the
SDK."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from blobsync.errors import ConflictError, IntegrityError, UsageError
from blobsync.torch import BlobStorageReader, BlobStorageWriter, Checkpoints
from conftest import Side
from support.azurite import Azurite
from test_torch_dcp import _group

SRC = str(Path(__file__).resolve().parents[1] / "src")
MARK = "PLANTED-CODE-RAN"


def _sdk_state(side: Side, name: str) -> dict[str, object]:
    return torch.load(io.BytesIO(side.download(name)), weights_only=True)


def test_a_restarted_run_never_loses_the_step_it_saves(source: Side, azurite: Azurite) -> None:
    url = source.url(azurite.base_url, "runs/restart")
    with Checkpoints(url, keep=2) as checkpoints:
        for step in (4900, 5000):
            checkpoints.save(step, {"w": torch.full((10,), float(step))})
        with pytest.raises(UsageError, match=r"step 100 is older than the newest complete checkpoint .*step 5000"):
            checkpoints.save(100, {"w": torch.zeros(10)})
        with pytest.raises(UsageError, match="step 100 is older"):
            checkpoints.save(100, {"w": torch.zeros(10)}, async_=True)
        assert checkpoints.list() == [4900, 5000]
        checkpoints.save(5000, {"w": torch.full((10,), 1.5)})  # the newest again: rewritten, kept
        assert torch.equal(checkpoints.load()["w"], torch.full((10,), 1.5))
    assert torch.equal(_sdk_state(source, "runs/restart/step-00005000/state.pt")["w"], torch.full((10,), 1.5))


@pytest.mark.parametrize("planted", ["step-99999999999/state.pt", "step-000000400/state.pt",
                                     "step-\u0669\u0669\u0669\u0669\u0669\u0669\u0669\u0669/state.pt",
                                     "step-0000040/state.pt", "step-00000400x/state.pt"])
def test_names_not_in_blobsyncs_spelling_are_never_steps(planted: str, source: Side, azurite: Azurite) -> None:
    url = source.url(azurite.base_url, "runs/planted")
    source.client.upload_blob(f"runs/planted/{planted}", b"not a checkpoint")
    with Checkpoints(url, keep=2) as checkpoints:
        for step in (10, 20, 30):
            checkpoints.save(step, {"w": torch.full((10,), float(step))})
        assert checkpoints.list() == [20, 30] and checkpoints.latest() == 30
        assert torch.equal(checkpoints.load()["w"], torch.full((10,), 30.0))
    names = {b.name for b in source.client.list_blobs(name_starts_with="runs/planted/")}
    assert f"runs/planted/{planted}" in names  # not blobsync's: left alone, neither counted nor pruned
    assert "runs/planted/step-00000010/state.pt" not in names
    assert torch.equal(_sdk_state(source, "runs/planted/step-00000030/state.pt")["w"], torch.full((10,), 30.0))


def test_steps_out_of_range_are_refused(source: Side, azurite: Azurite) -> None:
    with Checkpoints(source.url(azurite.base_url, "runs/range")) as checkpoints:
        for step in (2**70, 10**10, -1, 1.5, True, "3"):
            with pytest.raises(UsageError, match="invalid step="):
                checkpoints.save(step, {})  # type: ignore[arg-type]


@pytest.mark.parametrize("pointer", [b"[" * 200_000, b'{"step": ' + b"[" * 250 + b"}", b"\xff\xfe" * 40,
                                     b'{"step": 99999999999, "format": "torch"}', b'{"step": 5, "format": "x"}'])
def test_a_planted_pointer_is_ignored_and_repaired(pointer: bytes, source: Side, azurite: Azurite) -> None:
    url = source.url(azurite.base_url, "runs/pointer")
    with Checkpoints(url, keep=2) as checkpoints:
        checkpoints.save(1, {"w": torch.ones(3)})
        source.client.upload_blob("runs/pointer/latest", pointer, overwrite=True)
        assert checkpoints.latest() == 1
        assert torch.equal(checkpoints.load()["w"], torch.ones(3))
        checkpoints.save(2, {"w": torch.full((3,), 2.0)})
    assert source.download("runs/pointer/latest") == b'{"step": 2, "format": "torch"}'


def _script(tmp: Path, body: str) -> subprocess.CompletedProcess[str]:
    path = tmp / "script.py"
    path.write_text(body, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=300)


def test_an_async_save_at_the_end_of_a_script_lands(source: Side, azurite: Azurite, tmp_path: Path) -> None:
    """The script returns from save(async_=True) and ends: its exit waits for the upload (it was lost before)."""
    url = source.url(azurite.base_url, "runs/exit")
    done = _script(tmp_path, f"""
import torch
from blobsync.torch import Checkpoints
checkpoints = Checkpoints({url!r}, keep=2)
checkpoints.save(3, {{"w": torch.arange(4 << 20, dtype=torch.float32)}}, async_=True)
""")
    assert done.returncode == 0, done.stderr
    assert "waiting for 1 checkpoint save" in done.stderr
    assert torch.equal(_sdk_state(source, "runs/exit/step-00000003/state.pt")["w"],
                       torch.arange(4 << 20, dtype=torch.float32))


def test_an_async_save_that_fails_unseen_is_said_at_exit(source: Side, azurite: Azurite, tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    read_only = generate_container_sas(azurite.account, source.name, account_key=azurite.key,
                                       expiry=datetime.now(UTC) + timedelta(hours=1),
                                       permission=ContainerSasPermissions(read=True, list=True))
    url = f"{azurite.base_url}/{azurite.account}/{source.name}/runs/denied?{read_only}"
    done = _script(tmp_path, f"""
import torch
from blobsync import TransferConfig
from blobsync.torch import Checkpoints
checkpoints = Checkpoints({url!r}, keep=2, config=TransferConfig(max_retries=0))
checkpoints.save(2, {{"w": torch.ones(3)}}, async_=True)  # refused by the service, in the background
""")
    assert "blobsync: checkpoint step-00000002/ under " in done.stderr and "was NOT saved" in done.stderr, \
        done.stderr
    assert "sig=" not in done.stderr


def test_lightnings_async_save_at_the_end_of_a_script_lands(source: Side, azurite: Azurite, tmp_path: Path) -> None:
    url = source.url(azurite.base_url, "lightning/exit")
    done = _script(tmp_path, f"""
import torch
from blobsync.torch.lightning import BlobCheckpointIO
io = BlobCheckpointIO({url!r}, root={str(tmp_path)!r}, async_=True)
io.save_checkpoint({{"state_dict": {{"w": torch.ones(2 << 20)}}}}, {str(tmp_path / "last.ckpt")!r})
""")
    assert done.returncode == 0, done.stderr
    assert torch.equal(_sdk_state(source, "lightning/exit/last.ckpt")["state_dict"]["w"], torch.ones(2 << 20))


def test_async_saves_under_a_process_group_never_hang_training(source: Side, azurite: Azurite,
                                                               tmp_path: Path) -> None:
    """Two gloo ranks all-reduce every step while async DCP saves run: the saves use a group of their own."""
    url = source.url(azurite.base_url, "runs/ddp")
    results = _group({"mode": "ckpt-async-train", "url": url, "timeout": 60, "steps": 40}, 2, tmp_path,
                     timeout=200)
    assert all(r["ok"] for r in results), results
    names = {b.name for b in source.client.list_blobs(name_starts_with="runs/ddp/")}
    assert {"runs/ddp/step-00000020/.metadata", "runs/ddp/step-00000030/.metadata"} <= names


class _Boom:
    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"echo {MARK} >&2",))


def _planted_pickle() -> bytes:
    return pickle.dumps({"state_dict": {}, "x": _Boom()})


def test_a_planted_lightning_checkpoint_runs_nothing(source: Side, azurite: Azurite, tmp_path: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    from blobsync.torch.lightning import BlobCheckpointIO

    buf = io.BytesIO()
    torch.save({"state_dict": {}, "x": _Boom()}, buf)
    source.client.upload_blob("lightning/planted/last.ckpt", buf.getvalue())
    plugin = BlobCheckpointIO(source.url(azurite.base_url, "lightning/planted"), root=tmp_path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        plugin.load_checkpoint(tmp_path / "last.ckpt")  # Lightning's own default: weights_only=None
    assert MARK not in capfd.readouterr().err
    good = io.BytesIO()
    torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 3}, good)
    source.client.upload_blob("lightning/planted/good.ckpt", good.getvalue())
    assert plugin.load_checkpoint(tmp_path / "good.ckpt")["epoch"] == 3


def test_a_planted_metadata_runs_nothing(source: Side, azurite: Azurite, capfd: pytest.CaptureFixture[str]) -> None:
    url = source.url(azurite.base_url, "runs/meta")
    with Checkpoints(url, keep=2, format="dcp") as checkpoints:
        checkpoints.save(1, {"w": torch.ones(4)})
        source.client.upload_blob("runs/meta/step-00000001/.metadata", _planted_pickle(), overwrite=True)
        with pytest.raises(IntegrityError, match=r"\.metadata names posix\.system, which a checkpoint's metadata "
                                                 r"never holds: refused"):
            checkpoints.load(state={"w": torch.zeros(4)})
        with pytest.raises(IntegrityError, match="refused"):
            BlobStorageReader(source.url(azurite.base_url, "runs/meta/step-00000001"))
    assert MARK not in capfd.readouterr().err


def test_a_genuine_metadata_still_loads(source: Side, azurite: Azurite) -> None:
    url = source.url(azurite.base_url, "runs/genuine/step-1")
    state = {"w": torch.randn(8, 8), "b": torch.zeros(3, dtype=torch.bfloat16), "i": torch.arange(5),
             "extra": {"n": 3, "s": "x", "l": [1, 2.0], "t": (1, 2)}, "blob": io.BytesIO(b"bytes")}
    dcp.save(state, storage_writer=BlobStorageWriter(url), no_dist=True)
    got = {"w": torch.zeros(8, 8), "b": torch.ones(3, dtype=torch.bfloat16), "i": torch.zeros(5, dtype=torch.int64),
           "extra": {"n": 0, "s": "", "l": [0, 0.0], "t": (0, 0)}, "blob": io.BytesIO()}
    dcp.load(got, storage_reader=BlobStorageReader(url), no_dist=True)
    assert torch.equal(got["w"], state["w"]) and torch.equal(got["b"], state["b"])
    assert torch.equal(got["i"], state["i"]) and got["extra"] == state["extra"]


def test_a_load_during_a_save_of_the_same_checkpoint_is_never_torn(source: Side, azurite: Azurite) -> None:
    """The reader pins each data blob's version under the `.metadata` it read: once a save has started over it,
    the load is refused (or sees one whole save), never bytes of two."""
    from blobsync import Client, TransferConfig
    from blobsync.config import MiB

    url = source.url(azurite.base_url, "runs/torn/step-1")
    old, new = {"w": torch.full((1 << 20,), 1.0)}, {"w": torch.full((1 << 20,), 2.0)}
    config = TransferConfig(block_size=MiB)
    dcp.save(old, storage_writer=BlobStorageWriter(url, config=config), no_dist=True)
    reader = BlobStorageReader(url, config=config)
    with Client(url, config) as client:
        target = {"w": torch.zeros(1 << 20)}
        metadata = reader.read_metadata()  # a load has read the old save's .metadata...
        dcp.save(new, storage_writer=BlobStorageWriter(url, client=client), no_dist=True)  # ...then it is saved again
        reader.set_up_storage_reader(metadata, True)
        with pytest.raises((ConflictError, CheckpointException), match="being saved again while it loads"):
            dcp.load(target, storage_reader=_Given(reader, metadata), no_dist=True)
    fresh = {"w": torch.zeros(1 << 20)}
    dcp.load(fresh, storage_reader=BlobStorageReader(url, config=config), no_dist=True)
    assert torch.equal(fresh["w"], new["w"])


class _Given(BlobStorageReader):
    """A reader whose `.metadata` was read earlier (the load that a save overtook)."""

    def __init__(self, reader: BlobStorageReader, metadata: object) -> None:
        self.__dict__.update(reader.__dict__)
        self._given = metadata

    def read_metadata(self) -> object:  # type: ignore[override]
        return self._given


def test_a_wrong_type_for_the_url_is_one_line() -> None:
    for url in (None, 3, b"https://x"):
        with pytest.raises(UsageError, match="invalid url"):
            Checkpoints(url)  # type: ignore[arg-type]
