"""Checkpoints kept and found again (issue 40): folders per step, the `latest` pointer written only once a folder is
complete, older folders deleted beyond `keep` only after a newer one is complete; torch.save in one process, DCP
under a process group; async saves; a process SIGKILLed at many moments of its saves always leaves `latest()`
naming a complete checkpoint that loads the right tensors. Bytes checked with the SDK."""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from blobsync import TransferConfig
from blobsync.torch import Checkpoints, IncompleteCheckpointError
from conftest import Side
from support.azurite import Azurite
from test_torch_dcp import _group

LOOP = Path(__file__).resolve().parent / "support" / "ckptloop.py"
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _sdk_state(side: Side, name: str) -> dict[str, object]:
    return torch.load(io.BytesIO(side.download(name)), weights_only=True)


def test_one_process_keeps_the_newest_and_finds_them(source: Side, azurite: Azurite) -> None:
    url = source.url(azurite.base_url, "runs/r1")
    with Checkpoints(url, keep=2) as checkpoints:
        assert checkpoints.latest() is None and checkpoints.list() == []
        for step in (10, 20, 30, 40):
            checkpoints.save(step, {"w": torch.full((1000,), float(step)), "step": step})
        assert checkpoints.list() == [30, 40] and checkpoints.latest() == 40
        assert torch.equal(checkpoints.load()["w"], torch.full((1000,), 40.0))
        assert checkpoints.load(step=30)["step"] == 30
        with pytest.raises(IncompleteCheckpointError, match=r"no complete checkpoint step-00000010/ under"):
            checkpoints.load(step=10)
    names = sorted(b.name for b in source.client.list_blobs(name_starts_with="runs/r1/"))
    assert names == ["runs/r1/latest", "runs/r1/step-00000030/state.pt", "runs/r1/step-00000040/state.pt"]
    assert json.loads(source.download("runs/r1/latest")) == {"step": 40, "format": "torch"}
    assert torch.equal(_sdk_state(source, "runs/r1/step-00000040/state.pt")["w"], torch.full((1000,), 40.0))


def test_an_async_save_returns_with_the_state_copied_and_completes_later(source: Side, azurite: Azurite) -> None:
    url = source.url(azurite.base_url, "runs/async")
    weights = torch.full((4 << 20,), 1.0)
    with Checkpoints(url, keep=3) as checkpoints:
        future = checkpoints.save(7, {"w": weights}, async_=True)
        assert future is not None
        weights.add_(1.0)  # training goes on, changing the tensor the checkpoint was taken of
        assert future.result(timeout=120).step == 7
        assert checkpoints.latest() == 7
        assert torch.equal(checkpoints.load()["w"], torch.full((4 << 20,), 1.0))  # as it was at save()
    assert torch.equal(_sdk_state(source, "runs/async/step-00000007/state.pt")["w"], torch.full((4 << 20,), 1.0))


