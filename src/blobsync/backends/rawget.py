"""A lean HTTP/1.1 GET for ranged blob reads: the body lands straight in the caller's buffer (recv_into).

Ranged GETs carry almost every byte of a download. Through aiohttp each byte is copied from the socket into a
bytes object, handed through its parser and stream, and copied again when written; here the socket reads into
the block buffer itself (asyncio.BufferedProtocol), which halves the client's CPU per GiB. Only what a Blob GET
needs is implemented: one request per connection at a time, keep-alive, Content-Length bodies, TLS.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

Throttle = Callable[[int], Awaitable[None]]

_MAX_HEAD = 64 * 1024  # status line + headers; Azure's are ~1 KiB
_MAX_ERROR_BODY = 256 * 1024
_THROTTLED_READ = 256 * 1024  # under a bandwidth cap, read (and pay for) at most this much at a time


class RawHttpError(Exception):
    """A transport-level failure: refused, reset, closed early, stalled or malformed."""


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body_length: int  # bytes written into the caller's buffer (success) ...
    error_body: bytes  # ... or the body of a non-2xx answer (for the error message)


class _GetProtocol(asyncio.BufferedProtocol):
    """One connection. Per request: the head is read into a scratch buffer, the body into the sink."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.last_activity = time.monotonic()
        self._scratch = bytearray(64 * 1024)
        self._reset(None)

    def _reset(self, sink: memoryview | None) -> None:
        self._sink = sink
        self._head = bytearray()
        self._state = "idle"  # idle | head | body | error
        self._status = 0
        self._headers: dict[str, str] = {}
        self._pos = 0
        self._want = 0
        self._error_body = bytearray()
        self._waiter: asyncio.Future[RawResponse] | None = None
        self._received_any = False
        self._throttle: Throttle | None = None
        self._owed = 0
        self._paying: asyncio.Task[None] | None = None

    # --- asyncio callbacks --------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        if self._state == "body" and self._sink is not None:
            end = self._want if self._throttle is None else min(self._want, self._pos + _THROTTLED_READ)
            return self._sink[self._pos:end]  # never past this response's body
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        self.last_activity = time.monotonic()
        self._received_any = True
        if self._state == "body":
            self._pos += nbytes
            self._pay(nbytes)
            if self._pos == self._want:
                self._complete()
        elif self._state == "head":
            self._head += self._scratch[:nbytes]
            self._parse_head()
        elif self._state == "error":
            self._error_body += self._scratch[:nbytes]
            if len(self._error_body) >= self._want:
                self._complete()
        else:  # bytes nobody asked for: this connection cannot be trusted any more
            self._fail(RawHttpError("unexpected data on an idle connection"))

    def eof_received(self) -> bool | None:
        self._fail(RawHttpError("the server closed the connection"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(RawHttpError(f"connection lost: {exc}" if exc else "connection closed"))

    # --- request life -----------------------------------------------------------------------------------------

    def request(self, head: bytes, sink: memoryview, throttle: Throttle | None) -> asyncio.Future[RawResponse]:
        assert self.transport is not None and self._state == "idle"
        self._reset(sink)
        self._throttle = throttle
        self._state = "head"
        self._waiter = asyncio.get_running_loop().create_future()
        self.last_activity = time.monotonic()
        self.transport.write(head)
        return self._waiter

    @property
    def received_any(self) -> bool:
        return self._received_any

    async def paid(self) -> None:
        """Wait until the bandwidth cap let every byte received so far through."""
        if self._paying is not None:
            await asyncio.wait([self._paying])  # never raises the settling task's own cancellation

    def _parse_head(self) -> None:
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > _MAX_HEAD:
                self._fail(RawHttpError("response head too large"))
            return
        lines = bytes(self._head[:end]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            self._fail(RawHttpError(f"malformed status line {lines[0][:80]!r}"))
            return
        self._status = int(parts[1])
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                key = name.strip().lower()
                value = value.strip()
                self._headers[key] = f"{self._headers[key]}, {value}" if key in self._headers else value
        rest = bytes(self._head[end + 4:])
        self._head = bytearray()
        length_text = self._headers.get("content-length")
        if self._status == 100:  # an interim answer: the real head follows
            self._head = bytearray(rest)
            self._headers = {}
            if rest:
                self._parse_head()
            return
        if "chunked" in self._headers.get("transfer-encoding", "").lower() or length_text is None \
                or not length_text.isdigit():
            if 200 <= self._status < 300:
                self._fail(RawHttpError("response without a Content-Length"))
            else:  # an error without a length: its head says enough; the connection is not reused
                self._headers["connection"] = "close"
                self._want = 0
                self._complete()
            return
        length = int(length_text)
        if 200 <= self._status < 300:
            assert self._sink is not None
            if length > len(self._sink):
                self._fail(RawHttpError(f"body of {length} bytes does not fit the {len(self._sink)}-byte range"))
                return
            self._state = "body"
            self._want = length
            take = min(len(rest), length)
            self._sink[:take] = rest[:take]
            self._pos = take
            if take:
                self._pay(take)
            if self._pos == self._want:
                self._complete()
        else:
            self._state = "error"
            self._want = min(length, _MAX_ERROR_BODY)
            self._error_body = bytearray(rest)
            if len(rest) >= length:
                self._complete()
            elif length > _MAX_ERROR_BODY:
                self._headers["connection"] = "close"  # the rest is not read: do not reuse

    def _pay(self, nbytes: int) -> None:
        """With a bandwidth cap, stop reading until the bucket let these bytes through: TCP slows the sender."""
        if self._throttle is None or self.transport is None:
            return
        self._owed += nbytes
        if self._paying is None:
            self.transport.pause_reading()
            self._paying = asyncio.get_running_loop().create_task(self._settle())

    async def _settle(self) -> None:
        assert self._throttle is not None
        try:
            while self._owed:
                owed, self._owed = self._owed, 0
                await self._throttle(owed)
        finally:
            self._paying = None
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()

    def _complete(self) -> None:
        waiter = self._waiter
        response = RawResponse(self._status, dict(self._headers), self._pos, bytes(self._error_body[:self._want]))
        self._state = "idle"
        self._sink = None
        self._waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def _fail(self, exc: Exception) -> None:
        waiter = self._waiter
        self._state = "idle"
        self._sink = None  # never write into the caller's buffer again
        self._waiter = None
        if self._paying is not None:
            self._paying.cancel()
        if self.transport is not None and not self.closed:
            self.transport.abort()
            self.closed = True
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def abort(self, reason: str) -> None:
        self._fail(RawHttpError(reason))


class RawGetClient:
    """A small pool of keep-alive connections to one host, for ranged GETs into caller buffers."""

    def __init__(self, scheme: str, netloc: str, *, connect_timeout: float, stall_timeout: float,
                 throttle: Throttle | None = None, max_idle: int = 64) -> None:
        host, _, port = netloc.rpartition(":") if netloc.rsplit(":", 1)[-1].isdigit() else (netloc, "", "")
        self.host = host.strip("[]")
        self.port = int(port) if port else (443 if scheme == "https" else 80)
        self.netloc = netloc
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if scheme == "https" else None
        self.connect_timeout = connect_timeout
        self.stall_timeout = stall_timeout
        self.throttle = throttle
        self.max_idle = max_idle
        self._idle: list[_GetProtocol] = []

    async def _connect(self) -> _GetProtocol:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(_GetProtocol, self.host, self.port, ssl=self.ssl,
                                       server_hostname=self.host if self.ssl else None),
                self.connect_timeout)
        except (OSError, TimeoutError) as exc:
            raise RawHttpError(f"cannot connect to {self.netloc}: {type(exc).__name__}: {exc}") from exc
        return protocol

    async def get_into(self, target: str, headers: Mapping[str, str], sink: memoryview) -> RawResponse:
        """GET `target` (path and query); a 2xx body is written into `sink`. One retry on a fresh connection
        when a kept-alive one turns out closed before answering (the server may drop idle connections)."""
        head = (f"GET {target} HTTP/1.1\r\nHost: {self.netloc}\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode("latin-1")
        for attempt in range(2):
            while self._idle and self._idle[-1].closed:
                self._idle.pop()
            reused = bool(self._idle)
            protocol = self._idle.pop() if reused else await self._connect()
            try:
                response = await self._exchange(protocol, head, sink)
            except RawHttpError:
                if reused and not protocol.received_any and attempt == 0:
                    continue
                raise
            except BaseException:
                protocol.abort("request cancelled")
                raise
            if response.headers.get("connection", "").lower() == "close" or len(self._idle) >= self.max_idle:
                protocol.abort("not reused")
            else:
                self._idle.append(protocol)
            return response
        raise AssertionError("unreachable")

    async def _exchange(self, protocol: _GetProtocol, head: bytes, sink: memoryview) -> RawResponse:
        if protocol.closed:
            raise RawHttpError("connection closed")
        waiter = protocol.request(head, sink, self.throttle)
        loop = asyncio.get_running_loop()

        def watchdog() -> None:
            # A stall, not a slow body, is what ends a request: the clock restarts with every byte received.
            if waiter.done():
                return
            idle = time.monotonic() - protocol.last_activity
            if idle >= self.stall_timeout:
                protocol.abort(f"no data for {self.stall_timeout:g}s (--stall-timeout)")
            else:
                handle[0] = loop.call_later(self.stall_timeout - idle, watchdog)

        handle = [loop.call_later(self.stall_timeout, watchdog)]
        try:
            response = await waiter
        finally:
            handle[0].cancel()
        await protocol.paid()  # a body read in one go still takes its time under --cap-mbps
        return response

    def close(self) -> None:
        for protocol in self._idle:
            protocol.abort("client closed")
        self._idle.clear()
