"""A null Blob service for measuring client cost alone: it takes Put Block / Put Block List / Put Blob bodies and
throws the bytes away, keeping only names, sizes and the MD5 the client declared, and answers HEAD, Get Block List,
List Blobs and ranged GETs of what it holds (GETs return zeros), with almost no CPU of its own. No auth is checked.
Put Block From URL stages a block of the source range's length at once (the service's own copy, free here); a small
Put Blob (up to 1 MiB: a pointer, a block record) keeps its bytes, and GETs return them. With `--keep` it keeps
every blob's bytes (blocks joined at commit) and GETs return them: a save read back and compared, at one more copy
of each byte on the server's side.

    python bench/harness/nullserver.py --port 10100     (the harness starts it; see NullServer)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import multiprocessing
import re
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from aiohttp import web

ZEROS = bytes(1 << 20)
KEPT = 1 << 20  # a Put Blob up to this size keeps its bytes


@dataclass
class Blob:
    size: int
    md5: str | None  # base64, as the client declared it
    etag: str
    modified: float
    blocks: list[tuple[str, int]] = field(default_factory=list)
    content_type: str = "application/octet-stream"
    metadata: dict[str, str] = field(default_factory=dict)
    data: bytes | None = None  # a small blob's bytes, kept


class Store:
    """Names, sizes and declared MD5s (and, with keep, bytes). Its maps are plain dicts in one process, or a
    multiprocessing manager's dicts shared by several server processes (`--processes`): every write is a whole
    value set under a key, never a nested object changed in place, so that it reaches the manager."""

    def __init__(self, maps: tuple[Any, Any, Any] | None = None) -> None:
        self.blobs: Any = {} if maps is None else maps[0]  # (container, name) -> Blob
        self.staged: Any = {} if maps is None else maps[1]  # (container, name, block id) -> size
        self.containers: Any = {} if maps is None else maps[2]  # container -> True
        self.keep = False  # every blob's bytes kept (--keep)
        self.bodies: dict[tuple[str, str, str], bytes] = {}  # staged blocks' bytes, with keep

    def etag(self) -> str:
        return f'"0x{uuid.uuid4().hex[:16].upper()}"'  # unique in every process without a shared counter


def _split(path: str) -> tuple[str, str]:
    parts = path.lstrip("/").split("/", 2)  # account/container/blob
    return (parts[1] if len(parts) > 1 else ""), (parts[2] if len(parts) > 2 else "")


def _headers(blob: Blob) -> dict[str, str]:
    out = {"ETag": blob.etag, "Last-Modified": formatdate(blob.modified, usegmt=True), "x-ms-blob-type": "BlockBlob",
           "Content-Type": blob.content_type, "Accept-Ranges": "bytes", "x-ms-version": "2021-08-06"}
    if blob.md5:
        out["Content-MD5"] = blob.md5
    out.update({f"x-ms-meta-{k}": v for k, v in blob.metadata.items()})
    return out


async def _drain(request: web.Request) -> int:
    n = 0
    async for chunk in request.content.iter_chunked(1 << 20):
        n += len(chunk)
    return n


async def _body(request: web.Request) -> tuple[int, bytes | None]:
    """The body's size, and its bytes where the store keeps them."""
    if not request.app["store"].keep:
        return await _drain(request), None
    data = await request.read()
    return len(data), data


def _props(request: web.Request, size: int, md5: str | None, etag: str) -> Blob:
    meta = {k[len("x-ms-meta-"):]: v for k, v in request.headers.items() if k.lower().startswith("x-ms-meta-")}
    return Blob(size, md5, etag, time.time(), content_type=request.headers.get("x-ms-blob-content-type",
                                                                                  "application/octet-stream"),
                metadata=meta)


