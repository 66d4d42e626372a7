"""blobsync.Client and blobsync.aio.Client: many calls over one session (connection pools, tokens, the journal, one
concurrency and one memory budget), plus put/get of bytes and background pushes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar, overload
from urllib.parse import quote, urlsplit, urlunsplit

from blobsync import api, arguments
from blobsync.backends.base import BlobProperties
from blobsync.backends.registry import parse_location
from blobsync.config import TransferConfig
from blobsync.engine.context import Progress, RequestPath, job_retrier
from blobsync.engine.digest import md5_of
from blobsync.engine.session import Session
from blobsync.engine.sources import Data, source_of
from blobsync.engine.tasks import for_each, in_thread
from blobsync.errors import BlobNotFoundError, ChecksumMismatchError, TransferFailedError, UsageError
from blobsync.journal import JobKind, Journal, default_journal_path
from blobsync.redact import strip_query
from blobsync.report import FileResult, Report

P = ParamSpec("P")
T = TypeVar("T")


def _bound(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    """A module call made a method: the same arguments, run inside the Client's session."""

    async def call(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        token = api._BOUND.set(self._open())
        try:
            return await fn(*args, **kwargs)
        finally:
            api._BOUND.reset(token)

    call.__name__ = fn.__name__.removesuffix("_async")
    call.__doc__ = fn.__doc__
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
        if self._parts.scheme not in ("http", "https", "memory"):
            raise UsageError(f"invalid url {strip_query(self.url)!r}: a blob account or container URL")
        self.config = api._config(config)
        self.env = arguments.env(env)
        self._session: Session | None = None
        self.progress = Progress()  # bytes on the wire, all calls together

    def _open(self) -> Session:
        if self._session is None or self._session.closed:
            journal = Journal(self.config.journal_path or default_journal_path(self.env))
            self._session = Session(self.config, self.env, journal, wire_progress=self.progress,
                                    credential=self.credential)
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

    copy = _bound(api.copy_async)
    sync = _bound(api.sync_async)
    remove = _bound(api.remove_async)
    resume = _bound(api.resume_async)

    async def ls(self, prefix: str = "") -> list[BlobProperties]:
        """Every blob under `prefix` (a folder, or a blob name), relative to the client's URL."""
        session = self._open()
        loc = parse_location(self.url_for(prefix) if prefix else self.url)
        from blobsync.syncing.remove import blobs_at

        requests = self._requests(Progress())
        return [props async for _, props in blobs_at(session.store(loc), loc.path, requests)]

    def _requests(self, progress: Progress) -> RequestPath:
        session = self._open()
        return RequestPath(session.limiter, job_retrier(self.config, progress), progress)

    async def put(self, data: Data, name: str, config: TransferConfig | None = None) -> FileResult:
        """Write `data` (bytes, bytearray, memoryview or a seekable binary file object) as the blob `name`:
        in blocks under the memory budget when large, each with its check, the whole MD5 stored as its
        Content-MD5 and verified after the commit. Returns the record of what landed (ETag, MD5, size); a
        failure raises."""
        from blobsync.engine.runner import JobRunner, WorkItem
        from blobsync.engine.upload import FileUploader

        session, config = self._open(), api._config(config or self.config)
        loc = parse_location(self.url_for(name))
        if not loc.path or loc.path.endswith("/"):
            raise UsageError(f"put needs a blob name, not {name!r}")
        src = source_of(data, loc.path)
        progress = Progress()
        async with session.job(loc, config, progress=progress) as ctx:
            runner = JobRunner(JobKind.UPLOAD, ctx)
            job = runner.open_job(f"memory:{uuid.uuid4().hex}", loc.display)
            size = src.opened.size
            row = ctx.journal.add_files(job.id, [(loc.path, loc.path, size, src.opened.mtime_ns, 0)])[loc.path]
            report = Report(job.id, "<memory>", loc.display, kind="upload", listener=progress.finished)
            landed: list[FileResult] = []

            async def one() -> FileResult:
                result = await FileUploader(ctx).upload_source(row, src)
                landed.append(result)
                return result

            await runner.run(report, [WorkItem(row, size, one)])
        if report.failures or not landed:
            raise TransferFailedError(report)
        return landed[0]

    @overload
    async def get(self, name: str) -> bytes: ...

    @overload
    async def get(self, name: str, *, into: bytearray | memoryview) -> memoryview: ...

    async def get(self, name: str, *, into: bytearray | memoryview | None = None) -> bytes | memoryview:
        """The blob `name`'s bytes; with `into` (a writable buffer at least that long), read into it with no copy
        and returned as a memoryview of the part filled. Parallel ranged reads of one version (If-Match), checked
        against the blob's Content-MD5."""
        session = self._open()
        loc = parse_location(self.url_for(name))
        store, requests = session.store(loc), self._requests(Progress())
        props = await requests(lambda: store.stat(loc.path))
        if props is None:
            raise BlobNotFoundError(f"blob {loc.path!r} not found in {loc.container_url}", status=404,
                                    code="BlobNotFound")
        buf = bytearray(props.size) if into is None else into
        view = memoryview(buf).cast("B")
        if len(view) < props.size:
            raise UsageError(f"into= holds {len(view)} bytes; the blob has {props.size}")
        step = self.config.block_size

        async def fetch(offset: int) -> None:
            part = view[offset:min(offset + step, props.size)]
            await requests(lambda: store.read_into(loc.path, offset, part, props.etag or None))

        await for_each(range(0, props.size, step), fetch, self.config.start_concurrency)
        if props.content_md5 is not None:
            digest = await in_thread(session.io_pool, md5_of, view[:props.size])
            if digest != props.content_md5:
                raise ChecksumMismatchError(f"{loc.path}: MD5 of the bytes read differs from the blob's Content-MD5",
                                            digest=digest)
        return bytes(buf) if into is None else view[:props.size]


def _blocking(method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]
              ) -> Callable[Concatenate[Client, P], T]:
    """An AsyncClient method as a Client method: the same arguments, run on the Client's loop, waited for."""

    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._wait(method(self.aio, *args, **kwargs))

    call.__name__ = method.__name__
    call.__doc__ = method.__doc__
    return call


