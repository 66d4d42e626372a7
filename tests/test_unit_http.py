"""The HTTP client (aiohttp underneath) on awkward answers and awkward peers: split chunked framing, interim
100s, close-delimited bodies, stale keep-alive connections, stalls on either side, bodies that do not fit,
answers that come before the request body went, and the bandwidth cap on a body. A scripted loopback server plays
each part."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable

import pytest

from blobsync.backends.http import SLICE, HttpClient, HttpError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def _run(handler: Handler, client_call: Callable[[HttpClient], Awaitable[object]], *,
         stall_timeout: float = 5.0, throttle: Callable[[int], Awaitable[None]] | None = None) -> object:
    async def scenario() -> object:
        # A small receive buffer (inherited by accepted sockets), so that a server that reads slowly or not at
        # all holds a large request body back within a few MiB rather than the kernel taking all of it.
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        server = await asyncio.start_server(handler, sock=listener)
        port = server.sockets[0].getsockname()[1]
        client = HttpClient("http", f"127.0.0.1:{port}", connect_timeout=5, stall_timeout=stall_timeout,
                            throttle=throttle, env={})
        try:
            return await client_call(client)
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    return asyncio.run(scenario())


async def _write_slowly(writer: asyncio.StreamWriter, data: bytes, step: int) -> None:
    for i in range(0, len(data), step):
        writer.write(data[i:i + step])
        await writer.drain()
        await asyncio.sleep(0.001)


def test_chunked_body_split_at_every_awkward_place() -> None:
    body = b"<EnumerationResults>" + b"x" * 500 + b"</EnumerationResults>"
    framed = b"".join(f"{len(part):x};ext=1\r\n".encode() + part + b"\r\n"
                      for part in (body[:7], body[7:400], body[400:])) + b"0\r\nX-Trailer: y\r\n\r\n"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):  # two requests on one kept-alive connection
            await _read_request(reader)
            await _write_slowly(writer, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + framed, step=3)
        writer.close()

    async def call(client: HttpClient) -> list[bytes]:
        first = await client.request("GET", "/list", {})
        second = await client.request("GET", "/list", {})
        return [first.body, second.body]

    assert _run(handler, call) == [body, body]


def test_interim_100_then_content_length_and_http10_close() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n"
                     b"x-ms-error-code: BlobNotFound\r\n\r\nnope!")
        await writer.drain()
        await _read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    async def call(client: HttpClient) -> tuple[object, ...]:
        missing = await client.request("GET", "/a", {})
        until_eof = await client.request("GET", "/b", {})
        return missing.status, missing.headers["x-ms-error-code"], missing.body, until_eof.body

    assert _run(handler, call) == (404, "BlobNotFound", b"nope!", b"until the end")


def test_ranged_read_lands_in_the_sink_and_head_has_no_body() -> None:
    payload = bytes(range(256)) * 64

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await _write_slowly(writer, b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n\r\n" % len(payload)
                            + payload, step=1000)
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 123456\r\nETag: \"e\"\r\n\r\n")  # HEAD: no body follows
        await writer.drain()
        await reader.read()

    async def call(client: HttpClient) -> tuple[object, ...]:
        sink = bytearray(len(payload))
        got = await client.request("GET", "/r", {}, memoryview(sink))
        head = await client.request("HEAD", "/r", {})
        return got.status, got.body_length, bytes(sink) == payload, head.headers["etag"], head.body

    assert _run(handler, call) == (206, len(payload), True, '"e"', b"")


def test_a_stale_kept_alive_connection_is_retried_once_on_a_fresh_one() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # drops the connection right after answering, as servers do with idle ones

    async def call(client: HttpClient) -> list[bytes]:
        first = await client.request("GET", "/", {})
        await asyncio.sleep(0.05)
        second = await client.request("GET", "/", {})
        return [first.body, second.body]

    assert _run(handler, call) == [b"ok", b"ok"]
    assert connections == 2


def test_stall_aborts_but_a_slow_moving_body_does_not() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
        for _ in range(6):  # 0.6 s in all, never 0.3 s without a byte
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)  # then silence

    async def call(client: HttpClient) -> None:
        await client.request("GET", "/", {})

    started = time.monotonic()
    with pytest.raises(HttpError, match=r"no data for 0\.3s"):
        _run(handler, call, stall_timeout=0.3)
    assert time.monotonic() - started >= 0.8  # the moving body (0.6 s) was not cut; the silence was


def test_a_body_larger_than_the_range_is_refused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 206 Partial Content\r\nContent-Length: 100\r\n\r\n" + b"y" * 100)
        await writer.drain()
        await reader.read()

    async def call(client: HttpClient) -> None:
        await client.request("GET", "/", {}, memoryview(bytearray(10)))

    with pytest.raises(HttpError, match="does not fit"):
        _run(handler, call)


BIG = 16 * 1024 * 1024 + 5  # far more than the socket buffers between client and server hold


async def _read_body(reader: asyncio.StreamReader, size: int, step: int, pause: float) -> bytes:
    got = bytearray()
    while len(got) < size:
        got += await reader.readexactly(min(step, size - len(got)))
        await asyncio.sleep(pause)
    return bytes(got)


def test_a_large_body_read_slowly_but_steadily_is_not_a_stall() -> None:
    body = bytes(range(251)) * (BIG // 251) + b"end"
    received: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        received.append(await _read_body(reader, len(body), 512 * 1024, 0.04))  # ~1.3 s in all, never 0.3 idle
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def call(client: HttpClient) -> int:
        return (await client.request("PUT", "/b", {"Content-Length": str(len(body))}, body=body)).status

    started = time.monotonic()
    assert _run(handler, call, stall_timeout=0.3) == 201
    assert received == [body] and time.monotonic() - started >= 0.6


def test_a_large_body_the_peer_stops_reading_is_cut_off() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await reader.readexactly(1024 * 1024)
        await asyncio.sleep(5)  # then reads nothing more

    async def call(client: HttpClient) -> None:
        await client.request("PUT", "/b", {"Content-Length": str(BIG)}, body=bytes(BIG))

    started = time.monotonic()
    with pytest.raises(HttpError, match=r"no progress sending the body for 0\.3s"):
        _run(handler, call, stall_timeout=0.3)
    assert time.monotonic() - started < 3


def test_the_bandwidth_cap_holding_a_body_back_is_not_a_stall() -> None:
    paid: list[int] = []

    async def throttle(n: int) -> None:
        paid.append(n)
        await asyncio.sleep(0.5)  # longer than the stall timeout, every slice

    body = b"z" * (SLICE + 7)
    received: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        received.append(await reader.readexactly(len(body)))
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def call(client: HttpClient) -> int:
        return (await client.request("PUT", "/b", {"Content-Length": str(len(body))}, body=body)).status

    assert _run(handler, call, stall_timeout=0.3, throttle=throttle) == 201
    assert received == [body] and paid == [SLICE, 7]


def test_an_answer_before_the_body_is_sent_is_returned_and_the_connection_dropped() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        head = await _read_request(reader)
        if head.startswith(b"PUT"):  # refuses at once and reads none of the body
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 4\r\nx-ms-error-code: AuthorizationFailure"
                         b"\r\n\r\nnope")
            await writer.drain()
            await asyncio.sleep(3)
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.read()

    async def call(client: HttpClient) -> tuple[object, ...]:
        refused = await client.request("PUT", "/b", {"Content-Length": str(BIG)}, body=bytes(BIG))
        after = await client.request("GET", "/", {})  # must not go down the half-sent connection
        return refused.status, refused.body, after.body

    assert _run(handler, call, stall_timeout=2) == (403, b"nope", b"ok")
    assert connections == 2


def test_a_stall_on_a_kept_alive_connection_is_not_retried_behind_the_callers_back() -> None:
    # Only a connection the server dropped while idle earns the silent second try; a stall is the retry
    # policy's to count, back off from and report.
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await _read_request(reader)
        await asyncio.sleep(2)  # the second request on this connection never gets an answer

    async def call(client: HttpClient) -> None:
        await client.request("GET", "/", {})
        await client.request("GET", "/", {})

    with pytest.raises(HttpError, match=r"no data for 0\.3s"):
        _run(handler, call, stall_timeout=0.3)
    assert connections == 1


def test_a_connection_attempt_nobody_answers_says_what_to_try() -> None:
    import aiohttp

    from blobsync.backends.http import _mapped

    err = _mapped(aiohttp.ConnectionTimeoutError("Connection timeout to host"), "acct.blob.core.windows.net", None)
    assert "cannot connect to acct.blob.core.windows.net" in str(err) and "HTTPS_PROXY" in str(err)
    via = _mapped(aiohttp.ConnectionTimeoutError("x"), "acct.blob.core.windows.net", "http://u:pw@proxy:3128")
    assert "through the proxy http://u@proxy:3128" in str(via) and "pw" not in str(via)


def test_a_finished_request_leaves_nothing_for_the_collector() -> None:
    """A request's task (and with it the answer's body, a listing page of MiBs) is freed when its last reference
    goes, not at the collector's next full pass: a sync of 10^6 blobs peaked at 900 MiB with such a cycle."""
    import gc
    import weakref

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        writer.close()

    async def call(client: HttpClient) -> bool:
        task = asyncio.ensure_future(client.request("GET", "/x", {}))
        assert (await task).body == b"hello"
        ref = weakref.ref(task)
        del task
        await asyncio.sleep(0)  # the loop's handle that woke this task up holds the request's task until then
        return ref() is None

    gc.disable()
    try:
        assert _run(handler, call)
    finally:
        gc.enable()
