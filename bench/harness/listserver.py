"""A synthetic Blob service for scale (issue 52): every container holds the same N generated blobs, computed from
their position and never stored, so 10^7 objects cost the server no memory. It answers List Blobs (prefix,
delimiter, marker, startFrom, maxresults; each page after a fixed latency, the same for every tool), HEAD and GET of a
generated blob (zeros), and takes writes and deletes without keeping bytes. No auth is checked.

Names are `d00042/obj-000042123.bin`: `--folders` folders of equal share, sorted as the service sorts (zero-padded,
so name order is position order and a marker or prefix is found by bisection). Every blob has the same times:
Last-Modified and the `mtime` metadata blobsync and rclone store are TIME below, so a local tree made with the same
mtime (`make_tree`) is in sync with it for every tool (AzCopy compares Last-Modified, rclone and blobsync the
stored mtime).

    python bench/harness/listserver.py --port 10100 --objects 1000000 --folders 1000 --latency-ms 50
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import os
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from xml.sax.saxutils import escape

from aiohttp import web

TIME = 1_735_689_600  # 2025-01-01T00:00:00Z: every blob's Last-Modified and stored mtime
MTIME_TEXT = "2025-01-01T00:00:00.000000000Z"
HTTP_TIME = formatdate(TIME, usegmt=True)
PAGE_MAX = 5000


class Namespace:
    """N names in service order, position <-> name without a table."""

    def __init__(self, objects: int, folders: int) -> None:
        self.objects = objects
        self.per = max(1, -(-objects // max(1, folders)))  # blobs per folder, the last one short

    def __len__(self) -> int:
        return self.objects

    def __getitem__(self, k: int) -> str:
        return f"d{k // self.per:05d}/obj-{k:09d}.bin"

    def size(self, k: int) -> int:
        return 1024 + k % 1000

    def position(self, name: str) -> int | None:
        """The position of a generated blob's name, None for any other name."""
        try:
            k = int(name[-13:-4])
        except ValueError:
            return None
        return k if 0 <= k < self.objects and self[k] == name else None

    def lower_bound(self, name: str) -> int:
        """The first position whose name is >= `name`."""
        return bisect.bisect_left(self, name)  # type: ignore[call-overload]


