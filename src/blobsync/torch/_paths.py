"""Folder URLs as the torch layer takes them: one form (a trailing '/', the SAS kept), and names below them."""

from __future__ import annotations

import os

from blobsync.client import Client
from blobsync.errors import UsageError
from blobsync.redact import strip_query


def folder_url(url: str | os.PathLike[str], what: str = "url") -> str:
    """`url` as a folder URL: its path ends in '/', its query (a SAS) kept."""
    text = os.fspath(url) if isinstance(url, str | os.PathLike) else url
    if not isinstance(text, str) or "://" not in text:
        raise UsageError(f"invalid {what} {text!r}: a folder URL under a container (https://..., memory://)")
    base, sep, query = text.partition("?")
    return base.rstrip("/") + "/" + (sep + query if sep else "")


def below(client: Client, url: str) -> str:
    """The path of the folder `url` relative to `client`'s URL ('' when it is the client's own)."""
    own, base = strip_query(client.aio.url).rstrip("/") + "/", strip_query(url)
    if not base.startswith(own):
        raise UsageError(f"the client given is for {own!r}, not an account or container above {base!r}")
    return base[len(own):].lstrip("/")


def container_path(url: str) -> str:
    """A folder URL's path in its container, as listings name blobs ('' for the container itself)."""
    from blobsync.backends.registry import parse_location

    path = parse_location(strip_query(url)).path
    return path.rstrip("/") + "/" if path.strip("/") else ""


def base_path(url: str, base: str | os.PathLike[str], what: str = "base") -> str:
    """The path in its container of `base`, a folder URL in the same container as `url` (an incremental save's
    earlier checkpoint: the service stages its blocks, which it does only within reach of one credential)."""
    from blobsync.backends.registry import parse_location

    base_url = folder_url(base, what)
    here, there = parse_location(strip_query(url)), parse_location(strip_query(base_url))
    if (here.container_url, here.container) != (there.container_url, there.container):
        raise UsageError(f"invalid {what} {strip_query(base_url)!r}: an earlier checkpoint in the same container as "
                         f"{strip_query(url)!r}")
    return container_path(base_url)
