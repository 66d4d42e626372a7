"""The HTTP client of every request, on aiohttp: proxies, TLS, the bandwidth cap and one stall watch.

Proxies come from the environment as users expect (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY, any case,
user:pass@ for Basic proxy auth, CONNECT for https), or from `proxy` (--proxy), which overrides them. TLS trusts
the system store, SSL_CERT_FILE/SSL_CERT_DIR (OpenSSL reads them) and REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE (what
Azure CLI and requests users set). A request body leaves from the caller's buffer in slices paced by the bandwidth
cap; a ranged GET's body is copied once, from aiohttp's chunks into the caller's buffer. A stall, not a slow
transfer, ends a request: the clock restarts with every slice taken and every chunk read, and stands still while
the cap holds a slice back.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blobsync.backends.base import Buffer, Pieces
from blobsync.backends.trust_store import import_aiohttp
from blobsync.local.platform import features
from blobsync.redact import redact, register_secret

if TYPE_CHECKING:
    import aiohttp

Throttle = Callable[[int], Awaitable[None]]
Accept = Callable[[int, Mapping[str, str]], None]  # a 2xx answer's status and headers, before its body

SLICE = 256 * 1024  # a body larger than this goes out this much at a time (paced by the cap and the transport)
WHOLE_SLICE = 2 * 1024 * 1024  # the same with no cap to pace: fewer writes and drains per block
_MAX_COLLECTED = 256 * 1024 * 1024  # a listing page is a few MiB; anything far bigger is not for us


class HttpError(Exception):
    """A transport-level failure: refused, reset, closed early, stalled, malformed, or refused by TLS or a proxy.

    `kind` says which a caller must treat apart: "tls" (a certificate problem: retrying cannot help),
    "proxy-auth" (the proxy wants other credentials), "proxy" (the proxy cannot be reached), "" otherwise."""

    def __init__(self, message: str, *, kind: str = "") -> None:
        super().__init__(redact(message))
        self.kind = kind


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body_length: int  # bytes of body received (into the sink, or collected)
    body: bytes  # the collected body when there was no sink (or the answer was not 2xx)


def ssl_context(env: Mapping[str, str]) -> ssl.SSLContext:
    """The system's trust store (with SSL_CERT_FILE/SSL_CERT_DIR), plus a CA bundle named by the environment."""
    context = ssl.create_default_context()
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        bundle = env.get(name)
        if bundle:
            try:
                context.load_verify_locations(cafile=bundle)
            except (OSError, ssl.SSLError) as exc:
                raise HttpError(f"cannot load the CA bundle {bundle!r} named by {name}: {exc}", kind="tls") from exc
    return context


class _Watch:
    """When a request last moved, and whether it is the cap (not the peer) holding it back."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.holding = False
        self.sending = True  # the body is still going out
        self.stalled = ""
        self.fd = -1  # the socket the body goes out on: its send queue shrinking is progress too
        self.queued = 0  # bytes in the send queue at the last look

    def touch(self) -> None:
        self.last = time.monotonic()

    def moved(self) -> bool:
        """Whether the peer took bytes from the kernel's send queue since the last look (after the last write,
        a body still drains from the socket buffer: a few MiB on a slow link, not a stall)."""
        if self.fd < 0:
            return False
        try:
            queued = _unsent(self.fd)
        except OSError:
            self.fd = -1
            return False
        moved = queued < self.queued
        self.queued = queued
        return moved


class _Watchdog:
    """Cancels a request's task once it has made no progress for `stall_timeout` seconds, as asyncio.timeout does
    (the exchange runs in the caller's task, no task of its own). A class, not a closure that re-arms itself: such
    a closure is a reference cycle through the task, and each one kept a listing page's body (the task's result)
    until the collector's next full pass: 130 MiB per 200,000 blobs listed."""

    def __init__(self, watch: _Watch, task: asyncio.Task[Any], stall_timeout: float, sends_body: bool) -> None:
        self.watch, self.task, self.stall_timeout, self.sends_body = watch, task, stall_timeout, sends_body
        self.loop = asyncio.get_running_loop()
        self.tick = min(1.0, max(0.05, stall_timeout / 4))
        self.handle = self.loop.call_later(self.tick, self.fire)

    def fire(self) -> None:
        watch, now = self.watch, time.monotonic()
        if watch.holding or watch.moved():
            watch.last = now
        if now - watch.last < self.stall_timeout:
            self.handle = self.loop.call_later(self.tick, self.fire)
            return
        watch.stalled = (f"no progress sending the body for {self.stall_timeout:g}s (the other end stopped "
                         "reading; --stall-timeout)" if self.sends_body and (watch.sending or watch.queued)
                         else f"no data for {self.stall_timeout:g}s (--stall-timeout)")
        self.task.cancel()

    def disarm(self) -> None:
        self.handle.cancel()  # a cancelled handle drops its callback: nothing keeps this object alive after