class Client:
    """The blocking Client: `with blobsync.Client(url) as client:` then `client.copy(...)`, `sync`, `remove`,
    `resume`, `ls`, `put`, `get`, each as `blobsync.aio.Client`'s. Its calls run on one event loop in a thread of
    its own, so they share the session whichever thread calls; `submit(client.aio.put, data, name)` starts one in
    the background and returns a concurrent.futures.Future (a training loop goes on while a checkpoint uploads)."""

    def __init__(self, url: str, config: TransferConfig | None = None, *, credential: object = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.aio = AsyncClient(url, config, credential=credential, env=env)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="blobsync-client", daemon=True)
        self._thread.start()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url_for(self, name: str) -> str:
        return self.aio.url_for(name)

    def submit(self, op: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
               ) -> concurrent.futures.Future[T]:
        """Start `op(*args, **kwargs)` (a method of `client.aio`) on the client's loop and return at once."""
        if self._loop.is_closed():
            raise UsageError("this Client is closed")
        return asyncio.run_coroutine_threadsafe(op(*args, **kwargs), self._loop)

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coro.close()
            raise UsageError("this Client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            if not future.done():  # interrupted while waiting: stop the call (resumable), then let it go
                future.cancel()
                concurrent.futures.wait([future], timeout=30)
            raise

    copy = _blocking(AsyncClient.copy)
    sync = _blocking(AsyncClient.sync)
    remove = _blocking(AsyncClient.remove)
    resume = _blocking(AsyncClient.resume)
    ls = _blocking(AsyncClient.ls)
    put = _blocking(AsyncClient.put)
    get = _blocking(AsyncClient.get)

    def close(self) -> None:
        """Close the session, then stop the client's loop and thread."""
        if self._loop.is_closed():
            return
        try:
            self._wait(self.aio.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop.close()
