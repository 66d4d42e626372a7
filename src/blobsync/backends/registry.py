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
    from blobsync.backends.diagnosis import Diagnosis
    from blobsync.config import TransferConfig


@dataclass(frozen=True)
class Wire:
    """What a store reports and obeys as bytes move: the bandwidth cap's bucket and the progress counter."""

    throttle: Callable[[int], Awaitable[None]] | None = None  # takes tokens for n bytes before they are sent
    on_wire: Callable[[int], None] | None = None  # n body bytes written to or read from the network


NO_WIRE = Wire()


@dataclass(frozen=True)
class Connection:
    """How any store connects, whatever its backend: read once from the job's options."""

    connections: int = 68  # the connection pool: the request limit and a few for listings and the like
    stall_timeout: float = 120.0  # seconds without progress before a request is given up (--stall-timeout)
    proxy: str | None = None  # overrides the environment's proxies (--proxy)
    trusted_suffixes: tuple[str, ...] = ()  # hosts beyond a backend's own that may receive its credentials

    @classmethod
    def of(cls, config: TransferConfig) -> Connection:
        return cls(config.max_concurrency + 4, config.stall_timeout, config.proxy, config.trusted_suffixes)


class Backend(Protocol):
    """A kind of store: reads its URLs and opens a store for one."""

    def parse(self, url: str) -> Location:
        """The location a URL names; UsageError (never echoing a secret) when it is malformed."""
        ...

    def open(self, location: Location, connection: Connection, env: Mapping[str, str], wire: Wire,
             credential: object = None) -> Store:
        """A store for the container `location` names. `credential` (Client(credential=...)) replaces what the
        URL and the environment give; a backend that takes no credential objects refuses one with a UsageError."""
        ...

    async def diagnose(self, location: Location, connection: Connection, env: Mapping[str, str], *,
                       write_test: bool, timeout: float) -> Diagnosis:
        """`blobsync doctor`: what the location's credentials allow and whether its endpoint answers (with
        `write_test`, a probe object put, read back and deleted); a backend with nothing to check says so."""
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
    return backend_for(location.display).open(location, Connection.of(config), env, wire, credential)


async def diagnose(url: str, connection: Connection, env: Mapping[str, str], *, write_test: bool, timeout: float
                   ) -> Diagnosis:
    """`blobsync doctor URL`, by the backend the URL's scheme selects."""
    location = parse_location(url)
    return await backend_for(url).diagnose(location, connection, env, write_test=write_test, timeout=timeout)


def nothing_to_diagnose(location: Location) -> UsageError:
    """For a backend without a doctor: the line that says so."""
    return UsageError(f"{location.display}: doctor checks Azure Blob URLs (credentials, SAS, endpoint); this kind of "
                      "URL has none of those to check")


def no_credential_object(location: Location, credential: object) -> None:
    """For a backend that takes no credential objects: a usage error if one was given."""
    if credential is not None:
        raise UsageError(f"{location.display}: this kind of store takes no credential object")