def _unsent(fd: int) -> int:
    """Bytes the kernel holds in a socket's send queue (not yet taken by the peer); OSError where it cannot say."""
    if not features().send_queue:
        raise OSError("no send queue size on this platform")  # the stall watch then goes by write progress alone
    import fcntl
    import termios

    return int(struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0])


def _body_payload(view: memoryview, client: HttpClient, watch: _Watch) -> Any:
    """A request body that leaves from `view` in slices, each paced by the cap and taken by the transport before
    the next (aiohttp's writer drains between writes): a peer that stops reading stops the slices."""
    from aiohttp.abc import AbstractStreamWriter
    from aiohttp.payload import Payload

    class Body(Payload):
        def __init__(self) -> None:
            super().__init__(view, content_type=None)
            self._size = view.nbytes

        def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
            return bytes(view).decode(encoding, errors)

        async def write(self, writer: AbstractStreamWriter) -> None:
            await self.write_with_length(writer, None)

        async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
            transport = getattr(writer, "transport", None)
            sock = transport.get_extra_info("socket") if transport is not None else None
            watch.fd = sock.fileno() if sock is not None else -1
            end = view.nbytes if content_length is None else min(view.nbytes, content_length)
            step = SLICE if client.throttle is not None else WHOLE_SLICE
            for start in range(0, end, step):
                piece = view[start:min(end, start + step)]
                if client.throttle is not None:
                    watch.holding = True
                    try:
                        await client.throttle(piece.nbytes)
                    finally:
                        watch.holding = False
                watch.touch()
                await writer.write(piece)
                if client.on_wire is not None:
                    client.on_wire(piece.nbytes)
            watch.touch()
            watch.sending = False

    return Body()


