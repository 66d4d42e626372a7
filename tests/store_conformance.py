"""The contract every Store keeps, as rclone's fstests are for its backends: one list of cases, run against each
store (tests/test_store_conformance.py runs them on the in-memory store and on Azurite).

Each case is `async def case(store, read_back)`: `store` opens an empty container; `read_back(name)` returns an
object's bytes read independently of the store under test (the SDK for Azurite)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Awaitable, Callable

import pytest

from blobsync.backends.base import BlobHeaders, Conditions, Store
from blobsync.checksums import choose_check, part_check
from blobsync.errors import (
    BlobNotFoundError,
    BlobsyncError,
    ConflictError,
    CorruptedInTransitError,
    InvalidBlockListError,
    Scope,
    StagingRefusedError,
)

ReadBack = Callable[[str], bytes]
Case = Callable[[Store, ReadBack], Awaitable[None]]
HEADERS = BlobHeaders("application/octet-stream", None, {"origin": "conformance"})
CASES: list[Case] = []


def case(fn: Case) -> Case:
    CASES.append(fn)
    return fn


def _md5(data: bytes) -> bytes:
    return hashlib.md5(data).digest()


@case
async def put_then_stat_and_read(store: Store, read_back: ReadBack) -> None:
    data = os.urandom(3000)
    result = await store.put("dir/a.bin", data, BlobHeaders("text/plain", _md5(data), {"k": "v"}))
    props = await store.stat("dir/a.bin")
    assert props is not None and props.size == 3000 and props.etag == result.etag
    assert props.content_md5 == _md5(data) and props.content_type == "text/plain" and props.metadata["k"] == "v"
    buf = bytearray(1000)
    got = await store.read_into("dir/a.bin", 1000, memoryview(buf))
    assert bytes(buf) == data[1000:2000] and got.size == 3000 and got.etag == result.etag
    assert read_back("dir/a.bin") == data


@case
async def a_missing_object_is_none_or_not_found(store: Store, read_back: ReadBack) -> None:
    assert await store.stat("nope") is None
    with pytest.raises(BlobNotFoundError):
        await store.read_into("nope", 0, memoryview(bytearray(4)))


@case
async def the_first_bytes_come_with_the_properties_in_one_call(store: Store, read_back: ReadBack) -> None:
    data = os.urandom(5000)
    result = await store.put("f/whole.bin", data, BlobHeaders("application/octet-stream", _md5(data), {}))
    await store.put("f/empty.bin", b"", BlobHeaders("application/octet-stream", _md5(b""), {}))
    for room, expect in ((8192, data), (5000, data), (1000, data[:1000])):
        buf = bytearray(room)
        props, got = await store.read_first("f/whole.bin", memoryview(buf))
        assert bytes(buf[:got]) == expect and props.size == 5000 and props.etag == result.etag
        assert props.content_md5 == _md5(data)
    props, got = await store.read_first("f/empty.bin", memoryview(bytearray(16)))
    assert (props.size, got) == (0, 0)
    with pytest.raises(BlobNotFoundError):
        await store.read_first("f/nope.bin", memoryview(bytearray(16)))


@case
async def put_keeps_its_preconditions(store: Store, read_back: ReadBack) -> None:
    first = await store.put("c.bin", b"one", HEADERS, Conditions(if_none_match_any=True))
    with pytest.raises(ConflictError):
        await store.put("c.bin", b"two", HEADERS, Conditions(if_none_match_any=True))
    with pytest.raises(ConflictError):
        await store.put("c.bin", b"two", HEADERS, Conditions(if_match='"0x1234"'))
    await store.put("c.bin", b"three", HEADERS, Conditions(if_match=first.etag))
    assert read_back("c.bin") == b"three"


@case
async def a_body_that_arrives_damaged_is_refused_and_retryable(store: Store, read_back: ReadBack) -> None:
    with pytest.raises(CorruptedInTransitError) as caught:
        await store.put("bad.bin", b"data", BlobHeaders("text/plain", _md5(b"other"), {}))
    assert caught.value.retryable and caught.value.scope is Scope.JOB
    assert await store.stat("bad.bin") is None
    writer = store.writer("bad2.bin", "0123456789abcdef")
    for kind in store.capabilities.part_checks:  # every check the store says it verifies, verified
        with pytest.raises(CorruptedInTransitError) as caught:
            await writer.stage(0, b"data", part_check(b"other", kind))
        assert caught.value.retryable
        await writer.stage(0, b"data", part_check(b"data", kind))


@case
async def reads_check_the_version_and_may_send_the_range_md5(store: Store, read_back: ReadBack) -> None:
    data = os.urandom(5000)
    put = await store.put("r.bin", data, HEADERS)
    buf = bytearray(2000)
    got = await store.read_into("r.bin", 3000, memoryview(buf), put.etag, range_md5=True)
    assert bytes(buf) == data[3000:]
    if store.capabilities.range_md5_max >= 2000:
        assert got.range_md5 == _md5(data[3000:])
    with pytest.raises(ConflictError):
        await store.read_into("r.bin", 0, memoryview(bytearray(10)), '"0xdeadbeef"')
    await store.put("empty.bin", b"", HEADERS)
    empty = await store.read_into("empty.bin", 0, memoryview(bytearray()))
    assert empty.size == 0


class _Pieces:
    """Consecutive buffers of the given sizes, as the engine hands them to a span read."""

    def __init__(self, *sizes: int) -> None:
        self.buffers = [bytearray(n) for n in sizes]
        self.given = 0
        self.filled: list[bytes] = []

    async def next(self) -> memoryview | None:
        if self.given == len(self.buffers):
            return None
        self.given += 1
        return memoryview(self.buffers[self.given - 1])

    def full(self, view: memoryview) -> None:
        self.filled.append(bytes(view))


@case
async def a_span_fills_its_pieces_in_order_at_the_version_asked(store: Store, read_back: ReadBack) -> None:
    if not store.capabilities.spans:
        return
    data = os.urandom(10_000)
    put = await store.put("s.bin", data, HEADERS)
    pieces = _Pieces(3000, 3000, 2500)
    got = await store.read_span("s.bin", 1000, 8500, pieces, put.etag)
    assert pieces.filled == [data[1000:4000], data[4000:7000], data[7000:9500]]
    assert got.size == 10_000 and got.etag == put.etag
    with pytest.raises(ConflictError):
        await store.read_span("s.bin", 0, 10, _Pieces(10), '"0xdeadbeef"')


@case
async def a_chunked_write_commits_its_parts_in_order(store: Store, read_back: ReadBack) -> None:
    nonce = "00112233aabbccdd"
    writer = store.writer("big.bin", nonce)
    assert writer.token(3) == store.writer("big.bin", nonce).token(3)  # the same on resume, on any machine
    assert writer.token(3) != store.writer("big.bin", "ffeeddccbbaa9988").token(3)
    assert len({len(writer.token(i)) for i in (0, 9, 10, 49_999)}) == 1
    blocks = [os.urandom(1000 + i) for i in range(4)]
    check = choose_check(store.capabilities.part_checks)
    for i in (2, 0, 3, 1):  # staged in any order
        await writer.stage(i, blocks[i], check and part_check(blocks[i], check))
    assert await store.stat("big.bin") is None  # nothing is visible before the commit
    listing = await writer.parts()
    assert sorted((p.token, p.size) for p in listing.staged) == sorted(
        (writer.token(i), len(b)) for i, b in enumerate(blocks))
    assert listing.committed == ()
    result = await writer.commit([(writer.token(i), False) for i in range(4)],
                                 BlobHeaders("application/x-test", _md5(b"".join(blocks)), {"m": "1"}))
    committed = await writer.parts(staged=False)
    assert [(p.token, p.size) for p in committed.committed] == [(writer.token(i), len(b)) for i, b in enumerate(blocks)]
    assert committed.etag == result.etag
    assert (await writer.parts()).staged == ()  # a commit leaves nothing staged
    props = await store.stat("big.bin")
    assert props is not None and props.content_md5 == _md5(b"".join(blocks)) and props.metadata["m"] == "1"
    assert read_back("big.bin") == b"".join(blocks)


@case
async def a_commit_of_parts_the_store_lacks_is_refused(store: Store, read_back: ReadBack) -> None:
    writer = store.writer("x.bin", "0123456789abcdef")
    await writer.stage(0, b"zero", None)
    with pytest.raises(InvalidBlockListError):
        await writer.commit([(writer.token(0), False), (writer.token(1), False)], HEADERS)
    with pytest.raises(ConflictError):
        await writer.commit([(writer.token(0), False)], HEADERS, Conditions(if_match='"0xdeadbeef"'))
    await writer.commit([(writer.token(0), False)], HEADERS, Conditions(if_none_match_any=True))
    assert read_back("x.bin") == b"zero"


@case
async def a_new_version_may_keep_parts_of_the_current_one(store: Store, read_back: ReadBack) -> None:
    if not store.capabilities.keeps_parts:
        pytest.skip("this store cannot keep parts across versions")
    old = store.writer("d.bin", "0000000000000001")
    await old.stage(0, b"A" * 100, None)
    await old.stage(1, b"B" * 100, None)
    v1 = await old.commit([(old.token(0), False), (old.token(1), False)], HEADERS)
    new = store.writer("d.bin", "0000000000000002")
    await new.stage(1, b"C" * 100, None)
    # Over a version that is not the current one: refused, nothing mixed. (Not '"0x1"': the memory store's first
    # ETag in a process is that, so a run where this case came first saw its commit accepted.)
    stale = '"0x8DEADBEEFCAFE00"'
    assert v1.etag != stale
    with pytest.raises(ConflictError):
        await new.commit([(old.token(0), True), (new.token(1), False)], HEADERS, Conditions(if_match=stale))
    await new.stage(1, b"C" * 100, None)
    await new.commit([(old.token(0), True), (new.token(1), False)], HEADERS, Conditions(if_match=v1.etag))
    assert read_back("d.bin") == b"A" * 100 + b"C" * 100
    parts = await new.parts(staged=False)
    assert [p.token for p in parts.committed] == [old.token(0), new.token(1)]


@case
async def parts_another_writer_left_are_cleared_on_request(store: Store, read_back: ReadBack) -> None:
    await store.put("s.bin", b"committed", HEADERS)
    foreign = store.writer("s.bin", "a-much-longer-nonce-of-another-tool")
    await foreign.stage(0, b"theirs", None)
    ours = store.writer("s.bin", "0123456789abcdef")
    with pytest.raises(StagingRefusedError):
        await ours.stage(0, b"ours", None)
    etag = await ours.clear_stale(HEADERS, Conditions())
    assert etag is not None
    assert read_back("s.bin") == b"committed"  # the current version is kept
    await ours.stage(0, b"ours", None)
    await ours.commit([(ours.token(0), False)], HEADERS, Conditions(if_match=etag))
    assert read_back("s.bin") == b"ours"
    assert await ours.clear_stale(HEADERS, Conditions()) is None  # nothing left to clear


@case
async def parts_another_writer_left_on_no_object_are_cleared_without_making_one(store: Store,
                                                                                read_back: ReadBack) -> None:
    foreign = store.writer("n.bin", "a-much-longer-nonce-of-another-tool")
    await foreign.stage(0, b"theirs", None)
    ours = store.writer("n.bin", "0123456789abcdef")
    assert await ours.clear_stale(HEADERS, Conditions(if_none_match_any=True)) == ""
    assert await store.stat("n.bin") is None  # no (empty) object is left for a later run to take as there
    await ours.stage(0, b"ours", None)
    await ours.commit([(ours.token(0), False)], HEADERS, Conditions(if_none_match_any=True))
    assert read_back("n.bin") == b"ours"


@case
async def clearing_parts_honours_the_writes_conditions(store: Store, read_back: ReadBack) -> None:
    v1 = await store.put("c.bin", b"theirs, made meanwhile", HEADERS)
    await store.writer("c.bin", "a-much-longer-nonce-of-another-tool").stage(0, b"left", None)
    ours = store.writer("c.bin", "0123456789abcdef")
    with pytest.raises(ConflictError):  # create-only (--overwrite false): the object is there now
        await ours.clear_stale(HEADERS, Conditions(if_none_match_any=True))
    with pytest.raises(ConflictError):  # over a version compared earlier, which is not this one
        await ours.clear_stale(HEADERS, Conditions(if_match='"0x8DEADBEEFCAFE00"'))
    assert read_back("c.bin") == b"theirs, made meanwhile"
    assert await ours.clear_stale(HEADERS, Conditions(if_match=v1.etag))  # the ETag of the version kept
    assert read_back("c.bin") == b"theirs, made meanwhile"


@case
async def listing_pages_through_everything_under_a_prefix(store: Store, read_back: ReadBack) -> None:
    names = [f"p/{i:03d}" for i in range(23)] + ["p/sub/é ü.txt", "q/other"]
    for name in names:
        await store.put(name, name.encode(), HEADERS)
    store.page_size = 5  # type: ignore[attr-defined]  # every store pages; a small page takes several
    listed = [p async for p in store.list_objects("p/")]
    assert [p.name for p in listed] == sorted(n for n in names if n.startswith("p/"))
    assert all(p.size == len(p.name.encode()) for p in listed)
    page, marker = await store.list_page("p/")
    assert len(page) == 5 and marker
    rest, _ = await store.list_page("p/", marker)
    assert rest[0].name == listed[5].name
    assert [p.name async for p in store.list_objects("nothing/")] == []
    assert read_back("p/sub/é ü.txt") == "p/sub/é ü.txt".encode()


@case
async def a_level_lists_its_objects_and_the_prefixes_below(store: Store, read_back: ReadBack) -> None:
    if not store.capabilities.lists_levels:
        pytest.skip("this store lists no levels")
    for name in ("top/a.bin", "top/b.bin", "top/sub1/x", "top/sub1/deep/y", "top/sub2/z", "other/w"):
        await store.put(name, b"x", HEADERS)
    objects, below, marker = await store.list_level("top/")
    assert [p.name for p in objects] == ["top/a.bin", "top/b.bin"] and below == ["top/sub1/", "top/sub2/"]
    assert marker == ""
    objects, below, _ = await store.list_level("")
    assert objects == [] and below == ["other/", "top/"]


@case
async def a_listing_starts_at_any_name_and_goes_on_from_its_marker(store: Store, read_back: ReadBack) -> None:
    if not store.capabilities.lists_from:
        pytest.skip("this store lists from no name")
    names = ["r/a", "r/b&c", "r/b/x", "r/bb", "r/c é", "r/d", "rr"]
    for name in names:
        await store.put(name, b"x", HEADERS)
    page, marker = await store.list_range("r/", "r/b&c", "", 2)  # inclusive of the name it starts at
    assert [p.name for p in page] == ["r/b&c", "r/b/x"] and marker
    rest, marker = await store.list_range("r/", "r/b&c", marker)
    assert [p.name for p in rest] == ["r/bb", "r/c é", "r/d"] and marker == ""
    first, _ = await store.list_range("r/", "r/bc", "", 1)  # a name that is none: the first one after it
    assert [p.name for p in first] == ["r/c é"]
    assert (await store.list_range("r/", "r/e"))[0] == []


@case
async def deletes_say_what_they_did(store: Store, read_back: ReadBack) -> None:
    v = await store.put("del.bin", b"x", HEADERS)
    with pytest.raises(ConflictError):
        await store.delete("del.bin", '"0xdeadbeef"')
    assert await store.delete("del.bin", v.etag) is True
    assert await store.delete("del.bin") is False
    if not store.capabilities.batch_delete_max:
        return
    for name in ("m1", "m2"):
        await store.put(name, b"y", HEADERS)
    results = await store.delete_many([("m1", None), ("gone", None), ("m2", '"0xdeadbeef"')])
    assert results[0] is True and results[1] is False
    assert isinstance(results[2], BlobsyncError)
    assert await store.stat("m1") is None and await store.stat("m2") is not None


@case
async def creating_a_container_that_exists_says_so(store: Store, read_back: ReadBack) -> None:
    assert await store.create_container() is False
    assert store.location.path == "" and store.container_url.endswith(store.location.container)


@case
async def the_service_copies_an_object_whole_or_by_ranges_at_the_version_asked(store: Store, read_back: ReadBack
                                                                               ) -> None:
    if not (store.capabilities.copy_sources and store.capabilities.copy_max and store.capabilities.stage_copy_max):
        pytest.skip("this store copies nothing itself")
    data = os.urandom(5000)
    put = await store.put("src/a.bin", data, BlobHeaders("text/x-src", _md5(data), {"from": "source"},
                                                         tags={"stage": "raw"}))
    source = await store.copy_source("src/a.bin", put.etag, store.location)
    assert "sig=" not in repr(source) and source.display in repr(source)  # the secret stays out of its repr
    await store.copy_from("copy/whole.bin", source, copy_tags=store.capabilities.tags)
    props = await store.stat("copy/whole.bin")
    assert props is not None and props.content_type == "text/x-src" and props.metadata == {"from": "source"}
    if store.capabilities.tags:
        assert await store.tags("copy/whole.bin") == {"stage": "raw"} == await store.tags("src/a.bin")
    assert read_back("copy/whole.bin") == data
    writer = store.writer("copy/ranges.bin", "0123456789abcdef")
    for i, (offset, length) in enumerate(((0, 2000), (2000, 2000), (4000, 1000))):
        await writer.stage_from(i, source, offset, length)
    await writer.commit([(writer.token(i), False) for i in range(3)], BlobHeaders("text/x-dst", _md5(data), {}))
    assert read_back("copy/ranges.bin") == data
    await store.put("src/a.bin", b"changed", HEADERS)  # the version asked for is gone: both refuse, by name
    with pytest.raises(ConflictError) as whole:
        await store.copy_from("copy/late.bin", source)
    with pytest.raises(ConflictError) as ranged:
        await store.writer("copy/late.bin", "0123456789abcdef").stage_from(0, source, 0, 7)
    assert (whole.value.code, ranged.value.code) == ("SourceConditionNotMet",) * 2, (whole.value, ranged.value)
    assert await store.stat("copy/late.bin") is None
