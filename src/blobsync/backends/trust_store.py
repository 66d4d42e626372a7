"""aiohttp's default TLS contexts with the system CA store read when first needed, not at aiohttp's import."""

from __future__ import annotations

import ssl
import sys
import threading
from types import ModuleType

_deferring = False
_unloaded: list[ssl.SSLContext] = []  # default contexts made while deferring: their store is still to be read
_lock = threading.Lock()


def defer() -> None:
    """From now on, aiohttp (when `import_aiohttp` first loads it) makes its default contexts without reading the
    system store: reading it twice is ~45 ms of a short command's ~0.25 s start. For the CLI's own process only.
    blobsync's requests never use those contexts (their own `http.ssl_context`, or none for http://); the one
    other user there, an azure-identity async credential, calls `load()` before its first token request."""
    global _deferring
    _deferring = True


def import_aiohttp() -> ModuleType:
    """aiohttp, loaded (when deferring) with the store of the contexts it makes at import left for `load()`."""
    if not _deferring or "aiohttp" in sys.modules:
        import aiohttp

        return aiohttp
    importer = threading.get_ident()
    real = ssl.SSLContext.set_default_verify_paths

    def later(context: ssl.SSLContext) -> None:
        # load_default_certs comes down to this call on every platform; another thread's context is not ours.
        if threading.get_ident() != importer:
            real(context)
            return
        with _lock:
            _unloaded.append(context)

    ssl.SSLContext.set_default_verify_paths = later  # type: ignore[method-assign, assignment]
    try:
        import aiohttp
    finally:
        del ssl.SSLContext.set_default_verify_paths  # the inherited method again
    return aiohttp


def load() -> None:
    """Read the system store into every context whose reading was deferred (at once, and once)."""
    with _lock:
        pending = _unloaded[:]
        _unloaded.clear()
    for context in pending:
        context.set_default_verify_paths()
