"""Requests with a body, through aiohttp: bodies sent in slices under the bandwidth cap and a stall guard.

Imported on the first upload request only: downloads, listings and no-op syncs never load aiohttp (~100 ms).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

import aiohttp
import aiohttp.abc
import aiohttp.payload
from yarl import URL

from blobsync.backends.azure_errors import network_error
from blobsync.backends.base import Buffer
from blobsync.errors import NetworkError

_CHUNK = 256 * 1024
Throttle = Callable[[int], Awaitable[None]]  # takes bandwidth tokens for n bytes (the --cap-mbps bucket)


class BodyStalled(TimeoutError):
    """The request body made no progress for the stall timeout: the peer stopped reading.

    A TimeoutError so that aiohttp passes it through as the request's failure; `_call` turns it into a
    NetworkError that says what happened."""


class _StallGuard:
    """Aborts a body write that makes no progress for `timeout` seconds.

    Progress is bytes taken by the kernel (handed to the transport minus what it still buffers), so a slow
    but moving body on a slow link lives on, and only a peer that stopped reading (TCP send buffer full)
    is cut off. The clock runs only while a write is blocked, never while the bandwidth cap holds a slice
    back: waiting for tokens is not a stall.
    """

    def __init__(self, writer: aiohttp.abc.AbstractStreamWriter, timeout: float) -> None:
        self._writer = writer
        self.timeout = timeout
        self._tick = min(1.0, max(0.05, timeout / 4))
        self._handed = 0

    def _taken(self) -> int:
        transport: asyncio.Transport | None = getattr(self._writer, "transport", None)
        pending = transport.get_write_buffer_size() if transport is not None else 0
        return self._handed - pending

    async def write(self, piece: memoryview) -> None:
        loop = asyncio.get_running_loop()
        best = self._taken()
        last = loop.time()
        handle: asyncio.TimerHandle | None = None

        def check(cm: asyncio.Timeout) -> None:
            nonlocal best, last, handle
            taken, now = self._taken(), loop.time()
            if taken > best:
                best, last = taken, now
            if now - last >= self.timeout:
                cm.reschedule(now)  # cancels the blocked write; the timeout context raises TimeoutError
            else:
                handle = loop.call_later(self._tick, check, cm)

        self._handed += piece.nbytes
        try:
            async with asyncio.timeout(None) as cm:
                handle = loop.call_later(self._tick, check, cm)
                await self._writer.write(piece)
        except TimeoutError:
            raise BodyStalled(f"no progress sending the body for {self.timeout:g}s") from None
        finally:
            if handle is not None:
                handle.cancel()


class _BufferPayload(aiohttp.payload.Payload):
    """A request body written in slices, each awaited, each under a stall guard.

    Handing a multi-MiB buffer to the transport in one write makes asyncio copy whatever the socket does not
    take at once into its own buffer: a second copy of every block, in memory and in CPU. Slices keep that
    copy small and let the transport's flow control pace the writes.
    """

    _autoclose = True

    def __init__(self, value: Buffer, throttle: Throttle | None = None, stall_timeout: float | None = None) -> None:
        super().__init__(value, content_type=None)
        self._view = memoryview(value).cast("B")
        self._size = self._view.nbytes
        self._throttle = throttle
        self._stall_timeout = stall_timeout
        self.stalled = False  # set when the guard cut the body off; read by `_call` for the error message

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return bytes(self._view).decode(encoding, errors)

    async def write(self, writer: aiohttp.abc.AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: aiohttp.abc.AbstractStreamWriter, content_length: int | None
    ) -> None:
        view = self._view if content_length is None else self._view[:content_length]
        guard = _StallGuard(writer, self._stall_timeout) if self._stall_timeout else None
        for start in range(0, view.nbytes, _CHUNK):
            piece = view[start:start + _CHUNK]
            if self._throttle is not None:
                await self._throttle(piece.nbytes)
            if guard is None:
                await writer.write(piece)
                continue
            try:
                await guard.write(piece)
            except BodyStalled:
                self.stalled = True
                raise


def _body(data: Buffer | None, throttle: Throttle | None,
          stall_timeout: float | None) -> Buffer | aiohttp.payload.Payload | None:
    # A body of one slice or less fits in the socket buffers: once written, the response's read timeout
    # (the same stall timeout) covers the rest of the request.
    if data is None or (len(data) <= _CHUNK and throttle is None):
        return data
    return _BufferPayload(data, throttle, stall_timeout)


def new_session(connections: int, connect_timeout: float, read_timeout: float) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, limit_per_host=connections, ttl_dns_cache=300),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout),
        auto_decompress=False,
        skip_auto_headers=("Content-Type", "User-Agent", "Accept-Encoding"),
    )


async def send(session: aiohttp.ClientSession, method: str, url: str, headers: Mapping[str, str],
               body: Buffer | None, throttle: Throttle | None, stall_timeout: float, what: str
               ) -> tuple[int, Mapping[str, str], bytes]:
    """One request with a body: (status, lower-case headers, response body)."""
    payload = _body(body, throttle, stall_timeout)
    try:
        async with session.request(method, URL(url, encoded=True), headers=headers, data=payload) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, await resp.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        if isinstance(payload, _BufferPayload) and payload.stalled:
            raise NetworkError(f"{what}: no progress sending the body for {stall_timeout:g}s "
                               "(the other end stopped reading); aborted") from exc
        raise network_error(what, exc) from exc
