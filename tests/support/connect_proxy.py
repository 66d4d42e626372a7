"""A small HTTP CONNECT proxy on 127.0.0.1 that can require Basic auth and counts the tunnels it opened."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
from types import TracebackType


class ConnectProxy:
    """Tunnels CONNECT host:port (nothing else: plain-HTTP proxying gets 501), in a thread of its own."""

    def __init__(self, user: str | None = None, password: str | None = None,
                 routes: dict[str, tuple[str, int]] | None = None) -> None:
        # "host:port" -> where its tunnel really goes (a public name served by a local emulator; nothing leaves)
        self.routes = routes or {}
        self.credentials = f"{user}:{password}" if user is not None else None
        self.tunnels = 0
        self.refused = 0  # requests answered 407
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        auth = f"{self.credentials}@" if self.credentials else ""
        return f"http://{auth}127.0.0.1:{self.port}"

    def url_with(self, user: str, password: str) -> str:
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    def __enter__(self) -> ConnectProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = head.split("\r\n")
        method, target, _ = [*lines[0].split(" "), "", "", ""][:3]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        if method != "CONNECT":
            writer.write(b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        if self.credentials is not None:
            expected = "Basic " + base64.b64encode(self.credentials.encode()).decode()
            if headers.get("proxy-authorization") != expected:
                self.refused += 1
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic "
                             b"realm=\"test\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                writer.close()
                return
        host, _, port = target.rpartition(":")
        if target in self.routes:
            host, port = self.routes[target][0], str(self.routes[target][1])
        try:
            up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        self.tunnels += 1
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(256 * 1024):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            writer.close()