async def handle_put(request: web.Request) -> web.StreamResponse:
    store: Store = request.app["store"]
    container, name = _split(request.path)
    q = request.query
    if q.get("restype") == "container":
        if container in store.containers:
            return web.Response(status=409, headers={"x-ms-error-code": "ContainerAlreadyExists"})
        store.containers[container] = True
        return web.Response(status=201, headers={"ETag": store.etag()})
    store.containers[container] = True
    md5 = request.headers.get("Content-MD5")
    if q.get("comp") == "block":
        source_range = request.headers.get("x-ms-source-range")
        if source_range:  # Put Block From URL: no body
            first, _, last = source_range.split("=", 1)[1].partition("-")
            size = int(last) - int(first) + 1
        else:
            size, data = await _body(request)
            if data is not None:
                store.bodies[(container, name, q["blockid"])] = data
        store.staged[(container, name, q["blockid"])] = size
        return web.Response(status=201, headers={"Content-MD5": md5} if md5 else {})
    if q.get("comp") == "blocklist":
        body = (await request.read()).decode()
        ids = re.findall(r"<(?:Latest|Committed|Uncommitted)>([^<]*)</", body)
        old = store.blobs.get((container, name))
        known = dict(old.blocks) if old else {}
        staged = [store.staged.pop((container, name, i), None) for i in ids]
        blocks = [(i, size if size is not None else known.get(i, 0)) for i, size in zip(ids, staged, strict=True)]
        blob = _props(request, sum(s for _, s in blocks), request.headers.get("x-ms-blob-content-md5"), store.etag())
        blob.blocks = blocks
        if store.keep:
            parts = [store.bodies.pop((container, name, i), None) for i in ids]
            blob.data = b"".join(p if p is not None else bytes(s) for p, (_, s) in zip(parts, blocks, strict=True))
            for key in [k for k in store.bodies if k[:2] == (container, name)]:
                del store.bodies[key]
        store.blobs[(container, name)] = blob
        return web.Response(status=201, headers={"ETag": blob.etag, "Last-Modified": formatdate(usegmt=True)})
    body = await request.read() if store.keep or (request.content_length or 0) <= KEPT else None  # Put Blob
    size = len(body) if body is not None else await _drain(request)
    blob = _props(request, size, md5 or request.headers.get("x-ms-blob-content-md5"), store.etag())
    blob.data = body
    store.blobs[(container, name)] = blob
    return web.Response(status=201, headers={"ETag": blob.etag, "Last-Modified": formatdate(usegmt=True),
                                             **({"Content-MD5": md5} if md5 else {})})


def _listing(store: Store, container: str, prefix: str) -> str:
    items = []
    for (c, name), b in sorted(store.blobs.items()):
        if c == container and name.startswith(prefix):
            md5 = f"<Content-MD5>{b.md5}</Content-MD5>" if b.md5 else "<Content-MD5 />"
            meta = "".join(f"<{k}>{escape(v)}</{k}>" for k, v in b.metadata.items())
            items.append(f"<Blob><Name>{escape(name)}</Name><Properties><Last-Modified>"
                         f"{formatdate(b.modified, usegmt=True)}</Last-Modified><Etag>{b.etag}</Etag>"
                         f"<Content-Length>{b.size}</Content-Length><Content-Type>{b.content_type}</Content-Type>"
                         f"{md5}<BlobType>BlockBlob</BlobType><AccessTier>Hot</AccessTier></Properties>"
                         f"<Metadata>{meta}</Metadata></Blob>")
    return ('<?xml version="1.0" encoding="utf-8"?><EnumerationResults><Blobs>' + "".join(items)
            + "</Blobs><NextMarker /></EnumerationResults>")


async def handle_get(request: web.Request) -> web.StreamResponse:
    store: Store = request.app["store"]
    container, name = _split(request.path)
    q = request.query
    if q.get("comp") == "list":
        return web.Response(text=_listing(store, container, q.get("prefix", "")), content_type="application/xml")
    if q.get("restype") == "container":
        return web.Response(status=200, headers={"ETag": store.etag()})
    blob = store.blobs.get((container, name))
    if blob is None:
        return web.Response(status=404, headers={"x-ms-error-code": "BlobNotFound"})
    if q.get("comp") == "blocklist":
        committed = "".join(f"<Block><Name>{i}</Name><Size>{s}</Size></Block>" for i, s in blob.blocks)
        xml = (f'<?xml version="1.0" encoding="utf-8"?><BlockList><CommittedBlocks>{committed}</CommittedBlocks>'
               "<UncommittedBlocks /></BlockList>")
        headers = {k: v for k, v in _headers(blob).items() if k != "Content-Type"}
        return web.Response(text=xml, content_type="application/xml", headers=headers)
    if request.method == "HEAD":
        return web.Response(headers={**_headers(blob), "Content-Length": str(blob.size)})
    return await _ranged(request, blob)


async def _ranged(request: web.Request, blob: Blob) -> web.StreamResponse:
    start, end = 0, blob.size - 1
    spec = request.headers.get("x-ms-range") or request.headers.get("Range")
    if spec:
        a, _, b = spec.split("=", 1)[1].partition("-")
        start, end = int(a), min(int(b) if b else blob.size - 1, blob.size - 1)
    length = max(0, end - start + 1)
    headers = _headers(blob)
    if spec:
        headers["Content-Range"] = f"bytes {start}-{end}/{blob.size}"
        if request.headers.get("x-ms-range-get-content-md5") == "true":
            headers["Content-MD5"] = _zeros_md5(length) if blob.data is None else \
                base64.b64encode(hashlib.md5(blob.data[start:start + length]).digest()).decode()
        elif blob.md5:
            headers["x-ms-blob-content-md5"] = blob.md5
    response = web.StreamResponse(status=206 if spec else 200, headers=headers)
    response.content_length = length
    await response.prepare(request)
    if blob.data is not None:
        await response.write(blob.data[start:start + length])
        return response
    while length > 0:
        n = min(length, len(ZEROS))
        await response.write(ZEROS[:n])
        length -= n
    return response


