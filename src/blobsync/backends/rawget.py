"""The HTTP/1.1 client of every request: ranged reads land in the caller's buffer, bodies leave from it.

Ranged GETs carry almost every byte of a download. Through aiohttp each byte was copied from the socket into a
bytes object and handed through its parser and stream; here the socket reads straight into the block buffer
(asyncio.BufferedProtocol + recv_into). Listings and other small answers are collected whole (Content-Length,
chunked, or until close). A small body (Put Blob of a small file, Put Block List) goes out with its head in one
write; a large one (Put Block) in slices, paced by the transport's flow control and the bandwidth cap, under the
same stall watch as reads (aiohttp did this before: its import alone held every upload's first block back
~110 ms). One request per connection at a time, keep-alive, TLS.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from blobsync.backends.base import Buffer

Throttle = Callable[[int], Awaitable[None]]

_MAX_HEAD = 64 * 1024  # status line + headers; Azure's are ~1 KiB
_MAX_COLLECTED = 256 * 1024 * 1024  # a listing page is a few MiB; anything far bigger is not for us
_THROTTLED_READ = 256 * 1024  # under a bandwidth cap, read (and pay for) at most this much at a time
SLICE = 256 * 1024  # a larger body is handed to the transport this much at a time (see send)


def _unsent(fd: int) -> int:
    """Bytes the kernel holds in a socket's send queue (not yet taken by the peer); OSError where it cannot say."""
    if sys.platform == "win32":  # pragma: no cover
        raise OSError("no send queue size on this platform")
    import fcntl
    import termios

    return int(struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0])


class RawHttpError(Exception):
    """A transport-level failure: refused, reset, closed early, stalled or malformed."""

    def __init__(self, message: str, *, closed_by_peer: bool = False) -> None:
        super().__init__(message)
        self.closed_by_peer = closed_by_peer  # the server closed or reset the connection (not our abort)


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body_length: int  # bytes of body received (into the sink, or collected)
    body: bytes  # the collected body when there was no sink (or the answer was not 2xx)


