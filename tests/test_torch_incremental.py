"""Incremental and tiered checkpoints (issue 50): a save sends only the blocks that changed since the newest complete
checkpoint (the service stages the others from it: Put Block From URL with the block's CRC64 and no body, seen at
the proxy), every checkpoint stays whole when older ones are pruned; with a local tier a save returns once the step
is on local disk, its upload runs in the background, a process SIGKILLed during it has the next one finish it
(only the blocks that had not landed are sent again), `latest()` names only steps complete on Blob, `load()` reads
the local copy when it is the same, `keep` prunes both tiers, and a local disk that refuses the write falls back
to Blob with a warning. Real gloo ranks for DCP. Bytes checked with the SDK."""

from __future__ import annotations

import io
import os
import random
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from blobsync.config import MiB
from blobsync.torch import Checkpoints, Saved
from conftest import Side
from support.azurite import Azurite
from support.proxy import FaultProxy
from test_torch_dcp import _group

TIER = Path(__file__).resolve().parent / "support" / "tierloop.py"
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _sdk_state(side: Side, name: str) -> dict[str, object]:
    return torch.load(io.BytesIO(side.download(name)), weights_only=True)  # type: ignore[no-any-return]


def _state(frozen: torch.Tensor, step: int) -> dict[str, object]:
    return {"frozen": frozen, "trained": torch.full((1 << 20,), float(step)), "step": step}  # 64 MiB + 4 MiB


def test_a_second_save_sends_only_what_changed_and_each_checkpoint_stays_whole(source: Side,
                                                                              proxy: FaultProxy) -> None:
    url = source.url(proxy.url, "runs/inc")
    frozen = torch.randn(16 << 20, generator=torch.Generator().manual_seed(1))  # 64 MiB
    with Checkpoints(url, keep=2, incremental=True) as checkpoints:
        first = checkpoints.save(1, _state(frozen, 1))
        assert isinstance(first, Saved) and first.base is None and first.bytes_copied == 0
        assert first.bytes_sent == first.bytes and first.bytes is not None and first.bytes > 68 * MiB
        proxy.reset_stats()
        second = checkpoints.save(2, _state(frozen, 2))
        assert isinstance(second, Saved) and second.base == 1
        assert second.bytes_sent is not None and second.bytes_sent <= 16 * MiB
        assert second.bytes_copied is not None and second.bytes_copied >= 52 * MiB
        assert proxy.stats.bytes_in["put_block"] <= 16 * MiB
        copies = [e for e in proxy.log if e.op == "put_block_from_url"]
        assert copies and all(e.headers.get("x-ms-source-content-crc64") for e in copies)
        assert proxy.stats.bytes_in["put_block_from_url"] == 0  # staged by the service: no body
        third = checkpoints.save(3, _state(frozen, 3))  # built on step 2; step 1 (what 2 was built on) pruned
        assert isinstance(third, Saved) and third.base == 2
        assert checkpoints.list() == [2, 3]
        assert checkpoints.load()["step"] == 3
    for step in (2, 3):
        state = _sdk_state(source, f"runs/inc/step-0000000{step}/state.pt")
        assert torch.equal(state["frozen"], frozen) and torch.equal(state["trained"], torch.full((1 << 20,), step))


def test_without_an_earlier_record_a_save_is_sent_whole_and_says_why(source: Side, azurite: Azurite) -> None:
    url = source.url(azurite.base_url, "runs/plain")
    state = _state(torch.zeros(1 << 20), 1)
    with Checkpoints(url, keep=2) as plain:  # not incremental: no block records beside its blobs
        plain.save(1, state)
    with Checkpoints(url, keep=2, incremental=True) as checkpoints:
        saved = checkpoints.save(2, state)
    assert isinstance(saved, Saved) and saved.base == 1 and saved.bytes_copied == 0
    assert saved.bytes_sent == saved.bytes
    assert saved.notes and "no block digests beside" in saved.notes[0]


def test_a_save_of_another_layout_is_sent_whole_and_says_so(source: Side, azurite: Azurite) -> None:
    url = source.url(azurite.base_url, "runs/layout")
    with Checkpoints(url, keep=2, incremental=True) as checkpoints:
        checkpoints.save(1, {"w": torch.randn(2 << 20)})
        saved = checkpoints.save(2, {"w": torch.randn(3 << 20)})  # other sizes, other values
    assert isinstance(saved, Saved) and saved.base == 1 and saved.bytes_copied == 0
    assert saved.notes and "another layout" in saved.notes[0]


