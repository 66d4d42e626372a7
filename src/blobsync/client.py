"""blobsync.Client and blobsync.aio.Client: many calls over one session (connection pools, tokens, the journal, one
concurrency and one memory budget), plus put/get of bytes and background pushes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import io
import time
import weakref
from collections.abc import AsyncIterable, Callable, Coroutine, Generator, Iterable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeGuard, TypeVar, overload
from urllib.parse import quote, urlsplit, urlunsplit

from blobsync import arguments, calls
from blobsync.backends.base import NO_CONDITIONS, BlobProperties, Buffer, Conditions, Location, Markers
from blobsync.backends.registry import is_remote, parse_location
from blobsync.blobfile import AsyncBlobReader, AsyncBlobWriter, BlobReader, BlobWriter, check_mode
from blobsync.clientloop import ClientLoop, track
from blobsync.config import Overwrite, TransferConfig
from blobsync.engine.context import EngineContext
from blobsync.engine.digest import Digest, digest_of, md5_of, new_md5, verify_read, whole_check
from blobsync.engine.fetching import MemorySink, RangeFetch, read_checked, read_whole
from blobsync.engine.session import Session
from blobsync.engine.sources import BufferSource, Data, source_of
from blobsync.engine.tasks import in_thread
from blobsync.errors import BlobNotFoundError, BlobsyncError, UnpinnedReadError, UsageError
from blobsync.events import Progress
from blobsync.jobs import PutSpec, check_writes, run_job
from blobsync.journal import Journal, default_journal_path
from blobsync.local.files import FileIdentity
from blobsync.redact import strip_query
from blobsync.report import FileResult

if TYPE_CHECKING:  # loaded by the first stream written: a command's sync, run through a Client, never needs it
    from blobsync.engine.streaming import StreamWriter

P = ParamSpec("P")
T = TypeVar("T")
FIRST_READ = 256 * 1024  # a get's first request reads this much: a blob up to it is one round trip
INLINE_MD5 = 1 << 20  # hashed on the loop up to this size: cheaper than the hand-off to a thread and back


def _bound(fn: Callable[Concatenate[Session, P], Coroutine[Any, Any, T]]
           ) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    """A module call made a method: the same arguments, run on the Client's session (passed, not ambient)."""

    async def call(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await fn(self._open(), *args, **kwargs)

    call.__name__ = fn.__name__.removesuffix("_on")
    call.__doc__ = fn.__doc__
    call.__wrapped__ = fn  # type: ignore[attr-defined]  # the one implementation, which the module function runs too
    return call


class AsyncClient:
    """`async with blobsync.aio.Client(url) as client:` then `await client.copy(...)`, `sync`, `remove`, `resume`,
    `ls`, `put`, `get`. `url` is an account or container URL (a SAS in it is used for every call); `url_for(name)`
    makes the URL of a name under it. The calls share one session: the connection pools and credentials (one
    token fetch), the journal, and one request and memory budget, set by `config` (a call's own config sets what
    its job does: overwrite, block size, metadata...)."""

    def __init__(self, url: str, config: TransferConfig | None = None, *, credential: object = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.url = arguments.url(url, "url")
        self.credential = credential
        self._parts = urlsplit(self.url)
        if not is_remote(self.url):  # the schemes of every store the backend registry knows
            raise UsageError(f"invalid url {strip_query(self.url)!r}: a blob account or container URL")
        self.config = calls.config_of(config)
        self.env = arguments.env(env)
        self._session: Session | None = None
        self._journal: Callable[[], Journal] | None = None  # None: the journal opened with the session
        self.progress = Progress()  # bytes on the wire, all calls together

    @classmethod
    def _for_call(cls, config: TransferConfig, env: Mapping[str, str], progress: Progress | None,
                  journal: Callable[[], Journal]) -> AsyncClient:
        """The Client a module function opens for its one call (blobsync.api): no home URL (a call names its
        URLs, and a copy two of them), the call's Progress for the bytes on the wire, and the journal opened only
        if the call needs it (ls and rm never create its folder)."""
        client = cls.__new__(cls)
        client.url, client.credential, client._parts = "", None, urlsplit("")
        client.config, client.env, client._session, client._journal = config, env, None, journal
        client.progress = progress or Progress()
        return client

    def _open(self) -> Session:
        if self._session is None or self._session.closed:
            journal = self._journal or Journal(self.config.journal_path or default_journal_path(self.env))
            self._session = Session(self.config, self.env, journal, wire_progress=self.progress,
                                    credential=self.credential, home=self.url or None)
        return self._session

    async def __aenter__(self) -> AsyncClient:
        self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections, the thread pools and the journal (a later call opens them again)."""
        if self._session is not None:
            await self._session.close()

    def url_for(self, name: str) -> str:
        """The URL of `name` ('run7/best.pt', or 'container/run7/best.pt' under an account URL), with the
        client's SAS."""
        name = arguments.url(name, "name")
        if "://" in name:
            return name
        path = self._parts.path.rstrip("/") + "/" + quote(name.lstrip("/"), safe="/~")
        return urlunsplit(self._parts._replace(path=path))

    copy = _bound(calls.copy_on)
    sync = _bound(calls.sync_on)
    watch = _bound(calls.watch_on)
    remove = _bound(calls.remove_on)
    resume = _bound(calls.resume_on)

    async def ls(self, prefix: str = "") -> list[BlobProperties]:
        """Every blob under `prefix` (a folder, or a blob name), relative to the client's URL."""
        session = self._open()
        loc = parse_location(self.url_for(prefix) if prefix else self.url)
        from blobsync.engine.listing import blobs_at

        requests = session.requests(self.config, Progress())
        return [props async for _, props in blobs_at(session.store(loc), loc.path, requests)]

    def _context(self, loc: Location, config: TransferConfig | None = None, *, writes: bool = False
                 ) -> EngineContext:
        """The engine context of one call on the Client's session (it opens the journal only if the call does); a
        write's options are checked against what the store keeps first, as a job's are."""
        config = config or self.config
        ctx = self._open().context(loc, config, progress=Progress())
        if writes:
            check_writes(config, ctx.store.capabilities, loc.display)
        return ctx

    async def put(self, data: Data | Iterable[Buffer] | AsyncIterable[Buffer], name: str,
                  config: TransferConfig | None = None) -> FileResult:
        """Write `data` as the blob `name`: bytes, bytearray, memoryview or a seekable binary file object (its
        size known: journaled like a file), or an iterable or async iterable of chunks (staged as they come).
        Large data goes in blocks under the memory budget, each with its check; the whole MD5 is stored as the
        Content-MD5 and verified after the one commit. Returns the record of what landed (ETag, MD5, size); a
        failure raises and leaves nothing committed."""
        session, config = self._open(), calls.config_of(config or self.config)
        loc = parse_location(self.url_for(name))
        if not loc.path or loc.path.endswith("/"):
            raise UsageError(f"put needs a blob name, not {name!r}")
        if _is_stream(data):
            return await self._put_stream(data, loc, config)
        src = source_of(data, loc.path)
        if (type(src) is BufferSource and src.opened.size <= config.single_put_limit
                and config.overwrite in (Overwrite.TRUE, Overwrite.FALSE)):
            return await self._put_small(src, loc, config)  # one request: nothing a journal could resume
        from blobsync.jobs.put import landed

        return landed(await run_job(PutSpec(src, loc), session, config, progress=Progress()))

    async def _put_small(self, src: BufferSource, loc: Location, config: TransferConfig) -> FileResult:
        """Bytes in memory that fit one Put Blob: MD5 sent for the service to check, no job in the journal (a
        crash loses nothing a journal could bring back: the bytes were in memory)."""
        from blobsync.engine.upload import put_once, upload_headers, written

        ctx = self._context(loc, config, writes=True)
        ctx.store.check_name(loc.path)
        data = src.view
        md5 = await in_thread(ctx.io_pool, md5_of, data) if len(data) > INLINE_MD5 else md5_of(data)
        headers = upload_headers(config, PurePosixPath(loc.path), src.opened)
        conditions = Conditions(if_none_match_any=True) if config.overwrite is Overwrite.FALSE else NO_CONDITIONS
        return written(await put_once(ctx, loc.path, loc.path, data, md5, headers, conditions))

    async def _put_stream(self, chunks: Iterable[Buffer] | AsyncIterable[Buffer], loc: Location,
                          config: TransferConfig) -> FileResult:
        writer = self.stream_writer(loc, config)
        try:
            if isinstance(chunks, AsyncIterable):
                async for chunk in chunks:
                    await writer.write(chunk)
            else:  # each chunk made in a worker thread: a producer may block (read a file, another blob)
                iterator = iter(chunks)

                def produce() -> Buffer | None:
                    return next(iterator, None)

                while True:
                    made: Buffer | None = await asyncio.to_thread(produce)
                    if made is None:
                        break
                    await writer.write(made)
            return await writer.finish()
        except BaseException:
            await writer.abort()
            raise

    def stream_writer(self, location: str | Location, config: TransferConfig | None = None) -> StreamWriter:
        """A writer of one blob whose length is not known up front (see engine/streaming.py)."""
        from blobsync.engine.streaming import StreamWriter
        from blobsync.engine.upload import upload_headers

        config = config or self.config
        loc = parse_location(self.url_for(location)) if isinstance(location, str) else location
        ctx = self._context(loc, config, writes=True)
        headers = upload_headers(config, PurePosixPath(loc.path), FileIdentity(0, time.time_ns(), 0))
        if config.overwrite not in (Overwrite.TRUE, Overwrite.FALSE):
            raise UsageError("a stream is written with overwrite true or false (nothing to compare it with)")
        conditions = Conditions(if_none_match_any=True) if config.overwrite is Overwrite.FALSE else NO_CONDITIONS
        return StreamWriter(ctx, loc.path, headers, conditions)

    async def fetch_range(self, location: Location, offset: int, length: int, etag: str | None) -> bytes:
        """`length` bytes of the blob from `offset`, of the version `etag` names (a reader's block, a read_ranges
        range): read into a pooled buffer of the session's memory budget, so the read-ahead of every open reader
        and every other call share the one budget of bytes in flight."""
        memory = self._open().memory
        buf = await memory.buffer(max(length, self.config.block_size))  # one size: the pool reuses them
        view = memoryview(buf)[:length]
        try:
            await self._read_range(location, offset, view, etag)
            return bytes(view)
        finally:
            view.release()
            memory.release(buf)

    async def read_into(self, name: str, into: bytearray | memoryview, offset: int = 0, *,
                        etag: str | None = None) -> memoryview:
        """Fill `into` with the blob's bytes from `offset` (of the version `etag` names, if given), in block-size
        ranges read in parallel straight into it; returns it as a memoryview. Past the end is an error."""
        view = memoryview(into).cast("B")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise UsageError(f"invalid offset={offset!r}: a whole number of bytes from the start")
        await self._read_range(parse_location(self.url_for(name)), offset, view, etag)
        return view

    async def _read_range(self, loc: Location, offset: int, view: memoryview, etag: str | None) -> None:
        """`view` filled from the blob at `offset`: one checked GET, or block-size ranges in parallel."""
        ctx, step = self._context(loc), self.config.block_size

        def get(at: int, part: memoryview) -> Coroutine[Any, Any, bytes | None]:
            return read_checked(ctx.store, ctx.io_pool, loc.path, at, part, etag)

        if len(view) > step and etag is None:  # the version there now, for every range
            props = await ctx.request(lambda: ctx.store.stat(loc.path))
            etag = props.etag or None if props is not None else None
        if len(view) <= step or etag is None:  # no version to pin: one request, straight into the caller's view
            await ctx.request(lambda: get(offset, view))
            return
        ranges = [(i, offset + at, min(step, len(view) - at)) for i, at in enumerate(range(0, len(view), step))]
        await RangeFetch(ctx, loc.path, loc.path, etag, ranges, MemorySink(view, offset), None).run()

    async def read_ranges(self, ranges: Sequence[tuple[str, int | None, int | None]]
                          ) -> list[bytes | BlobsyncError]:
        """Byte ranges of blobs, `(name, start, end)` as a slice takes them (None: the start or the end; negative:
        from the end), all fetched at once under the session's request budget, one HEAD per blob named; a range
        that fails is its error in the list."""
        for name, start, end in ranges:  # checked before any request: a wrong type is a line, not a TypeError
            arguments.url(name, "name")
            for bound, what in ((start, "start"), (end, "end")):
                if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool)):
                    raise UsageError(f"invalid {what}={bound!r} for {name!r}: a whole number of bytes or None")
            if start is not None and end is not None and 0 <= end < start:  # a mistake, not an empty range
                raise UsageError(f"invalid range {start}..{end} of {name!r}: the end is before the start")
        names = sorted({name for name, _, _ in ranges})
        found = await asyncio.gather(*(self.stat(name) for name in names), return_exceptions=True)
        stats = dict(zip(names, found, strict=True))

        async def one(name: str, start: int | None, end: int | None) -> bytes:
            props = stats[name]
            if isinstance(props, BaseException):
                raise props
            first, stop, _ = slice(start, end).indices(props.size)
            if stop <= first:
                return b""
            return await self.fetch_range(parse_location(self.url_for(name)), first, stop - first, props.etag or None)

        done = await asyncio.gather(*(one(*r) for r in ranges), return_exceptions=True)
        for item in done:
            if isinstance(item, BaseException) and not isinstance(item, BlobsyncError):
                raise item
        return [item for item in done if isinstance(item, bytes | BlobsyncError)]

    async def ls_level(self, prefix: str = "") -> tuple[list[BlobProperties], list[str]]:
        """One level under `prefix` ('/' the delimiter): the blobs there and the folders one level down (names
        relative to the container, folders ending in '/'). `prefix` starts with the container under an
        account URL."""
        loc = parse_location(self.url_for(prefix.rstrip("/") + "/") if prefix.strip("/") else self.url)
        ctx = self._context(loc)
        path = loc.path.rstrip("/") + "/" if loc.path.strip("/") else ""
        blobs: list[BlobProperties] = []
        folders: list[str] = []
        marker = ""
        markers = Markers(f"list blobs under {path or '/'!r}")
        while True:
            page, subs, marker = await ctx.request(functools.partial(ctx.store.list_level, path, marker))
            markers.next(marker)
            blobs += page
            folders += subs
            if not marker:
                return blobs, folders

    async def delete(self, name: str) -> bool:
        """Delete the blob `name` (with its snapshots); False when there was none."""
        loc = parse_location(self.url_for(name))
        ctx = self._context(loc)
        return await ctx.request(lambda: ctx.store.delete(loc.path))

    async def make_container(self, name: str = "") -> bool:
        """Create the container (`name` under an account URL); False when it exists."""
        loc = parse_location(self.url_for(name) if name else self.url)
        ctx = self._context(loc)
        return await ctx.request(ctx.store.create_container)

    async def stat(self, name: str) -> BlobProperties:
        """The blob's properties (size, ETag, Content-MD5, metadata...); BlobNotFoundError if there is none."""
        loc = parse_location(self.url_for(name))
        ctx = self._context(loc)
        props = await ctx.request(lambda: ctx.store.stat(loc.path))
        if props is None:
            raise BlobNotFoundError(f"blob {loc.path!r} not found in {loc.container_url}", status=404,
                                    code="BlobNotFound")
        return props

    @overload
    async def get(self, name: str) -> bytes: ...

    @overload
    async def get(self, name: str, *, into: bytearray | memoryview) -> memoryview: ...

    async def get(self, name: str, *, into: bytearray | memoryview | None = None) -> bytes | memoryview:
        """The blob `name`'s bytes; with `into` (a writable buffer at least that long), read into it with no copy
        and returned as a memoryview of the part filled. Parallel ranged reads of one version (If-Match), checked
        against the blob's Content-MD5 as a download is (the Client's `config.check_md5`), and read again as a
        download is where a mismatch may be damage in transit or the blob changed during the read."""
        loc = parse_location(self.url_for(name))
        ctx = self._context(loc)
        given = None if into is None else memoryview(into).cast("B")

        async def new_version() -> bool:
            return True  # the next read's first request takes it

        return await read_whole(ctx, loc.path, lambda _: self._get_once(ctx, loc, given), new_version)

    async def _get_once(self, ctx: EngineContext, loc: Location, given: memoryview | None) -> bytes | memoryview:
        # The first bytes and the blob's properties come in one request (no HEAD first): a small blob is one round
        # trip; the rest of a larger one is read in parallel at that version, hashed in order as it comes.
        first = memoryview(bytearray(FIRST_READ)) if given is None else given[:FIRST_READ]
        props, got = await ctx.request(lambda: ctx.store.read_first(loc.path, first))
        if given is not None and len(given) < props.size:
            raise UsageError(f"into= holds {len(given)} bytes; the blob has {props.size}")
        small = props.size <= got
        view = given if given is not None else first[:got] if small else memoryview(bytearray(props.size))
        if not small and not props.etag:  # no version to pin the rest to: all of it again, in one request
            props, got = await ctx.request(lambda: ctx.store.read_first(loc.path, view[:props.size]))
            small = props.size <= got
        mode = self.config.check_md5
        kind = whole_check(mode, loc.path, props)  # as a download's (FailIfDifferentOrMissing: before the rest)
        digest: Digest | None = None
        if props.size > got:
            view[:got] = first[:got]
            step = self.config.block_size
            ranges = [(0, 0, got)]  # the first bytes: range 0 of the check, there already
            ranges += [(i, offset, min(step, props.size - offset))
                       for i, offset in enumerate(range(got, props.size, step), start=1)]
            whole = new_md5() if kind == "md5" else None
            fetch = RangeFetch(ctx, loc.path, loc.path, props.etag or None, ranges, MemorySink(view), whole,
                               crc64=kind == "crc64")
            await fetch.run(done={0})
            digest = await fetch.crc64() if kind == "crc64" else Digest("md5", whole.digest()) if whole else None
        elif kind is not None:
            head = view[:props.size]
            digest = digest_of(kind, head) if props.size <= INLINE_MD5 else await in_thread(ctx.io_pool, digest_of,
                                                                                             kind, head)

        async def md5_again() -> bytes:
            return await in_thread(ctx.io_pool, md5_of, view[:props.size])

        await verify_read(mode, loc.path, props, digest, md5_again, "; nothing returned")
        return bytes(view[:props.size]) if given is None else given[:props.size]

    def open(self, name: str, mode: str = "rb", *, config: TransferConfig | None = None,
             read_ahead: int = 4) -> _Opening:
        """The blob `name` as an async file: `async with client.open(name) as f: data = await f.read()` (or
        `f = await client.open(name)`). 'rb' reads one version (its ETag at open) with `read_ahead` blocks fetched
        in parallel, and seeks; 'wb' stages blocks as they are written and commits on close (nothing is visible
        before; an exception inside `async with` leaves no blob)."""
        check_mode(mode)
        return _Opening(self._open_file(name, mode, config, read_ahead))

    async def _open_file(self, name: str, mode: str, config: TransferConfig | None, read_ahead: int
                         ) -> AsyncBlobReader | AsyncBlobWriter:
        loc = parse_location(self.url_for(name))
        if mode == "wb":
            writer = self.stream_writer(loc, config)
            return AsyncBlobWriter(name, writer.write, writer.finish, writer.abort)
        props = await self.stat(name)
        block = (config or self.config).block_size
        pinned(props, block)

        def fetch(offset: int, length: int) -> Coroutine[Any, Any, bytes]:
            return self.fetch_range(loc, offset, length, props.etag or None)

        return AsyncBlobReader(name, props.size, block, fetch, read_ahead)


