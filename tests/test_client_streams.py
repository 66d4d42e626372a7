"""Streams in and out of a Client (issue 27, part 3): chunks from iterators, file objects that read with read-ahead
and write with a commit on close; numpy and pickle on them unchanged; every byte checked with an SDK download."""

from __future__ import annotations

import asyncio
import io
import os
import pickle
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest

import blobsync
from blobsync import TransferConfig
from blobsync.config import MiB
from conftest import ContainerHandle
from support.cli import random_file
from support.proxy import FaultProxy


def _config(tmp_path: Path) -> TransferConfig:
    return TransferConfig.from_mib(block_size_mb=1, journal_path=tmp_path / "j.db")


def test_put_takes_chunks_from_an_iterator_and_an_async_iterator(container: ContainerHandle, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 12345)

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(data), 100_000):
            yield data[i:i + 100_000]

    async def achunks() -> AsyncIterator[memoryview]:
        for i in range(0, len(data), 300_001):
            await asyncio.sleep(0)
            yield memoryview(data)[i:i + 300_001]

    with blobsync.Client(container.url, _config(tmp_path)) as client:
        first = client.put(chunks(), "it.bin")
        small = client.put(iter([b"ab", b"cd"]), "small.bin")
        assert small.size == 4 and small.etag

    async def run() -> blobsync.FileResult:
        async with blobsync.aio.Client(container.url, _config(tmp_path)) as aclient:
            return await aclient.put(achunks(), "ait.bin")

    second = asyncio.run(run())
    assert container.download("it.bin") == data == container.download("ait.bin")
    assert container.download("small.bin") == b"abcd"
    for result in (first, second):
        props = container.client.get_blob_client("it.bin" if result is first else "ait.bin").get_blob_properties()
        assert result.etag == props.etag and result.size == len(data)
        assert bytes(props.content_settings.content_md5) == result.content_md5


def test_a_failing_iterator_commits_nothing(container: ContainerHandle, tmp_path: Path) -> None:
    def broken() -> Iterator[bytes]:
        yield os.urandom(2 * MiB)
        raise RuntimeError("the producer failed")

    with blobsync.Client(container.url, _config(tmp_path)) as client, pytest.raises(RuntimeError):
        client.put(broken(), "half.bin")
    assert container.blob_names() == []


def test_numpy_and_pickle_write_and_read_through_open(container: ContainerHandle, tmp_path: Path) -> None:
    array = np.arange(600_000, dtype=np.float64).reshape(600, 1000)  # ~4.6 MiB: several blocks
    state = {"epoch": 3, "weights": os.urandom(1_500_000), "names": ["a", "b"]}
    with blobsync.Client(container.url, _config(tmp_path)) as client:
        with client.open("ckpt/array.npy", "wb") as f:
            np.save(f, array)
        with client.open("ckpt/state.pkl", "wb") as f:
            pickle.dump(state, f)
        assert f.result is not None and f.result.etag  # type: ignore[union-attr]
        with client.open("ckpt/array.npy", "rb") as f:
            loaded = np.load(f)
        with client.open("ckpt/state.pkl", "rb") as f:
            restored = pickle.load(f)
    assert np.array_equal(loaded, array) and restored == state
    assert np.array_equal(np.load(io.BytesIO(container.download("ckpt/array.npy"))), array)
    assert pickle.loads(container.download("ckpt/state.pkl")) == state


def test_an_exception_inside_with_leaves_no_blob_and_nothing_is_visible_before_close(
        container: ContainerHandle, tmp_path: Path) -> None:
    with blobsync.Client(container.url, _config(tmp_path)) as client:
        with pytest.raises(ValueError), client.open("partial.bin", "wb") as f:
            f.write(os.urandom(3 * MiB))
            assert container.blob_names() == []  # blocks staged, nothing committed
            raise ValueError("the training step failed")
        writer = client.open("late.bin", "wb")
        writer.write(b"x" * (2 * MiB + 1))
        assert container.blob_names() == []
        writer.close()
    assert container.blob_names() == ["late.bin"]
    assert container.download("late.bin") == b"x" * (2 * MiB + 1)


def test_the_reader_seeks_reads_ahead_and_stays_on_one_version(container: ContainerHandle, tmp_path: Path) -> None:
    data = os.urandom(5 * MiB + 7)
    container.client.upload_blob("r.bin", data)
    with blobsync.Client(container.url, _config(tmp_path)) as client:
        with client.open("r.bin", "rb") as f:
            assert f.read(10) == data[:10]
            f.seek(4 * MiB + 3)
            assert f.read(MiB) == data[4 * MiB + 3:5 * MiB + 3]
            f.seek(-5, io.SEEK_END)
            assert f.read() == data[-5:]
            f.seek(100)
            assert f.tell() == 100 and f.read(MiB) == data[100:MiB + 100]
        with client.open("r.bin", "rb") as f:
            f.read(10)
            container.client.upload_blob("r.bin", b"changed", overwrite=True)
            f.seek(5 * MiB)  # past the blocks read ahead (0-4): fetched now, of a version that is gone
            with pytest.raises(blobsync.BlobsyncError):
                f.read(7)
        with pytest.raises(blobsync.UsageError, match="binary only"):
            client.open("r.bin", "r")