def test_a_local_tier_returns_at_the_local_write_and_keeps_both_tiers(source: Side, proxy: FaultProxy,
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from blobsync.torch._tier import LocalTier

    url = source.url(proxy.url, "runs/tier")
    local = tmp_path / "nvme"
    frozen = torch.randn(4 << 20, generator=torch.Generator().manual_seed(2))  # 16 MiB
    with Checkpoints(url, keep=2, local_dir=local, incremental=True) as checkpoints:
        pending = [checkpoints.save(step, _state(frozen, step), async_=step == 3) for step in (1, 2, 3)]
        saved = [p.result(timeout=120) for p in pending]  # type: ignore[union-attr]
        assert [s.step for s in saved] == [1, 2, 3] and [s.base for s in saved] == [None, 1, 2]
        assert all(s.local == local / f"step-0000000{s.step}" for s in saved)
        assert checkpoints.latest() == 3 and checkpoints.list() == [2, 3]
        assert sorted(p.name for p in local.iterdir()) == ["step-00000002", "step-00000003"]  # pruned there too
        proxy.reset_stats()
        # The same as uploaded from here (its size, mtime and the blob's ETag, as recorded): not even hashed.
        monkeypatch.setattr(LocalTier, "md5", lambda *_: pytest.fail("the local copy was hashed"))
        assert checkpoints.load()["step"] == 3
        assert _reads_of(proxy, "state.pt") == 0  # read from the local copy, which is the same
        monkeypatch.undo()
        (local / "step-00000003" / ".blobsync-0").write_text('{"uploaded": true}')  # uploaded, nothing recorded
        assert checkpoints.load()["step"] == 3
        assert _reads_of(proxy, "state.pt") == 0  # its MD5 is the blob's Content-MD5: still the local copy
        (local / "step-00000003" / "state.pt").write_bytes(b"not the same")
        assert checkpoints.load()["step"] == 3  # not the same any more: read from Blob
        assert _reads_of(proxy, "state.pt") >= 1
    state = _sdk_state(source, "runs/tier/step-00000003/state.pt")
    assert torch.equal(state["frozen"], frozen) and state["step"] == 3


def _reads_of(proxy: FaultProxy, suffix: str) -> int:
    return sum(1 for e in proxy.log if e.op == "get_blob" and (e.blob or "").endswith(suffix))


@contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    """Files of this process may not grow past `limit` (the kernel refuses the write, EFBIG)."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def test_a_local_disk_that_refuses_the_write_falls_back_to_blob(source: Side, azurite: Azurite,
                                                                tmp_path: Path) -> None:
    url = source.url(azurite.base_url, "runs/full")
    state = _state(torch.ones(2 << 20), 5)  # 12 MiB
    with Checkpoints(url, keep=2, local_dir=tmp_path / "small") as checkpoints:
        with _file_size_limit(4 * MiB), pytest.warns(RuntimeWarning, match="saved straight to Blob instead"):
            pending = checkpoints.save(5, state)
        assert pending.result(timeout=60).local is None  # type: ignore[union-attr]
        assert checkpoints.latest() == 5
    assert not (tmp_path / "small" / "step-00000005").exists()
    assert torch.equal(_sdk_state(source, "runs/full/step-00000005/state.pt")["frozen"], torch.ones(2 << 20))


def _tier_run(url: str, local: Path, journal: Path, mode: str, step: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, str(TIER.parent)])}
    return subprocess.Popen([sys.executable, str(TIER), url, str(local), str(journal), mode, str(step)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_an_upload_killed_at_random_moments_is_finished_by_the_next_run(source: Side, proxy: FaultProxy,
                                                                       tmp_path: Path) -> None:
    sys.path.insert(0, str(TIER.parent))
    from tierloop import state

    url, local, journal = source.url(proxy.url, "runs/killed"), tmp_path / "local", tmp_path / "j.db"
    rng = random.Random(50)
    for step in (1, 2):
        # The upload's n-th block held, then the process killed: a block sent (step 1), or one the service stages
        # from step 1 (step 2: only the head changed).
        proxy.hold_after("put_block" if step == 1 else "put_block_from_url", rng.randint(2, 12))
        proc = _tier_run(url, local, journal, "save", step)
        try:
            proxy.wait_for_held(1, timeout=120)
        except TimeoutError:
            proc.kill()
            raise AssertionError(proc.communicate(timeout=30)[1][-3000:]) from None
        finally:
            proc.kill()
            proc.communicate(timeout=30)
        proxy.clear_rules()
        proxy.release_holds()
        proxy.wait_idle()
        with Checkpoints(url, keep=2) as blob_only:
            assert blob_only.latest() == (None if step == 1 else 1)  # never names the step half uploaded
        landed = sum(b.size for b in source.client.get_blob_client(
            f"runs/killed/step-0000000{step}/state.pt").get_block_list("uncommitted")[1])
        proxy.reset_stats()
        done = _tier_run(url, local, journal, "resume", 0)
        out, err = done.communicate(timeout=120)
        assert done.returncode == 0, err[-3000:]
        assert "owed 1" in out
        whole = (local / f"step-0000000{step}" / "state.pt").stat().st_size
        assert proxy.stats.bytes_in["put_block"] <= whole - landed  # only what had not landed
        with Checkpoints(url, keep=2) as blob_only:
            assert blob_only.latest() == step
        got = _sdk_state(source, f"runs/killed/step-0000000{step}/state.pt")
        want = state(step)
        assert all(torch.equal(got[k], want[k]) for k in ("base", "head")) and got["step"] == step


@pytest.mark.parametrize("how", ["local tier", "async"])
def test_ranks_save_incremental_checkpoints(source: Side, proxy: FaultProxy, tmp_path: Path, how: str) -> None:
    url = source.url(proxy.url, "runs/lora")
    args = {"mode": "ckpt-tiered", "url": url, "block_mib": 1}
    args.update({"local": str(tmp_path / "local")} if how == "local tier" else {"async": True})
    results = _group(args, 2, tmp_path)
    assert all(r["ok"] for r in results), results
    for rank in results:
        assert [s["base"] for s in rank["saved"]] == [None, 1, 2]
        first, *later = rank["saved"]
        if how == "async":  # DCP's background process wrote the blobs: counted at the proxy below
            assert all(s["sent"] is None for s in rank["saved"])
            continue
        assert first["copied"] == 0
        for saved in later:  # the base (4 MiB a rank) staged by the service; the adapter and headers sent
            assert saved["copied"] >= 3 * MiB and saved["sent"] <= 2 * MiB, rank["saved"]
    # 8 MiB of base and 256 KiB of adapter, saved three times: the base went once, then was staged by the service.
    assert proxy.stats.bytes_in["put_block"] <= 8 * MiB + 6 * MiB
    assert proxy.stats.ok("put_block_from_url") >= 2 * 6
    names = {b.name for b in source.client.list_blobs(name_starts_with="runs/lora/")}
    assert not any(n.startswith("runs/lora/step-00000001/") for n in names)
    assert {"runs/lora/step-00000003/.metadata", "runs/lora/step-00000003/__0_0.distcp",
            "runs/lora/step-00000003/__1_0.distcp"} <= names


def test_ranks_killed_during_their_uploads_have_the_next_run_finish_them(source: Side, proxy: FaultProxy,
                                                                        tmp_path: Path) -> None:
    from support import ranks
    from support.azurite import free_port
    from test_torch_dcp import RANK

    url, local = source.url(proxy.url, "runs/rankkill"), str(tmp_path / "local")
    args = {"mode": "ckpt-tier-kill", "url": url, "local": local, "block_mib": 1, "world": 2}
    proxy.hold_after("put_block", random.Random(51).randint(2, 5))  # both ranks' uploads: 4 MiB each
    port, out = free_port(), tmp_path / "killed"
    procs = [ranks.start(RANK, args, rank, 2, port, out) for rank in range(2)]
    try:
        proxy.wait_for_held(1, timeout=120)
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
    proxy.clear_rules()
    proxy.release_holds()
    proxy.wait_idle()
    with Checkpoints(url, keep=2) as blob_only:
        assert blob_only.latest() is None  # never a step half uploaded
    results = _group({**args, "mode": "ckpt-tier-resume"}, 2, tmp_path)
    assert all(r["ok"] for r in results), results
    assert [r["owed"] for r in results] == [[1], [1]]


def test_bad_arguments_get_one_line(source: Side, azurite: Azurite, tmp_path: Path) -> None:
    from blobsync import TransferConfig
    from blobsync.errors import UsageError
    from blobsync.torch import BlobStorageWriter

    url = source.url(azurite.base_url, "runs/bad")
    (tmp_path / "a-file").write_text("x")
    cases = [
        (lambda: Checkpoints(url, incremental="yes"), r"invalid incremental='yes': True or False"),  # type: ignore[arg-type]
        (lambda: Checkpoints(url, local_dir=7), r"invalid local_dir=7: a local folder path"),  # type: ignore[arg-type]
        (lambda: Checkpoints(url, local_dir=tmp_path / "a-file" / "sub"), r"local_dir .* cannot be made"),
        (lambda: BlobStorageWriter(url, base=url), r"base= names the earlier checkpoint .* incremental=True"),
        (lambda: BlobStorageWriter(url, incremental=True, base="https://other.blob.core.windows.net/cont/x?sv=1&sig=abc"),
         r"an earlier checkpoint in the same container"),
        (lambda: TransferConfig(blocks_from="https://acct.blob.core.windows.net/c/x"), r"invalid blocks_from="),
        (lambda: BlobStorageWriter(url, put_md5="yes"), r"invalid put_md5='yes': True or False"),  # type: ignore[arg-type]
        (lambda: BlobStorageWriter(url, zip_crc32=1), r"invalid zip_crc32=1: True or False"),  # type: ignore[arg-type]
    ]
    for make, line in cases:
        with pytest.raises(UsageError, match=line) as caught:
            make()
        assert "\n" not in str(caught.value) and "sig=" not in str(caught.value)