class _Opening:
    """What `aio.Client.open` returns: awaited, the file; as `async with`, the file closed on the way out."""

    def __init__(self, opening: Coroutine[Any, Any, AsyncBlobReader | AsyncBlobWriter]) -> None:
        self._opening = opening
        self._file: AsyncBlobReader | AsyncBlobWriter | None = None

    def __await__(self) -> Generator[Any, None, AsyncBlobReader | AsyncBlobWriter]:
        return self._opening.__await__()

    async def __aenter__(self) -> Any:  # AsyncBlobReader or AsyncBlobWriter, by the mode
        self._file = await self._opening
        return self._file

    async def __aexit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        assert self._file is not None
        await self._file.__aexit__(kind, *rest)


def _blocking(method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]
              ) -> Callable[Concatenate[Client, P], T]:
    """An AsyncClient method as a Client method: the same arguments, run on the Client's loop, waited for."""

    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        loop = self._current()
        return loop.wait(method(self.aio, *args, **kwargs))

    call.__name__ = method.__name__
    call.__doc__ = method.__doc__
    return call


class Client:
    """The blocking Client: `with blobsync.Client(url) as client:` then `client.copy(...)`, `sync`, `remove`,
    `resume`, `ls`, `put`, `get`, each as `blobsync.aio.Client`'s. Its calls run on one event loop in a thread of
    its own, so they share the session whichever thread calls; `submit(client.aio.put, data, name)` starts one in
    the background and returns a concurrent.futures.Future (a training loop goes on while a checkpoint uploads).

    `close()` (and the end of a `with` block) waits for the work submitted; so does the interpreter's exit for a
    Client never closed. A forked child (DataLoader workers, multiprocessing's fork) opens a session of its own on
    first use, and a Client pickles as its URL, config, credential and `env` (spawn): secrets in clear, see
    docs/library.md; a credential factory (a module-level function returning a SAS) keeps its secret out."""

    def __init__(self, url: str, config: TransferConfig | None = None, *, credential: object = None,
                 env: Mapping[str, str] | None = None) -> None:
        self._given = (url, config, credential, env)
        self._aio = AsyncClient(url, config, credential=credential, env=env)
        self._loop = ClientLoop("blobsync-client")
        track(self)
        # A Client dropped unclosed (a dataset's, a writer's) closes its session once collected, not warning of it;
        # at exit, open Clients are closed (and waited for) by clientloop's exit hook instead.
        self._parts = [(self._aio, self._loop)]
        weakref.finalize(self, _abandon, self._parts).atexit = False

    def __reduce__(self) -> tuple[object, ...]:
        url, config, credential, env = self._given
        return _reopened, (url, config, credential, None if env is None else dict(env))

    def _current(self) -> ClientLoop:
        """The loop of this process: in a forked child, a new loop and session (the parent's thread, sockets and
        journal connection are the parent's: left alone, never used here)."""
        if self._loop.forked:
            _INHERITED.append((self._aio, self._loop))
            url, config, credential, env = self._given
            self._aio = AsyncClient(url, config, credential=credential, env=env)
            self._loop = ClientLoop("blobsync-client")
            self._parts.append((self._aio, self._loop))
        return self._loop

    @property
    def aio(self) -> AsyncClient:
        """The async Client this one runs on its loop (for `submit(client.aio.put, ...)`)."""
        self._current()
        return self._aio

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url_for(self, name: str) -> str:
        return self._aio.url_for(name)

    def submit(self, op: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
               ) -> concurrent.futures.Future[T]:
        """Start `op(*args, **kwargs)` (a method of `client.aio`) on the client's loop and return at once. The
        Future completes on a thread of the Client's where its done-callbacks may call the Client again; close()
        waits for it."""
        return self._current().submit(lambda: op(*args, **kwargs))

    def pending(self) -> int:
        """How many submitted calls have not finished yet."""
        return self._loop.pending()

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._current().wait(coro)

    def open(self, name: str, mode: str = "rb", *, config: TransferConfig | None = None,
             read_ahead: int = 4) -> io.BufferedReader | BlobWriter:
        """The blob `name` as a binary file: 'rb' is seekable and buffered, reading one version (its ETag at
        open) with `read_ahead` blocks fetched in parallel; 'wb' stages blocks as they are written and commits
        on close (an exception inside `with` leaves no blob). numpy.save, pickle.dump and the like work on it."""
        if check_mode(mode) == "wb":
            loc = parse_location(self.url_for(name))
            writer = self._wait(_made(lambda: self.aio.stream_writer(loc, config)))
            return BlobWriter(name, writer.write, writer.finish, writer.abort, self._wait)
        raw = self.raw_reader(name, config=config, read_ahead=read_ahead)
        return io.BufferedReader(raw, buffer_size=min(raw.block_size, 1 << 20))

    def raw_reader(self, name: str, *, config: TransferConfig | None = None, read_ahead: int = 4,
                   props: BlobProperties | None = None) -> BlobReader:
        """The unbuffered reader under `open(name, "rb")`: one version (`props`' ETag, or the one there now)."""
        props = props or self.stat(name)
        loc = parse_location(self.url_for(name))
        block = (config or self.aio.config).block_size
        pinned(props, block)

        def fetch(offset: int, length: int) -> Coroutine[Any, Any, bytes]:
            return self.aio.fetch_range(loc, offset, length, props.etag or None)

        def submit(coro: Coroutine[Any, Any, bytes]) -> concurrent.futures.Future[bytes]:
            return asyncio.run_coroutine_threadsafe(coro, self._current().loop)

        return BlobReader(name, props.size, block, fetch, submit, read_ahead)

    copy = _blocking(AsyncClient.copy)
    sync = _blocking(AsyncClient.sync)
    watch = _blocking(AsyncClient.watch)  # blocks until `stop`: run it in a thread, or submit(client.aio.watch, ...)
    remove = _blocking(AsyncClient.remove)
    resume = _blocking(AsyncClient.resume)
    ls = _blocking(AsyncClient.ls)
    put = _blocking(AsyncClient.put)
    stat = _blocking(AsyncClient.stat)
    ls_level = _blocking(AsyncClient.ls_level)
    delete = _blocking(AsyncClient.delete)
    make_container = _blocking(AsyncClient.make_container)
    get = _blocking(AsyncClient.get)
    read_into = _blocking(AsyncClient.read_into)
    read_ranges = _blocking(AsyncClient.read_ranges)

    def close(self, *, wait: bool = True, cancel: bool = False) -> None:
        """Wait for the submitted work (with `cancel=True` or `wait=False`, drop it: each dropped future fails
        with a DroppedError naming the job to resume), close the session, then stop the loop and its thread."""
        if self._loop.forked:
            return  # the parent's: nothing of it runs here
        self._loop.close(self._aio.close, wait=wait, cancel=cancel)