class _Protocol(asyncio.BufferedProtocol):
    """One connection. Per request: the head is parsed from a scratch buffer, then the body goes either into
    the caller's sink (a 2xx answer to a ranged GET) or into a collected bytearray."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.last_activity = time.monotonic()
        self._scratch = bytearray(256 * 1024)
        # Handed out as a memoryview, never the bytearray itself: asyncio's TLS transport fills a buffer in
        # several reads through `buf[offset:]`, which for a bytearray is a copy, and those bytes would be lost.
        self._scratch_view = memoryview(self._scratch)
        self._paused = False  # the transport's write buffer is over its high-water mark
        self._drain: asyncio.Future[None] | None = None  # a body send waiting for the transport to take more
        self.sending = False  # a request body is still going out
        self.holding = False  # the bandwidth cap holds the next slice of a body back: not a stall
        self._fd = -1  # the socket, for its send queue (see moved)
        self._queued = 0
        self.on_wire: Callable[[int], None] | None = None  # told of body bytes as they are written or read
        self._reset(None, "GET", None)

    def _reset(self, sink: memoryview | None, method: str, throttle: Throttle | None) -> None:
        self._sink = sink
        self._method = method
        self._throttle = throttle
        self._pending = bytearray()  # bytes read but not parsed yet (head, chunk framing)
        self._state = "idle"  # idle | head | sink | length | chunked | eof
        self._status = 0
        self._headers: dict[str, str] = {}
        self._pos = 0
        self._want = 0
        self._body = bytearray()
        self._chunk_left = 0  # chunked: data bytes left in this chunk; -1: CRLF after it; -2: in trailers
        self._waiter: asyncio.Future[RawResponse] | None = None
        self._received_any = False
        self._owed = 0
        self._paying: asyncio.Task[None] | None = None

    # --- asyncio callbacks --------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._state == "sink" and self._sink is not None:
            end = self._want if self._throttle is None else min(self._want, self._pos + _THROTTLED_READ)
            return self._sink[self._pos:end]  # never past this response's body
        return self._scratch_view

    def buffer_updated(self, nbytes: int) -> None:
        self.last_activity = time.monotonic()
        self._received_any = True
        self._pay(nbytes)
        if self._state == "sink":
            self._pos += nbytes
            if self.on_wire is not None:
                self.on_wire(nbytes)
            if self._pos == self._want:
                self._complete()
            return
        if self._state == "idle":  # bytes nobody asked for: this connection cannot be trusted any more
            self._fail(RawHttpError("unexpected data on an idle connection"))
            return
        self._feed(self._scratch[:nbytes])

    def eof_received(self) -> bool | None:
        if self._state == "eof":
            self._headers["connection"] = "close"
            self._complete()
        else:
            self._fail(RawHttpError("the server closed the connection", closed_by_peer=True))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(RawHttpError(f"connection lost: {exc}" if exc else "connection closed", closed_by_peer=True))

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self.last_activity = time.monotonic()  # the peer took bytes: the body is moving
        self._wake()

    def moved(self) -> bool:
        """Whether the peer took bytes of ours since the last call: the kernel's send queue shrank. A body can
        still be on its way for a while after its last write (the socket buffer holds up to a few MiB)."""
        if self._fd < 0:
            return False
        try:
            queued = _unsent(self._fd)
        except OSError:  # not a socket that can say (or closed): fall back to writes and reads
            self._fd = -1
            return False
        moved, self._queued = queued < self._queued, queued
        return moved

    @property
    def queued(self) -> int:
        """Bytes of ours the kernel still held at the last look (see moved)."""
        return self._queued

    def _wake(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    # --- request life -----------------------------------------------------------------------------------------

    def request(self, method: str, sink: memoryview | None, throttle: Throttle | None
                ) -> asyncio.Future[RawResponse]:
        """Expect the answer to a request (sent next, by `send`); `throttle` paces the reading of its body."""
        assert self.transport is not None and self._state == "idle"
        self._reset(sink, method, throttle)
        self._state = "head"
        self._waiter = asyncio.get_running_loop().create_future()
        self.last_activity = time.monotonic()
        self._queued = 0
        return self._waiter

    async def send(self, head: bytes, body: memoryview | None, throttle: Throttle | None) -> bool:
        """Send the request; False if its exchange ended (an early answer, a failure) before all of it went.

        The head goes out with the body's first bytes in one write: alone, it would cost a send and a TCP
        segment of its own (obstore and the SDK send a small request in one write too). A body over one
        SLICE goes in slices: each waits for the bandwidth cap's tokens and for the transport to drain below
        its high-water mark, so the kernel's buffers, not asyncio's, hold what is in flight (a write the socket
        cannot take at once is copied into the transport's buffer: slices keep that copy small)."""
        assert self.transport is not None
        if body is None or (body.nbytes <= SLICE and throttle is None):
            self.transport.write(b"".join((head, body)) if body is not None else head)
            if body is not None and self.on_wire is not None:
                self.on_wire(body.nbytes)
            return True
        self.sending = True
        try:
            for start in range(0, body.nbytes, SLICE):
                piece = body[start:start + SLICE]
                if throttle is not None:
                    self.holding = True
                    try:
                        await throttle(piece.nbytes)
                    finally:
                        self.holding = False
                        self.last_activity = time.monotonic()
                while self._paused and self._waiter is not None:
                    self._drain = asyncio.get_running_loop().create_future()
                    await self._drain
                if self._waiter is None or self.closed:  # answered early, or failed: stop sending
                    return False
                self.transport.write(b"".join((head, piece)) if start == 0 else piece)
                if self.on_wire is not None:
                    self.on_wire(piece.nbytes)
                if not self._paused:
                    self.last_activity = time.monotonic()
            return True
        finally:
            self.sending = False

    @property
    def received_any(self) -> bool:
        return self._received_any

    async def paid(self) -> None:
        """Wait until the bandwidth cap let every byte received so far through."""
        if self._paying is not None:
            await asyncio.wait([self._paying])  # never raises the settling task's own cancellation

    def _feed(self, data: memoryview | bytearray | bytes) -> None:
        if self._state == "head":
            self._pending += data
            self._parse_head()
        elif self._state == "length":
            self._collect(data)
            if len(self._body) >= self._want:
                del self._body[self._want:]
                self._complete()
        elif self._state == "chunked":
            self._pending += data
            self._parse_chunks()
        elif self._state == "eof":
            self._collect(data)

    def _collect(self, data: memoryview | bytearray | bytes) -> None:
        self._body += data
        if len(self._body) > _MAX_COLLECTED:
            self._fail(RawHttpError("response body too large"))

    def _parse_head(self) -> None:
        end = self._pending.find(b"\r\n\r\n")
        if end < 0:
            if len(self._pending) > _MAX_HEAD:
                self._fail(RawHttpError("response head too large"))
            return
        lines = bytes(self._pending[:end]).decode("latin-1").split("\r\n")
        rest = bytes(self._pending[end + 4:])
        self._pending = bytearray()
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            self._fail(RawHttpError(f"malformed status line {lines[0][:80]!r}"))
            return
        self._status = int(parts[1])
        self._headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                key = name.strip().lower()
                value = value.strip()
                self._headers[key] = f"{self._headers[key]}, {value}" if key in self._headers else value
        if 100 <= self._status < 200:  # an interim answer: the real head follows
            if rest:
                self._feed(rest)
            return
        if parts[0] == "HTTP/1.0" and "keep-alive" not in self._headers.get("connection", "").lower():
            self._headers["connection"] = "close"
        length_text = self._headers.get("content-length", "")
        chunked = "chunked" in self._headers.get("transfer-encoding", "").lower()
        if self._method == "HEAD" or self._status in (204, 304):
            self._complete()
        elif 200 <= self._status < 300 and self._sink is not None:
            if chunked or not length_text.isdigit():
                self._fail(RawHttpError("a ranged read answered without a Content-Length"))
                return
            length = int(length_text)
            if length > len(self._sink):
                self._fail(RawHttpError(f"body of {length} bytes does not fit the {len(self._sink)}-byte range"))
                return
            self._state = "sink"
            self._want = length
            take = min(len(rest), length)
            self._sink[:take] = rest[:take]
            self._pos = take
            if self._pos == self._want:
                self._complete()
        elif chunked:
            self._state = "chunked"
            self._feed(rest)
        elif length_text.isdigit():
            self._state = "length"
            self._want = int(length_text)
            self._feed(rest)
            if self._state == "length" and self._want == 0:
                self._complete()
        else:  # no framing: the body runs until the server closes
            self._state = "eof"
            self._feed(rest)

    def _parse_chunks(self) -> None:
        buf = self._pending
        while self._state == "chunked":
            if self._chunk_left > 0:
                take = min(self._chunk_left, len(buf))
                if not take:
                    return
                self._collect(buf[:take])
                del buf[:take]
                self._chunk_left -= take
                if self._chunk_left:
                    return
                self._chunk_left = -1
            if self._chunk_left == -1:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    self._fail(RawHttpError("malformed chunked body"))
                    return
                del buf[:2]
                self._chunk_left = 0
            newline = buf.find(b"\r\n")
            if newline < 0:
                if len(buf) > _MAX_HEAD:
                    self._fail(RawHttpError("malformed chunked body"))
                return
            line = bytes(buf[:newline])
            del buf[:newline + 2]
            if self._chunk_left == -2:  # trailers end with an empty line
                if not line:
                    self._complete()
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self._fail(RawHttpError("malformed chunk size"))
                return
            self._chunk_left = size if size else -2

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
        self._wake()
        waiter = self._waiter
        length = self._pos if self._state == "sink" else len(self._body)
        response = RawResponse(self._status, dict(self._headers), length, bytes(self._body))
        self._state = "idle"
        self._sink = None
        self._waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def _fail(self, exc: Exception) -> None:
        self._wake()
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


class RawClient:
    """A small pool of keep-alive connections to one host."""

    def __init__(self, scheme: str, netloc: str, *, connect_timeout: float, stall_timeout: float,
                 throttle: Throttle | None = None, max_idle: int = 64,
                 on_wire: Callable[[int], None] | None = None) -> None:
        host, _, port = netloc.rpartition(":") if netloc.rsplit(":", 1)[-1].isdigit() else (netloc, "", "")
        self.host = host.strip("[]")
        self.port = int(port) if port else (443 if scheme == "https" else 80)
        self.netloc = netloc
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if scheme == "https" else None
        self.connect_timeout = connect_timeout
        self.stall_timeout = stall_timeout
        self.throttle = throttle
        self.on_wire = on_wire
        self.max_idle = max_idle
        self._idle: list[_Protocol] = []

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(_Protocol, self.host, self.port, ssl=self.ssl,
                                       server_hostname=self.host if self.ssl else None),
                self.connect_timeout)
        except (OSError, TimeoutError) as exc:
            raise RawHttpError(f"cannot connect to {self.netloc}: {type(exc).__name__}: {exc}") from exc
        return protocol

    async def request(self, method: str, target: str, headers: Mapping[str, str],
                      sink: memoryview | None = None, body: Buffer | None = None) -> RawResponse:
        """Send `method target` (path and query) with `body` if given (its Content-Length among `headers`); a
        2xx answer's body goes into `sink` if given, else it is collected. The bandwidth cap paces a GET's
        answer and any request's body. One retry on a fresh connection when a kept-alive one turns out closed
        before answering (servers drop idle connections); every other failure is the caller's to retry."""
        head = (f"{method} {target} HTTP/1.1\r\nHost: {self.netloc}\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode("latin-1")
        view = None if body is None else memoryview(body).cast("B")
        for attempt in range(2):
            while self._idle and self._idle[-1].closed:
                self._idle.pop()
            reused = bool(self._idle)
            protocol = self._idle.pop() if reused else await self._connect()
            try:
                response = await self._exchange(protocol, method, head, view, sink)
            except RawHttpError as exc:
                # Only a kept-alive connection the server had dropped meanwhile; a stall is the caller's to retry.
                if reused and exc.closed_by_peer and not protocol.received_any and attempt == 0:
                    continue
                raise
            except BaseException:
                protocol.abort("request cancelled")
                raise
            if (protocol.closed or response.headers.get("connection", "").lower() == "close"
                    or len(self._idle) >= self.max_idle):
                protocol.abort("not reused")
            else:
                self._idle.append(protocol)
            return response
        raise AssertionError("unreachable")

    async def _exchange(self, protocol: _Protocol, method: str, head: bytes, body: memoryview | None,
                        sink: memoryview | None) -> RawResponse:
        if protocol.closed:
            raise RawHttpError("connection closed", closed_by_peer=True)
        waiter = protocol.request(method, sink, self.throttle if method == "GET" else None)
        protocol.on_wire = self.on_wire
        loop = asyncio.get_running_loop()

        tick = min(1.0, max(0.05, self.stall_timeout / 4))

        def watchdog() -> None:
            # A stall, not a slow transfer, is what ends a request: the clock restarts with every byte the peer
            # takes (a write, a shrinking send queue) or sends, and stands still while the bandwidth cap holds
            # a slice of the body back.
            if waiter.done():
                return
            now = time.monotonic()
            if protocol.moved() or protocol.holding:
                protocol.last_activity = now
            if now - protocol.last_activity < self.stall_timeout:
                handle[0] = loop.call_later(tick, watchdog)
            elif protocol.sending or protocol.queued:
                protocol.abort(f"no progress sending the body for {self.stall_timeout:g}s (the other end stopped "
                               "reading; --stall-timeout)")
            else:
                protocol.abort(f"no data for {self.stall_timeout:g}s (--stall-timeout)")

        handle = [loop.call_later(tick, watchdog)]
        try:
            sent = await protocol.send(head, body, self.throttle if body is not None else None)
            response = await waiter
        finally:
            handle[0].cancel()
        if not sent:  # answered before the whole body went: the connection is out of step, never reuse it
            protocol.abort("answered before the request body was sent")
        await protocol.paid()  # a body read in one go still takes its time under --cap-mbps
        return response

    def close(self) -> None:
        for protocol in self._idle:
            protocol.abort("client closed")
        self._idle.clear()
