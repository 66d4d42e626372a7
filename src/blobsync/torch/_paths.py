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