_INHERITED: list[tuple[AsyncClient, ClientLoop]] = []  # a forked child's copies of the parent's: never used, never
# collected (their finalisers would warn of, or close, what belongs to the parent)


def _abandon(parts: list[tuple[AsyncClient, ClientLoop]]) -> None:
    for aio, loop in parts:
        loop.abandon(aio.close)


def _reopened(url: str, config: TransferConfig | None, credential: object, env: Mapping[str, str] | None
              ) -> Client:
    return Client(url, config, credential=credential, env=env)


async def _now(fn: Callable[[memoryview], None], view: memoryview) -> None:
    fn(view)


async def _made(make: Callable[[], T]) -> T:
    """`make()` run on the client's loop (what it builds belongs to that loop)."""
    return make()


def pinned(props: BlobProperties, block_size: int) -> None:
    """A reader's blocks all come from the version opened: refused where the service named none and the blob
    takes more than one read."""
    if not props.etag and props.size > block_size:
        raise UnpinnedReadError(f"{props.name}: the service named no version (ETag) of it, so reading it in "
                                "blocks could mix two versions of the blob: refused",
                                hint="read it whole with get(), or fix the server or proxy that drops the ETag")


def _is_stream(data: object) -> TypeGuard[Iterable[Buffer] | AsyncIterable[Buffer]]:
    """An iterable of chunks (not bytes-like, not a file object, which are sized)."""
    if isinstance(data, bytes | bytearray | memoryview | str) or hasattr(data, "readinto"):
        return False
    return isinstance(data, AsyncIterable | Iterable)
