"""DCP checkpoints any tool reads (issue 48): what BlobStorageWriter saves, downloaded by the SDK, loads with DCP's
stock FileSystemReader and `dcp_to_torch_save`, and its `.metadata` unpickles without blobsync; a folder DCP's
FileSystemWriter wrote, uploaded, loads with BlobStorageReader; blobsync's earlier raw format still loads. Loads
merge their reads: 200 small tensors in <= 10 GETs, every byte read at most once, large tensors straight in."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import blobsync
from conftest import Side
from support.azurite import Azurite
from support.proxy import FaultProxy

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _state() -> dict[str, Any]:
    """Large tensors (read straight into their targets), small ones of several types, bytes and plain values."""
    gen = torch.Generator().manual_seed(48)
    return {"big": torch.randn(1536, 1024, generator=gen), "big16": torch.randn(3 << 20, generator=gen).to(
            torch.bfloat16), "w": torch.randn(300, 7, generator=gen), "i": torch.arange(5),
            "t": torch.randn(7, 300, generator=gen).t(), "h": torch.tensor(1.5, dtype=torch.float16),
            "e": torch.zeros(0, 3), "f8": torch.arange(6, dtype=torch.float32).to(torch.float8_e4m3fn),
            "blob": io.BytesIO(b"opaque"), "n": {"epoch": 4, "name": "run"}}


def _blank(state: dict[str, Any]) -> dict[str, Any]:
    return {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else io.BytesIO() if isinstance(v, io.BytesIO)
                else {"epoch": 0, "name": ""}) for k, v in state.items()}


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and torch.equal(got[key].float(), value.float()), key
        elif isinstance(value, io.BytesIO):
            got_bytes = got[key].getvalue() if isinstance(got[key], io.BytesIO) else got[key]
            assert got_bytes == value.getvalue(), key
        else:
            assert got[key] == value, key


def _download(side: Side, prefix: str, to: Path) -> list[str]:
    """The folder as the SDK reads it, blob by blob."""
    names = [b.name for b in side.client.list_blobs(name_starts_with=prefix + "/")]
    for name in names:
        path = to / name[len(prefix) + 1:]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(side.download(name))
    return [n[len(prefix) + 1:] for n in names]


def test_a_blobsync_checkpoint_loads_with_dcps_own_reader_and_converter(source: Side, azurite: Azurite,
                                                                        tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from blobsync.torch import BlobStorageWriter

    state = _state()
    dcp.save(state, storage_writer=BlobStorageWriter(source.url(azurite.base_url, "fmt/step-1"), thread_count=2),
             no_dist=True)
    folder = tmp_path / "down"
    names = _download(source, "fmt/step-1", folder)
    assert sorted(names) == [".metadata", "__0_0.distcp", "__0_1.distcp"]  # DCP's names: a rank's items over 2
    back = _blank(state)
    dcp.load(back, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
    _same(back, state)
    dcp_to_torch_save(folder, tmp_path / "whole.pt")
    _same(torch.load(tmp_path / "whole.pt", weights_only=False), state)
    # The metadata is DCP's own classes only: it unpickles where blobsync cannot even be imported.
    code = ("import sys, pickle; sys.modules['blobsync'] = None; import torch.distributed.checkpoint; "
            f"m = pickle.load(open({str(folder / '.metadata')!r}, 'rb')); "
            "print(type(next(iter(m.storage_data.values()))).__name__, m.version)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["_StorageInfo", "1.0.0"], out.stderr


def test_a_checkpoint_dcp_wrote_loads_from_blob_in_few_reads(source: Side, azurite: Azurite, proxy: FaultProxy,
                                                            tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    from blobsync.torch import BlobStorageReader

    small = {f"layer{i}.weight": torch.full((16, 8), float(i)) for i in range(200)}
    folder = tmp_path / "stock"
    dcp.save(small, storage_writer=dcp.FileSystemWriter(folder), no_dist=True)
    blobsync.copy(folder, source.url(azurite.base_url, "stock"), blobsync.TransferConfig(recursive=True),
                  as_subdir=False)
    size = sum(p.stat().st_size for p in folder.iterdir())
    back = {k: torch.zeros_like(v) for k, v in small.items()}
    before = proxy.stats.copy()
    dcp.load(back, storage_reader=BlobStorageReader(source.url(proxy.url, "stock")), no_dist=True)
    _same(back, small)
    gets = proxy.stats.requests["get_blob"] - before.requests["get_blob"]
    read = proxy.stats.bytes_out["get_blob"] - before.bytes_out["get_blob"]
    assert gets <= 3, gets  # .metadata, then the one rank file in one merged read (203 before)
    assert read <= size, (read, size)  # every byte at most once


def test_each_blob_is_checked_by_its_composed_crc64_and_by_its_md5_where_asked(source: Side, azurite: Azurite
                                                                                ) -> None:
    """No serial whole MD5 by default (DCP's FileSystemWriter stores no checksum): each blob written in blocks
    carries the CRC64 composed from its blocks'; put_md5=True commits the Content-MD5 too. Both checked against an
    SDK download."""
    import hashlib

    import torch.distributed.checkpoint as dcp
    from awscrt.checksums import crc64nvme

    from blobsync.torch import BlobStorageReader, BlobStorageWriter

    state = _state()
    for put_md5 in (False, True):
        folder = f"sums-{put_md5}/step-1"
        writer = BlobStorageWriter(source.url(azurite.base_url, folder), put_md5=put_md5, thread_count=2,
                                   config=blobsync.TransferConfig(block_size=1 << 20))  # each blob in blocks
        dcp.save(state, storage_writer=writer, no_dist=True)
        parts = [b.name for b in source.client.list_blobs(name_starts_with=f"{folder}/") if b.name.endswith(".distcp")]
        assert len(parts) == 2
        for name in parts:
            blob = source.client.get_blob_client(name)
            data, props = blob.download_blob().readall(), blob.get_blob_properties()
            stored = bytes.fromhex(props.metadata["blobsynccrc64"][:16])
            assert int.from_bytes(stored, "little") == crc64nvme(data), name
            md5 = props.content_settings.content_md5
            assert (bytes(md5) == hashlib.md5(data).digest()) if put_md5 else md5 is None, name
        back = _blank(state)
        dcp.load(back, storage_reader=BlobStorageReader(source.url(azurite.base_url, folder)), no_dist=True)
        _same(back, state)


def test_zip_crc32s_are_left_out_unless_asked_and_the_callers_setting_is_untouched(source: Side, azurite: Azurite,
                                                                                   tmp_path: Path) -> None:
    """torch.load never checks an item's zip CRC32s (the blob's CRC64s are checked): by default they are 0, as
    set_crc32_options(False) saves, and the stock reader loads them; zip_crc32=True writes them, for unzip tools.
    Either way the caller's thread keeps its own setting, whether the items are written in it or in a pool."""
    import zipfile

    import torch.distributed.checkpoint as dcp

    from blobsync.torch import BlobStorageWriter

    state = _state()
    for zip_crc32, threads in ((False, 1), (False, 2), (True, 1), (True, 2)):
        folder = f"crc32-{zip_crc32}-{threads}/step-1"
        dcp.save(state, storage_writer=BlobStorageWriter(source.url(azurite.base_url, folder), zip_crc32=zip_crc32,
                                                         thread_count=threads), no_dist=True)
        assert torch.serialization.get_crc32_options() is True
        down = tmp_path / folder
        _download(source, folder, down)
        metadata = pickle.loads((down / ".metadata").read_bytes())
        items = 0
        for info in metadata.storage_data.values():
            raw = (down / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
            if not raw.startswith(b"PK\x03\x04"):
                continue  # a bytes item
            items += 1
            with zipfile.ZipFile(io.BytesIO(raw)) as item:
                records = [r for r in item.infolist() if r.file_size]
                if zip_crc32:
                    assert item.testzip() is None, info  # every record's CRC32 right
                else:
                    assert all(r.CRC == 0 for r in records), info
        assert items >= 8  # the tensors, and the values the planner saved with torch.save
        back = _blank(state)
        dcp.load(back, storage_reader=dcp.FileSystemReader(down), no_dist=True)
        _same(back, state)


def test_large_tensors_are_sent_from_their_own_memory_and_land_whole(source: Side, azurite: Azurite, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A state's tensor's bytes from LEND_BYTES up go from its own memory, not copied into blocks; the copy a
    strided one is saved from is copied into blocks as before (lent, it would outlive its item while the next
    item's copy is made). Each lands whole: the stock reader loads the SDK's download equal."""
    import torch.distributed.checkpoint as dcp

    from blobsync.blobfile import BlobWriter
    from blobsync.torch import BlobStorageWriter

    lent: list[int] = []
    borrowed = BlobWriter.write_borrowed

    def spied(self: BlobWriter, data: Any) -> int:
        lent.append(memoryview(data).nbytes)
        return borrowed(self, data)

    monkeypatch.setattr(BlobWriter, "write_borrowed", spied)
    state = _state()
    state["strided"] = torch.randn(2048, 1024, generator=torch.Generator().manual_seed(5)).t()  # saved from a copy
    for threads in (1, 3):
        lent.clear()
        folder = f"lent-{threads}/step-1"
        dcp.save(state, storage_writer=BlobStorageWriter(source.url(azurite.base_url, folder), thread_count=threads,
                                                         config=blobsync.TransferConfig(block_size=1 << 20)),
                 no_dist=True)
        assert sorted(lent) == sorted(state[k].nbytes for k in ("big", "big16")), lent
        _download(source, folder, tmp_path / folder)
        back = _blank(state)
        dcp.load(back, storage_reader=dcp.FileSystemReader(tmp_path / folder), no_dist=True)
        _same(back, state)


def test_large_tensors_are_read_once_straight_in(source: Side, azurite: Azurite, proxy: FaultProxy) -> None:
    import torch.distributed.checkpoint as dcp

    from blobsync.torch import BlobStorageReader, BlobStorageWriter

    state = _state()
    dcp.save(state, storage_writer=BlobStorageWriter(source.url(azurite.base_url, "big/step-1")), no_dist=True)
    size = sum(b.size for b in source.client.list_blobs(name_starts_with="big/step-1/"))
    back = _blank(state)
    targets = {k: v.data_ptr() for k, v in back.items() if isinstance(v, torch.Tensor)}
    before = proxy.stats.copy()
    dcp.load(back, storage_reader=BlobStorageReader(source.url(proxy.url, "big/step-1")), no_dist=True)
    _same(back, state)
    assert all(back[k].data_ptr() == p for k, p in targets.items())  # loaded in place
    read = proxy.stats.bytes_out["get_blob"] - before.bytes_out["get_blob"]
    assert read <= size, (read, size)


def test_a_checkpoint_in_blobsyncs_earlier_format_still_loads(source: Side, azurite: Azurite) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    from blobsync.torch import BlobStorageReader
    from blobsync.torch.dcp import BlobStorageInfo

    big, small = torch.randn(1 << 20), torch.arange(12, dtype=torch.int32).reshape(3, 4)
    raw = b"x" + big.numpy().tobytes() + small.numpy().tobytes() + b"bytes!"  # unaligned, as it used to be
    n = big.nbytes
    tensors = {"big": (big, 1), "small": (small, 1 + n)}
    md: dict[str, Any] = {k: TensorStorageMetadata(TensorProperties(dtype=t.dtype), t.size(),
                                                   [ChunkStorageMetadata(torch.Size([0] * t.dim()), t.size())])
                          for k, (t, _) in tensors.items()}
    storage = {MetadataIndex(k, torch.Size([0] * t.dim())): BlobStorageInfo("__0_0.distcp", at, t.nbytes,
                                                                           str(t.dtype), tuple(t.shape))
               for k, (t, at) in tensors.items()}
    source.client.upload_blob("old/__0_0.distcp", raw)
    source.client.upload_blob("old/.metadata", pickle.dumps(Metadata(md, storage_data=storage)))
    back = {"big": torch.zeros_like(big), "small": torch.zeros_like(small)}
    dcp.load(back, storage_reader=BlobStorageReader(source.url(azurite.base_url, "old")), no_dist=True)
    assert torch.equal(back["big"], big) and torch.equal(back["small"], small)


@pytest.mark.parametrize("key", ["w", "n"])
def test_a_planted_item_runs_nothing(key: str, source: Side, azurite: Azurite, tmp_path: Path) -> None:
    """A tensor's item, or a value's (which DCP's planner unpickles with weights_only=False), replaced by a pickle
    that would run code: refused with one line, nothing run."""
    import torch.distributed.checkpoint as dcp

    from blobsync.torch import BlobStorageReader, BlobStorageWriter

    url = source.url(azurite.base_url, "planted/step-1")
    state: dict[str, Any] = {"w": torch.ones(4)} if key == "w" else {"n": {"epoch": 3}}
    dcp.save(state, storage_writer=BlobStorageWriter(url), no_dist=True)
    marker = tmp_path / "ran"

    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (Path.touch, (marker,))

    planted = io.BytesIO()
    torch.save(Boom(), planted)
    metadata = pickle.loads(source.download("planted/step-1/.metadata"))
    for info in metadata.storage_data.values():
        info.length, info.offset = len(planted.getvalue()), 0
    source.client.upload_blob("planted/step-1/__0_0.distcp", planted.getvalue(), overwrite=True)
    source.client.upload_blob("planted/step-1/.metadata", pickle.dumps(metadata), overwrite=True)
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as caught:  # DCP's wrapper of each rank's error (a BaseException)
        dcp.load({"w": torch.zeros(4)} if key == "w" else {"n": {"epoch": 0}}, storage_reader=BlobStorageReader(url),
                 no_dist=True)
    assert not marker.exists()
    text = str(caught.value)
    assert f"item '{key}" in text and "which loading would run: refused" in text, text


def test_consolidate_refuses_bad_input_with_one_line(source: Side, azurite: Azurite) -> None:
    from blobsync.errors import UsageError
    from blobsync.torch import IncompleteCheckpointError, consolidate

    with pytest.raises(IncompleteCheckpointError, match="no complete checkpoint at"):
        consolidate(source.url(azurite.base_url, "nothing/here"))
    for bad in (42, "", "out/"):
        with pytest.raises(UsageError, match="invalid dest=") as caught:
            consolidate(source.url(azurite.base_url, "nothing/here"), bad)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value)
    for rank in (-1, True, "0"):
        with pytest.raises(UsageError, match="invalid rank=") as caught:
            consolidate(source.url(azurite.base_url, "nothing/here"), rank=rank)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value)


def test_overwrite_false_keeps_a_complete_checkpoint_of_either_mode(source: Side, azurite: Azurite) -> None:
    """BlobStorageWriter(overwrite=False) refuses a folder holding a complete checkpoint, saved with collectives
    (`.metadata`) or without (`__<rank>.metadata`), in either mode, before it deletes or writes anything."""
    import torch.distributed.checkpoint as dcp

    from blobsync.torch import BlobStorageReader, BlobStorageWriter

    def names(folder: str) -> list[str]:
        return sorted(b.name.rsplit("/", 1)[1] for b in source.client.list_blobs(name_starts_with=folder + "/"))

    for first, then in ((True, False), (False, True), (True, True), (False, False)):
        folder = f"keep/{first}-{then}"
        url = source.url(azurite.base_url, folder)
        dcp.save({"w": torch.ones(64)}, storage_writer=BlobStorageWriter(url), no_dist=True, use_collectives=first)
        before = names(folder)
        # DCP raises what a rank raised in its planning as a CheckpointException (a BaseException) that carries it.
        with pytest.raises(BaseException, match="holds a complete checkpoint already") as caught:
            dcp.save({"w": torch.zeros(64)}, storage_writer=BlobStorageWriter(url, overwrite=False), no_dist=True,
                     use_collectives=then)
        assert isinstance(caught.value, Exception if not then else BaseException)
        assert names(folder) == before
        back = {"w": torch.zeros(64)}
        dcp.load(back, storage_reader=BlobStorageReader(url), no_dist=True)
        assert torch.equal(back["w"], torch.ones(64))
