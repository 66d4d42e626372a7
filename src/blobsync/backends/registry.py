"""Stores by URL scheme: backends register themselves here; the engine opens a store for a URL through it."""

from __future__ import annotations

import importlib
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from blobsync.errors import UsageError

if TYPE_CHECKING:
    from blobsync.backends.base import Location, Store
    from blobsync.config import TransferConfig


@dataclass(frozen=True)
class Wire:
    """What a store reports and obeys as bytes move: the bandwidth cap's bucket and the progress counter."""

    throttle: Callable[[int], Awaitable[None]] | None = None  # takes tokens for n bytes before they are sent
    on_wire: Callable[[int], None] | None = None  # n body bytes written to or read from the network


NO_WIRE = Wire()


class Backend(Protocol):
    """A kind of store: reads its URLs and opens a store for one."""

    def parse(self, url: str) -> Location:
        """The location a URL names; UsageError (never echoing a secret) when it is malformed."""
        ...

    def open(self, location: Location, config: TransferConfig, env: Mapping[str, str], wire: Wire) -> Store:
        """A store for the container `location` names; a backend that takes credential objects also accepts
        `credential=` (Client(credential=...)), which then replaces what the URL and the environment give."""
        ...


_BACKENDS: dict[str, Backend] = {}
# Built in, imported on first use (a local path never pays for them); each registers itself when imported.
_BUILTIN = {"http": "blobsync.backends.azure", "https": "blobsync.backends.azure",
            "memory": "blobsync.backends.memory", "s3": "blobsync.backends.s3"}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")


def register(scheme: str, backend: Backend) -> None:
    """Make URLs `scheme://...` open stores of `backend` (a package outside blobsync may add its own)."""
    _BACKENDS[scheme.lower()] = backend


def is_remote(text: str) -> bool:
    """True when `text` is a URL of a store blobsync knows (scheme://...) rather than a local path."""
    match = _SCHEME.match(text)
    return match is not None and (match.group(1).lower() in _BACKENDS or match.group(1).lower() in _BUILTIN)


def backend_for(url: str) -> Backend:
    match = _SCHEME.match(url)
    scheme = match.group(1).lower() if match else ""
    if scheme not in _BACKENDS and scheme in _BUILTIN:
        importlib.import_module(_BUILTIN[scheme])
    backend = _BACKENDS.get(scheme)
    if backend is None:
        known = ", ".join(f"{s}://" for s in sorted({*_BUILTIN, *_BACKENDS}))
        shown = url.split("?", 1)[0]
        raise UsageError(f"malformed URL {shown!r}: expected https://<account>.blob.core.windows.net/<container>"
                         f"[/<path>] (blobsync reads {known} URLs)")
    return backend


def parse_location(url: str) -> Location:
    """The location a URL names, read by the backend its scheme selects."""
    return backend_for(url).parse(url)


def open_store(url: str | Location, config: TransferConfig, env: Mapping[str, str], wire: Wire = NO_WIRE,
               credential: object = None) -> Store:
    """A store for the container a URL (or a parsed location) names, with `credential` if one is given."""
    location = parse_location(url) if isinstance(url, str) else url
    backend = backend_for(location.display)
    if credential is None:
        return backend.open(location, config, env, wire)
    try:
        return backend.open(location, config, env, wire, credential=credential)  # type: ignore[call-arg]
    except TypeError as exc:
        if "credential" not in str(exc):
            raise
        raise UsageError(f"{location.display}: this kind of store takes no credential object") from None