def test_a_one_process_save_sends_the_states_large_tensors_from_their_own_memory(
        source: Side, azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save writes each storage once, in one write: a storage of the state's own CPU tensors (however deep,
    however many views share it) goes up from its memory, not copied into blocks; small ones and an async save's
    host copies likewise (its copies are the save's own). The SDK's download loads equal, views still views."""
    from blobsync.blobfile import BlobWriter

    lent: list[int] = []
    borrowed = BlobWriter.write_borrowed

    def spied(self: BlobWriter, data: object) -> int:
        lent.append(memoryview(data).nbytes)  # type: ignore[arg-type]
        return borrowed(self, data)

    monkeypatch.setattr(BlobWriter, "write_borrowed", spied)
    base = torch.randn(1 << 20, generator=torch.Generator().manual_seed(3))  # 4 MiB
    state = {"w": base, "half": base[::2], "deep": [{"e": torch.arange(1 << 19, dtype=torch.float64)}],
             "small": torch.ones(10), "step": 5}
    url = source.url(azurite.base_url, "runs/lent")
    with Checkpoints(url, config=TransferConfig(block_size=1 << 20)) as checkpoints:
        checkpoints.save(5, state)
        assert sorted(lent) == [4 << 20, 4 << 20], lent  # `w` and `half` share one storage, written once
        lent.clear()
        assert checkpoints.save(6, state, async_=True).result(timeout=120).step == 6  # type: ignore[union-attr]
        assert sorted(lent) == [2 << 20, 4 << 20, 4 << 20], lent  # the host copies: `half` a storage of its own
    for step in (5, 6):
        got = _sdk_state(source, f"runs/lent/step-0000000{step}/state.pt")
        assert torch.equal(got["w"], base) and torch.equal(got["half"], base[::2])  # type: ignore[arg-type]
        assert torch.equal(got["deep"][0]["e"], state["deep"][0]["e"])  # type: ignore[index]
        assert got["step"] == 5 and torch.equal(got["small"], torch.ones(10))  # type: ignore[arg-type]


def test_bad_arguments_get_one_line(source: Side, azurite: Azurite) -> None:
    from blobsync.errors import UsageError

    url = source.url(azurite.base_url, "runs/bad")
    for kwargs, text in (({"keep": 0}, "invalid keep=0"), ({"format": "zip"}, "invalid format='zip'")):
        with pytest.raises(UsageError, match=text):
            Checkpoints(url, **kwargs)  # type: ignore[arg-type]
    with Checkpoints(url) as checkpoints:
        with pytest.raises(UsageError, match="invalid step=-1"):
            checkpoints.save(-1, {})
        with pytest.raises(IncompleteCheckpointError, match="no complete checkpoint under"):
            checkpoints.load()


def test_a_process_killed_at_any_moment_of_its_saves_leaves_latest_complete(source: Side, azurite: Azurite) -> None:
    """Eight kills at random moments (during a block, a commit, the pointer, a prune): each time `latest()` names a
    complete checkpoint whose tensors are that step's, and the next run goes on from it."""
    url = source.url(azurite.base_url, "runs/killed")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, str(LOOP.parent)])}
    rng, first, seen = random.Random(40), 1, []
    checkpoints = Checkpoints(url, keep=2)
    try:
        for _ in range(8):
            proc = subprocess.Popen([sys.executable, str(LOOP), url, str(first)], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
            try:
                assert proc.stdout is not None
                proc.stdout.readline()  # one save done: a checkpoint exists from here on
                time.sleep(rng.uniform(0.0, 0.6))
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate(timeout=30)
            latest = checkpoints.latest()
            assert latest is not None and latest >= first
            state = checkpoints.load()
            assert state["step"] == latest and torch.equal(state["w"], torch.full((1 << 20,), float(latest)))
            assert torch.equal(state["b"], torch.arange(latest, latest + 5))
            assert latest in checkpoints.list() and len(checkpoints.list()) <= 3
            seen.append(latest)
            first = latest + 1
    finally:
        checkpoints.close()
    assert seen == sorted(seen)
    sdk = _sdk_state(source, f"runs/killed/step-{seen[-1]:08d}/state.pt")
    assert torch.equal(sdk["w"], torch.full((1 << 20,), float(seen[-1])))


def test_ranks_save_distributed_checkpoints_and_load_the_latest(source: Side, azurite: Azurite,
                                                                tmp_path: Path) -> None:
    url = source.url(azurite.base_url, "runs/dist")
    assert all(r["ok"] for r in _group({"mode": "ckpt-save", "url": url, "seed": 4, "width": 256}, 2, tmp_path))
    names = {b.name for b in source.client.list_blobs(name_starts_with="runs/dist/")}
    assert "runs/dist/step-00000001/.metadata" not in names  # beyond keep=2, deleted after step 3 was complete
    assert {"runs/dist/step-00000002/.metadata", "runs/dist/step-00000003/.metadata", "runs/dist/latest"} <= names
    assert json.loads(source.download("runs/dist/latest")) == {"step": 3, "format": "dcp"}
    results = _group({"mode": "ckpt-load", "url": url, "seed": 4, "width": 256}, 2, tmp_path)
    assert all(r["ok"] for r in results), results