class HttpClient:
    """Keep-alive connections to one endpoint (one aiohttp session, made on the first request)."""

    def __init__(self, scheme: str, netloc: str, *, connect_timeout: float, stall_timeout: float,
                 throttle: Throttle | None = None, on_wire: Callable[[int], None] | None = None,
                 proxy: str | None = None, env: Mapping[str, str] | None = None, connections: int = 0) -> None:
        self.base = f"{scheme}://{netloc}"
        self.netloc = netloc
        self.https = scheme == "https"
        self.connect_timeout = connect_timeout
        self.stall_timeout = stall_timeout
        self.throttle = throttle
        self.on_wire = on_wire
        self.proxy = proxy or None
        self.env = os.environ if env is None else env
        self.connections = connections  # at most this many connections (0: no limit; the request limit bounds them)
        self._session: aiohttp.ClientSession | None = None
        self._proxy: Any = self.proxy  # a yarl URL or str, or None
        self._proxy_auth: Any = None

    def _open(self) -> aiohttp.ClientSession:
        aiohttp = import_aiohttp()
        connector = aiohttp.TCPConnector(limit=self.connections, ssl=ssl_context(self.env) if self.https else False,
                                         enable_cleanup_closed=True)
        # The environment's proxy (and its credentials, from the URL or ~/.netrc; NO_PROXY honoured) is looked up
        # once, as aiohttp's trust_env would: trust_env itself does it again for every request, in a worker
        # thread (2,000 small uploads: 1.1 -> 2.3 s of CPU). All endpoint requests go to one host.
        if self.proxy is None:
            self._proxy, self._proxy_auth = _env_proxy_and_auth(self.base + "/")
        for secret in (getattr(self._proxy_auth, "password", None), _password_of(self._proxy)):
            if secret:
                register_secret(secret)
        # No automatic headers: Content-Type in particular is part of the Shared Key signature.
        # No cookie jar: the service sets none, and filtering an empty jar costs ~10 µs a request.
        self._session = aiohttp.ClientSession(
            connector=connector, trust_env=False, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, connect=None, sock_connect=self.connect_timeout),
            read_bufsize=2 * 1024 * 1024,
        )
        return self._session

    async def request(self, method: str, target: str, headers: Mapping[str, str],
                      sink: memoryview | Pieces | None = None, body: Buffer | None = None,
                      accept: Accept | None = None) -> Response:
        """Send `method target` (path and query) with `body` if given (its Content-Length among `headers`); a
        2xx answer's body goes into `sink` if given (one buffer, or consecutive pieces), else it is collected,
        after `accept(status, headers)` (if given) has found the answer to be the one asked for (it raises if
        not: pieces are handed on as they fill, so a wrong answer must be refused before its first byte).
        Every other failure is an HttpError."""
        watch = _Watch()
        task = asyncio.current_task()
        assert task is not None
        dog = _Watchdog(watch, task, self.stall_timeout, body is not None)
        try:
            return await self._exchange(method, target, headers, sink, body, watch, accept)
        except asyncio.CancelledError:
            # Ours alone (no other cancel pending): the stall, as an HttpError. A cancel from outside stays one.
            if watch.stalled and task.uncancel() == 0:
                raise HttpError(watch.stalled) from None
            raise
        finally:
            dog.disarm()

    async def _exchange(self, method: str, target: str, headers: Mapping[str, str],
                        sink: memoryview | Pieces | None, body: Buffer | None, watch: _Watch,
                        accept: Accept | None) -> Response:
        session = self._session or self._open()  # loads aiohttp, the first time
        import aiohttp
        from yarl import URL

        data = self._payload(body, watch) if body is not None else None
        # aiohttp's exceptions carry the request URL, SAS and all: none is chained to what we raise (raised after
        # the except block, so not even as __context__).
        error: HttpError
        try:
            async with session.request(method, URL(self.base + target, encoded=True), headers=dict(headers),
                                       data=data, proxy=self._proxy, proxy_auth=self._proxy_auth,
                                       allow_redirects=False) as resp:
                watch.sending = False
                watch.touch()
                answer = {k.lower(): v for k, v in resp.headers.items()}
                if accept is not None and 200 <= resp.status < 300:
                    accept(resp.status, answer)
                if sink is not None and 200 <= resp.status < 300:
                    got = await (self._into(resp, sink, watch) if isinstance(sink, memoryview)
                                 else self._into_pieces(resp, sink, watch))
                    return Response(resp.status, answer, got, b"")
                collected = await self._collect(resp, watch)
                return Response(resp.status, answer, len(collected), collected)
        except HttpError:
            raise
        except aiohttp.ClientError as exc:
            error = _mapped(exc, self.netloc, str(self._proxy) if self._proxy is not None else None)
        except (OSError, ValueError) as exc:  # a malformed header aiohttp refused to send, a socket error
            error = HttpError(f"{type(exc).__name__}: {exc}")
        raise error

    def _payload(self, body: Buffer, watch: _Watch) -> Any:
        view = memoryview(body).cast("B")
        if view.nbytes <= SLICE and self.throttle is None:
            watch.sending = False  # handed over whole, in one write
            if self.on_wire is not None:
                self.on_wire(view.nbytes)
            return view
        return _body_payload(view, self, watch)

    async def _into(self, resp: aiohttp.ClientResponse, sink: memoryview, watch: _Watch) -> int:
        pos = 0
        # readchunk hands over aiohttp's buffered pieces one by one; readany would first join them (a copy more).
        async for chunk, _ in resp.content.iter_chunks():
            n = len(chunk)
            if not n:
                continue
            if pos + n > sink.nbytes:
                raise HttpError(f"the response body does not fit the {sink.nbytes}-byte range asked for")
            sink[pos:pos + n] = chunk
            pos += n
            await self._took(n, watch)
        return pos

    async def _into_pieces(self, resp: aiohttp.ClientResponse, pieces: Pieces, watch: _Watch) -> int:
        got, view, pos = 0, None, 0
        async for chunk, _ in resp.content.iter_chunks():
            data, at = memoryview(chunk), 0
            while at < len(data):
                if view is None:
                    watch.holding = True  # waiting for memory is not a stall of the other end
                    try:
                        view, pos = await pieces.next(), 0
                    finally:
                        watch.holding = False
                    if view is None:
                        raise HttpError("the response body is longer than the range asked for")
                n = min(len(data) - at, len(view) - pos)
                view[pos:pos + n] = data[at:at + n]
                pos, at = pos + n, at + n
                if pos == len(view):
                    pieces.full(view)
                    view = None
            got += len(data)
            await self._took(len(data), watch)
        return got

    async def _took(self, n: int, watch: _Watch) -> None:
        """`n` bytes of a body arrived: the stall clock restarts, the wire counts them, the cap may hold on."""
        watch.touch()
        if self.on_wire is not None:
            self.on_wire(n)
        if self.throttle is not None:
            watch.holding = True
            try:
                await self.throttle(n)
            finally:
                watch.holding = False

    async def _collect(self, resp: aiohttp.ClientResponse, watch: _Watch) -> bytes:
        parts = []
        size = 0
        async for chunk in resp.content.iter_any():
            size += len(chunk)
            if size > _MAX_COLLECTED:
                raise HttpError(f"an answer of over {_MAX_COLLECTED // (1024 * 1024)} MiB was not expected here")
            parts.append(chunk)
            watch.touch()
        return b"".join(parts)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _mapped(exc: Exception, netloc: str, proxy: str | None) -> HttpError:
    """aiohttp's exceptions as one HttpError each, with a line a user can act on (never a proxy's password)."""
    import aiohttp

    shown_proxy = f"the proxy {_without_password(proxy)}" if proxy else "the proxy"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return HttpError(f"the TLS certificate of {netloc} is not trusted: {exc.certificate_error}; if a proxy or "
                         "a private CA signs it, point SSL_CERT_FILE or REQUESTS_CA_BUNDLE at its CA", kind="tls")
    if isinstance(exc, aiohttp.ClientSSLError):
        return HttpError(f"TLS with {netloc} failed: {exc}", kind="tls")
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        if exc.status == 407:
            return HttpError(f"{shown_proxy} refused the proxy credentials (HTTP 407): check user:password in "
                             "the proxy URL", kind="proxy-auth")
        return HttpError(f"{shown_proxy} refused to connect to {netloc}: HTTP {exc.status} {exc.message}",
                         kind="proxy")
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        via = f" through {shown_proxy}" if proxy else ""
        hint = "" if proxy else "; if the only way out is a proxy, set HTTPS_PROXY or pass --proxy"
        return HttpError(f"cannot connect to {netloc}{via}: no answer to the connection attempt (a firewall may "
                         f"drop the traffic){hint}")
    if isinstance(exc, aiohttp.ClientProxyConnectionError):
        return HttpError(f"cannot reach {shown_proxy}: {exc.os_error}", kind="proxy")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return HttpError(f"cannot connect to {netloc}: {exc.os_error}")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return HttpError(f"{netloc} closed the connection before answering")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return HttpError(f"the answer's body broke off: {exc}")
    if isinstance(exc, aiohttp.ClientResponseError):  # aiohttp's parser refused the answer
        return HttpError(f"a malformed answer from {netloc}: {redact(exc.message)}")
    return HttpError(f"{type(exc).__name__}: {redact(str(exc))}")