def test_both_readers_keep_blocks_read_for_a_seek_back(container: ContainerHandle, proxy: FaultProxy,
                                                      tmp_path: Path) -> None:
    """torch.load's pattern (the zip's end, then its records from the start, then the end again): the blocking and
    the async reader share one read-ahead, which keeps blocks already fetched outside its window."""
    data = os.urandom(12 * MiB)
    container.client.upload_blob("z.bin", data)
    url = f"{proxy.endpoint()}/{container.name}"

    def pattern(read_at: object) -> list[bytes]:
        return [read_at(11 * MiB, 10), read_at(0, 10), read_at(11 * MiB + 5, 10)]  # type: ignore[operator]

    with blobsync.Client(url, _config(tmp_path)) as client, client.open("z.bin", "rb", read_ahead=1) as f:
        before = proxy.stats.requests["get_blob"]
        got = pattern(lambda at, n: (f.seek(at), f.read(n))[1])
        blocking = proxy.stats.requests["get_blob"] - before

    async def main() -> list[bytes]:
        async with blobsync.aio.Client(url, _config(tmp_path)) as client, client.open("z.bin", read_ahead=1) as r:
            out = []
            for at in (11 * MiB, 0, 11 * MiB + 5):
                r.seek(at)
                out.append(await r.read(10))
            return out

    before = proxy.stats.requests["get_blob"]
    got_async = asyncio.run(main())
    fetched_async = proxy.stats.requests["get_blob"] - before
    expected = [data[11 * MiB:11 * MiB + 10], data[:10], data[11 * MiB + 5:11 * MiB + 15]]
    assert got == got_async == expected
    assert blocking == fetched_async == 3  # blocks 11, 0 and 1: block 11 is not fetched twice


def test_torch_load_through_the_reader_receives_each_byte_about_once(container: ContainerHandle, proxy: FaultProxy,
                                                                     tmp_path: Path) -> None:
    """torch.load reads a block, seeks to the zip's end, then reads the records from the start: the blocks fetched
    ahead before the seek are kept (never cancelled half sent), and so are the end's, for its last reads."""
    import torch

    state = {f"t{i}": torch.randn(2 << 20, generator=torch.Generator().manual_seed(i)) for i in range(5)}  # 40 MiB
    url = f"{proxy.endpoint()}/{container.name}"
    config = TransferConfig(block_size=4 * MiB, journal_path=tmp_path / "j.db")
    with blobsync.Client(url, config) as client:
        with client.open("s.pt", "wb") as out:
            torch.save(state, out)
        size = client.stat("s.pt").size
        proxy.reset_stats()
        back = torch.load(client.open("s.pt"), weights_only=True)
    assert all(torch.equal(back[k], v) for k, v in state.items())
    assert proxy.stats.bytes_out["get_blob"] <= size + 4 * MiB  # one block at most read twice
    assert not [e for e in proxy.log if e.op == "get_blob" and e.fault == "client_gone"]  # no fetch abandoned


def test_the_async_client_opens_blobs_to_read_and_write(container: ContainerHandle, tmp_path: Path) -> None:
    data = os.urandom(5 * MiB + 7)

    async def main() -> tuple[bytes, bytes, int, list[str]]:
        async with blobsync.aio.Client(container.url, _config(tmp_path)) as client:
            async with client.open("a.bin", "wb") as w:
                await w.write(data[:MiB])
                await w.write(data[MiB:])
                seen_before_close = container.blob_names()
            assert w.result is not None and w.result.size == len(data)
            with pytest.raises(ValueError):
                async with client.open("never.bin", "wb") as w2:
                    await w2.write(b"y" * (3 * MiB))
                    raise ValueError("stop")
            async with client.open("a.bin") as r:
                head = await r.read(10)
                r.seek(-9, io.SEEK_END)
                tail = await r.read()
                r.seek(MiB - 3)
                buf = bytearray(MiB)
                n = await r.readinto(buf)
                assert bytes(buf[:n]) == data[MiB - 3:MiB - 3 + n]
            f = await client.open("a.bin")
            whole = await f.read()
            await f.close()
            assert whole == data
            return head, tail, n, seen_before_close

    head, tail, n, before = asyncio.run(main())
    assert head == data[:10] and tail == data[-9:] and n > 0
    assert before == []  # blocks staged, nothing committed until close
    assert container.blob_names() == ["a.bin"]  # the write that raised left nothing
    assert container.download("a.bin") == data