_MD5S: dict[int, str] = {}


def _zeros_md5(length: int) -> str:
    """The MD5 (base64) of `length` zero bytes, hashed a MiB at a time, once per length in this process."""
    if length not in _MD5S:
        digest = hashlib.md5()
        for at in range(0, length, len(ZEROS)):
            digest.update(ZEROS[:min(len(ZEROS), length - at)])
        _MD5S[length] = base64.b64encode(digest.digest()).decode()
    return _MD5S[length]


async def handle_delete(request: web.Request) -> web.StreamResponse:
    store: Store = request.app["store"]
    container, name = _split(request.path)
    return web.Response(status=202 if store.blobs.pop((container, name), None) else 404)


def _zeros_md5_of(size: int) -> str:
    """`_zeros_md5`, kept in the temp folder: every run of a download bench starts a server that seeds the same blob,
    and 4 GiB of MD5 is seconds of its start."""
    cached = Path(tempfile.gettempdir()) / f"blobsync-null-zeros-{size}.md5"
    with contextlib.suppress(OSError):
        return cached.read_text().strip()
    value = _zeros_md5(size)
    with contextlib.suppress(OSError):
        cached.write_text(value)
    return value


def seed(store: Store, container: str, name: str, size: int) -> None:
    """A blob of `size` zero bytes with its true MD5, for downloads."""
    store.containers[container] = True
    store.blobs[(container, name)] = Blob(size, _zeros_md5_of(size), store.etag(), time.time())


def app(store: Store) -> web.Application:
    application = web.Application(client_max_size=5000 << 20)
    application["store"] = store
    application.router.add_route("PUT", "/{tail:.*}", handle_put)
    application.router.add_route("GET", "/{tail:.*}", handle_get)
    application.router.add_route("HEAD", "/{tail:.*}", handle_get)
    application.router.add_route("DELETE", "/{tail:.*}", handle_delete)
    return application


def _serve(port: int, store: Store, ready: Any = None, shared: bool = False) -> None:
    """One server process on `port`; `shared`: one of several on it (SO_REUSEPORT: the kernel spreads connections
    over them)."""
    def listening(*_: object) -> None:
        if ready is not None:
            ready.set()
        else:  # the harness waits for this line (inside a namespace too)
            print("null server listening", flush=True)

    web.run_app(app(store), host="127.0.0.1", port=port, access_log=None, reuse_port=shared or None, print=listening)


def _serve_shared(port: int, maps: tuple[Any, Any, Any], ready: Any) -> None:
    _serve(port, Store(maps), ready, shared=True)


def _start_others(port: int, store: Store, count: int) -> None:
    """`count` more server processes on the port, each listening (or failed: where the platform shares no port,
    the first process serves alone) before this one says it listens."""
    maps = (store.blobs, store.staged, store.containers)
    started = []
    for _ in range(count):
        ready = multiprocessing.Event()
        proc = multiprocessing.Process(target=_serve_shared, args=(port, maps, ready), daemon=True)
        proc.start()
        started.append((proc, ready))
    deadline = time.monotonic() + 20
    for proc, ready in started:
        while not ready.wait(0.1) and proc.is_alive() and time.monotonic() < deadline:
            pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seed", action="append", default=[], help="container/blob:size, a zero-filled blob")
    p.add_argument("--keep", action="store_true", help="keep every blob's bytes (GETs return them)")
    p.add_argument("--processes", type=int, default=1,
                   help="server processes on the port, sharing one store (a client faster than one core drains)")
    a = p.parse_args()
    if a.keep and a.processes > 1:
        p.error("--keep holds bytes in one process: use it with --processes 1")
    manager = multiprocessing.Manager() if a.processes > 1 else None
    store = Store(None if manager is None else (manager.dict(), manager.dict(), manager.dict()))
    store.keep = a.keep
    for item in a.seed:
        where, size = item.rsplit(":", 1)
        container, name = where.split("/", 1)
        seed(store, container, name, int(size))
    if manager is not None:
        _start_others(a.port, store, a.processes - 1)
    try:
        _serve(a.port, store, shared=manager is not None)
    except (OSError, ValueError):  # no port sharing here: this process serves alone
        if manager is None:
            raise
        _serve(a.port, store)


if __name__ == "__main__":
    main()