def proxy_for(url: str, proxy: str | None, env: Mapping[str, str]) -> tuple[str | None, str]:
    """The proxy a request to `url` takes (password hidden) and where that choice comes from, for `doctor`."""
    if proxy:
        return _without_password(proxy), "--proxy"
    names = [n for n in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
             if env.get(n)]
    chosen = _env_proxy(url)
    if chosen is None:
        bypass = " (NO_PROXY names it)" if names else ""
        return None, bypass
    return _without_password(chosen), ", ".join(names) or "the environment"


def _env_proxy_and_auth(url: str) -> tuple[Any, Any]:
    """The proxy the process environment names for `url` and its Basic credentials, as aiohttp's trust_env finds
    them (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY in either case, NO_PROXY; credentials from the URL or ~/.netrc)."""
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        return get_env_proxy_for_url(URL(url, encoded=True))
    except LookupError:
        return None, None


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for `url`, for messages."""
    proxy, _ = _env_proxy_and_auth(url)
    return str(proxy) if proxy is not None else None


def _password_of(url: Any) -> str | None:
    from yarl import URL

    try:
        return URL(str(url)).password if url is not None else None
    except ValueError:
        return None


def _without_password(url: str) -> str:
    from yarl import URL

    try:
        parsed = URL(url)
    except ValueError:
        return "the proxy"
    return str(parsed.with_password(None)) if parsed.password else str(parsed)