def successor(prefix: str) -> str:
    """The least string above every string that starts with `prefix`."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def page(ns: Namespace, prefix: str, delimiter: str, start: str, size: int) -> tuple[list[int], list[str], str]:
    """One page: the positions of its blobs, its prefixes (with a delimiter) and the name the next page starts at."""
    blobs: list[int] = []
    prefixes: list[str] = []
    k = ns.lower_bound(max(prefix, start))
    while k < len(ns):
        name = ns[k]
        if not name.startswith(prefix):
            break
        if len(blobs) + len(prefixes) == size:
            return blobs, prefixes, name
        cut = name.find(delimiter, len(prefix)) if delimiter else -1
        if cut >= 0:
            below = name[:cut + len(delimiter)]
            prefixes.append(below)
            k = ns.lower_bound(successor(below))
        else:
            blobs.append(k)
            k += 1
    return blobs, prefixes, ""


def blob_xml(ns: Namespace, k: int) -> str:
    md5 = base64.b64encode(k.to_bytes(16, "big")).decode()
    return (f"<Blob><Name>{ns[k]}</Name><Properties><Creation-Time>{HTTP_TIME}</Creation-Time>"
            f"<Last-Modified>{HTTP_TIME}</Last-Modified><Etag>0x8D{k:014X}</Etag>"
            f"<Content-Length>{ns.size(k)}</Content-Length><Content-Type>application/octet-stream</Content-Type>"
            f"<Content-MD5>{md5}</Content-MD5><BlobType>BlockBlob</BlobType><AccessTier>Hot</AccessTier>"
            "<AccessTierInferred>true</AccessTierInferred><LeaseStatus>unlocked</LeaseStatus>"
            "<LeaseState>available</LeaseState><ServerEncrypted>true</ServerEncrypted></Properties>"
            f"<Metadata><mtime>{MTIME_TEXT}</mtime></Metadata></Blob>")


def _marker(name: str) -> str:
    # Opaque, as the service's are: a client must hand it back, never build one.
    return "2!" + base64.urlsafe_b64encode(name.encode()).decode()


def _unmarker(marker: str) -> str:
    return base64.urlsafe_b64decode(marker[2:].encode()).decode() if marker.startswith("2!") else ""


def listing(ns: Namespace, container: str, query: dict[str, str]) -> str:
    prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
    size = min(PAGE_MAX, int(query.get("maxresults", PAGE_MAX)))
    # startFrom (service version 2026-02-06) names where a listing starts, inclusive; a marker, where it goes on.
    start = max(_unmarker(query.get("marker", "")), query.get("startFrom", ""))
    blobs, prefixes, after = page(ns, prefix, delimiter, start, size)
    items = [blob_xml(ns, k) for k in blobs] + [f"<BlobPrefix><Name>{escape(p)}</Name></BlobPrefix>"
                                                 for p in prefixes]
    if prefixes and blobs:
        items.sort(key=lambda item: item[item.index("<Name>") + 6:item.index("</Name>")])
    return ('<?xml version="1.0" encoding="utf-8"?>'
            f'<EnumerationResults ServiceEndpoint="http://127.0.0.1/" ContainerName="{escape(container)}">'
            f"<Prefix>{escape(prefix)}</Prefix><MaxResults>{size}</MaxResults>"
            + (f"<Delimiter>{escape(delimiter)}</Delimiter>" if delimiter else "")
            + "<Blobs>" + "".join(items) + "</Blobs>"
            + (f"<NextMarker>{_marker(after)}</NextMarker>" if after else "<NextMarker />")
            + "</EnumerationResults>")


def _split(path: str) -> tuple[str, str]:
    parts = path.lstrip("/").split("/", 2)  # account/container/blob
    return (parts[1] if len(parts) > 1 else ""), (parts[2] if len(parts) > 2 else "")


def _headers(ns: Namespace, k: int) -> dict[str, str]:
    return {"ETag": f'"0x8D{k:014X}"', "Last-Modified": HTTP_TIME, "x-ms-blob-type": "BlockBlob",
            "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes", "x-ms-version": "2021-08-06",
            "x-ms-meta-mtime": MTIME_TEXT, "Content-Length": str(ns.size(k))}


async def handle_get(request: web.Request) -> web.StreamResponse:
    ns: Namespace = request.app["ns"]
    container, name = _split(request.path)
    q = dict(request.query)
    request.app["requests"][q.get("comp", request.method.lower())] = \
        request.app["requests"].get(q.get("comp", request.method.lower()), 0) + 1
    if q.get("comp") == "list":
        await asyncio.sleep(request.app["latency"])
        return web.Response(text=listing(ns, container, q), content_type="application/xml")
    if not name:  # container or account properties
        return web.Response(status=200, headers={"ETag": '"0x8D0000000000001"', "Last-Modified": HTTP_TIME})
    k = ns.position(name)
    if k is None:
        return web.Response(status=404, headers={"x-ms-error-code": "BlobNotFound"})
    if request.method == "HEAD":
        return web.Response(headers=_headers(ns, k))
    return web.Response(body=bytes(ns.size(k)), headers={k2: v for k2, v in _headers(ns, k).items()
                                                          if k2 != "Content-Length"})


async def handle_write(request: web.Request) -> web.StreamResponse:
    async for _ in request.content.iter_chunked(1 << 20):
        pass
    status = 202 if request.method == "DELETE" else 201
    return web.Response(status=status, headers={"ETag": '"0x8D0000000000002"', "Last-Modified": HTTP_TIME})


def app(objects: int, folders: int, latency_s: float) -> web.Application:
    application = web.Application(client_max_size=5000 << 20)
    application["ns"] = Namespace(objects, folders)
    application["latency"] = latency_s
    application["requests"] = {}
    application.router.add_route("GET", "/{tail:.*}", handle_get)
    application.router.add_route("HEAD", "/{tail:.*}", handle_get)
    application.router.add_route("PUT", "/{tail:.*}", handle_write)
    application.router.add_route("DELETE", "/{tail:.*}", handle_write)
    return application


def names(objects: int, folders: int) -> Iterator[tuple[str, int]]:
    ns = Namespace(objects, folders)
    for k in range(objects):
        yield ns[k], ns.size(k)


def make_tree(root: Path, objects: int, folders: int) -> None:
    """The local twin of the service's namespace: the same names, sizes and mtime (files of zeros)."""
    made: set[str] = set()
    for name, size in names(objects, folders):
        folder = name.split("/", 1)[0]
        if folder not in made:
            (root / folder).mkdir(parents=True, exist_ok=True)
            made.add(folder)
        path = root / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        os.utime(path, (TIME, TIME))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--objects", type=int, default=1_000_000)
    p.add_argument("--folders", type=int, default=1000)
    p.add_argument("--latency-ms", type=float, default=50.0)
    a = p.parse_args()
    web.run_app(app(a.objects, a.folders, a.latency_ms / 1000), host="127.0.0.1", port=a.port, access_log=None,
                print=lambda *_: print("list server listening", flush=True))


if __name__ == "__main__":
    main()