def test_the_client_watches_a_folder_in_its_session(container: ContainerHandle, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "a.pt").write_bytes(b"weights")
    stop = threading.Event()
    reports: list[blobsync.Report] = []

    def on_round(report: blobsync.Report) -> None:
        reports.append(report)
        stop.set()  # one round, then stop

    with blobsync.Client(container.url, _config(tmp_path)) as client:
        rounds = client.watch(folder, client.url_for("run"), settle=0, stop=stop, on_round=on_round)
    assert rounds == 1 and reports[0].files_transferred == 1
    assert container.download("run/a.pt") == b"weights"


_PUT_FILE = """
import sys
import blobsync
config = blobsync.TransferConfig.from_mib(block_size_mb=1, concurrency=2, journal_path=sys.argv[3])
with blobsync.Client(sys.argv[1], config) as client, open(sys.argv[2], "rb") as f:
    client.put(f, "big.bin")
"""


def test_a_file_object_put_resumes_like_a_path_after_a_kill(
        container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    data = random_file(tmp_path / "big.bin", 8 * MiB, seed=11)
    url = f"{proxy.endpoint()}/{container.name}"
    script = tmp_path / "put.py"
    script.write_text(_PUT_FILE)
    proxy.hold_after("put_block", 4)
    child = subprocess.Popen([sys.executable, str(script), url, str(tmp_path / "big.bin"), str(tmp_path / "j.db")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proxy.wait_for_held(1, timeout=60)
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=30)
    proxy.clear_rules()
    proxy.release_holds()
    proxy.wait_idle()
    acknowledged = proxy.stats.ok("put_block")
    assert acknowledged >= 4 and container.blob_names() == []
    proxy.reset_stats()
    config = TransferConfig.from_mib(block_size_mb=1, journal_path=tmp_path / "j.db")
    with blobsync.Client(url, config) as client, open(tmp_path / "big.bin", "rb") as f:
        result = client.put(f, "big.bin")
    assert proxy.stats.requests["put_block"] == 8 - acknowledged  # only the blocks not acknowledged before
    assert result.bytes_sent == (8 - acknowledged) * MiB
    assert container.download("big.bin") == data


def _budget_peak(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The most any MemoryBudget counts (buffers and reservations) once it has handed out a buffer, as it goes."""
    from blobsync.engine.budget import MemoryBudget

    peak = [0]
    taken = MemoryBudget.buffer

    async def watched(self: MemoryBudget, capacity: int) -> object:
        buf = await taken(self, capacity)
        peak[0] = max(peak[0], self.counted)
        return buf

    monkeypatch.setattr(MemoryBudget, "buffer", watched)
    return peak


def test_readers_read_ahead_within_the_clients_one_memory_budget(container: ContainerHandle, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Three readers reading ahead 4 blocks each at once, under a budget of two blocks: every block is fetched into
    a pooled buffer of the budget (never more than the budget at once), and every read is right."""
    data = os.urandom(6 * MiB + 3)
    container.client.upload_blob("r.bin", data)
    peak = _budget_peak(monkeypatch)
    config = TransferConfig.from_mib(block_size_mb=1, memory_mb=2, journal_path=tmp_path / "j.db")

    async def main() -> list[bytes]:
        async with blobsync.aio.Client(container.url, config) as client:
            async def one() -> bytes:
                async with client.open("r.bin", read_ahead=4) as r:
                    return await r.read()

            return await asyncio.gather(one(), one(), one())

    assert asyncio.run(main()) == [data] * 3
    assert 0 < peak[0] <= 2 * MiB


def test_a_stream_over_blocks_another_tool_left_clears_them_once_and_lands(container: ContainerHandle,
                                                                          tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 7)
    left = container.client.get_blob_client("s.bin")
    left.stage_block("eA==", b"stale")  # another tool's aborted upload: a block ID of another length
    with blobsync.Client(container.url, TransferConfig.from_mib(block_size_mb=1, journal_path=tmp_path / "j.db")
                         ) as client, client.open("s.bin", "wb") as f:
        f.write(data)
    assert container.download("s.bin") == data
    assert left.get_block_list("uncommitted")[1] == []


def test_open_writers_beyond_the_memory_budget_interleave_and_stay_within_it(
        container: ContainerHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four writers open at once, written in turn from one task, under a budget of two blocks: each full block goes
    through the one chunk loop in a buffer of the budget (never more than the budget at once), while the block a
    writer is still filling waits on its caller outside it, so no writer waits for another's caller. All land."""
    datas = [os.urandom(2 * MiB + 300_000 + i) for i in range(4)]
    peak = _budget_peak(monkeypatch)
    config = TransferConfig.from_mib(block_size_mb=1, memory_mb=2, journal_path=tmp_path / "j.db")

    async def main() -> None:
        async with blobsync.aio.Client(container.url, config) as client:
            files = [await client.open(f"w{i}.bin", "wb") for i in range(4)]
            for at in range(0, max(len(d) for d in datas), 300_000):
                for f, data in zip(files, datas, strict=True):
                    if at < len(data):
                        await f.write(data[at:at + 300_000])
            for f in files:
                await f.close()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert [container.download(f"w{i}.bin") for i in range(4)] == datas
    assert 0 < peak[0] <= 2 * MiB


def test_a_borrowed_write_sends_its_whole_blocks_from_the_callers_memory(container: ContainerHandle, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """write_borrowed takes no buffer of the budget for the whole blocks it holds (the caller keeps them unchanged
    until close); the block begun by other writes and the tail still go through buffers. With the whole MD5 too,
    the blob is what was written, and changing the memory after close changes nothing."""
    import hashlib

    from blobsync.blobfile import BlobWriter
    from blobsync.engine.budget import MemoryBudget

    taken = [0]
    buffer = MemoryBudget.buffer

    async def counted(self: MemoryBudget, capacity: int) -> object:
        taken[0] += 1
        return await buffer(self, capacity)

    monkeypatch.setattr(MemoryBudget, "buffer", counted)
    head, lent, tail = os.urandom(300_000), bytearray(os.urandom(4 * MiB)), os.urandom(MiB // 2)
    with blobsync.Client(container.url, _config(tmp_path)) as client:
        for put_md5 in (False, True):
            taken[0] = 0
            with client.open(f"lent-{put_md5}.bin", "wb", config=TransferConfig.from_mib(
                    block_size_mb=1, put_md5=put_md5, journal_path=tmp_path / "j.db")) as f:
                assert isinstance(f, BlobWriter)
                f.write(head)
                f.write_borrowed(memoryview(lent))  # fills the begun block (copied), 3 whole blocks, a tail
                f.write(tail)
            assert taken[0] == 2, taken  # the begun block and the last one; 5 where every block is copied
            want = head + bytes(lent) + tail
            lent[:] = bytes(len(lent))
            assert container.download(f"lent-{put_md5}.bin") == want
            md5 = container.client.get_blob_client(f"lent-{put_md5}.bin").get_blob_properties().content_settings
            assert (bytes(md5.content_md5) == hashlib.md5(want).digest()) if put_md5 else md5.content_md5 is None
            lent[:] = os.urandom(len(lent))


def test_borrowed_blocks_retried_after_faults_land_right(container: ContainerHandle, proxy: FaultProxy,
                                                         tmp_path: Path) -> None:
    """A block sent from the caller's memory is read again for its retry: 503s and a reset on Put Block are
    ridden out, the commit lands, and the SDK reads back exactly what was written."""
    from support.proxy import Rule, reset_before, respond

    proxy.add_rule(Rule("put_block", respond(503, "ServerBusy", retry_after=0.1), probability=0.3, seed=11))
    proxy.add_rule(Rule("put_block", reset_before(), nth=2))
    lent = bytearray(os.urandom(5 * MiB))
    with blobsync.Client(f"{proxy.endpoint()}/{container.name}", _config(tmp_path)) as client, \
            client.open("faulted.bin", "wb") as f:
        f.write(b"head")
        f.write_borrowed(memoryview(lent))  # type: ignore[union-attr]
    assert sum(proxy.stats.faults.values()) >= 2
    assert container.download("faulted.bin") == b"head" + bytes(lent)


def test_a_stream_creates_its_container_where_create_container_says_so(container: ContainerHandle,
                                                                        tmp_path: Path) -> None:
    """As a job does: put() and open('wb') into a container not there make it first with create_container=True
    (before, the setting was dropped on streams) and fail with one line without it."""
    from azure.storage.blob import ContainerClient

    from blobsync.errors import ContainerNotFoundError

    data = os.urandom(2 * MiB + 7)
    config = TransferConfig.from_mib(block_size_mb=1, journal_path=tmp_path / "j.db", create_container=True)
    for suffix, small in (("-s", True), ("-b", False)):
        with blobsync.Client(container.url + suffix, config) as client:
            if small:
                client.put(iter([b"tiny"]), "t.bin")
            else:
                with client.open("big.bin", "wb") as f:
                    f.write(data)
        made = ContainerClient.from_container_url(container.client.url + suffix,
                                                  credential=container.client.credential)
        assert made.download_blob("t.bin" if small else "big.bin").readall() == (b"tiny" if small else data)
    with blobsync.Client(container.url + "-x", _config(tmp_path)) as client, \
            pytest.raises(ContainerNotFoundError) as caught:
        client.put(iter([b"tiny"]), "t.bin")
    assert "\n" not in str(caught.value)
