"""A TCP relay that adds a fixed delay to every byte in each direction (a delay line) and counts the bytes.

Used two ways:

* slow-link workload: run as a script inside the server's network namespace, between the client's veth and
  Azurite on that namespace's loopback. `tc netem` is not in this kernel, so per-request latency comes from here:
  every request head and every response head waits `delay_ms / 2` on its way, so each request pays `delay_ms`
  of extra round trip, as over a long link. The bandwidth limit is a `tc tbf` qdisc on the veth.
* resume workload: in a thread of the benchmark, without delay, to count the bytes a tool sends to Azurite and to
  kill it once half the file has gone out.

Order is kept (one queue per direction); the queues are bounded, so a slow reader pushes back on the sender.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading


class DelayRelay:
    def __init__(self, listen_host: str, listen_port: int, up_host: str, up_port: int, delay_ms: float) -> None:
        self.listen = (listen_host, listen_port)
        self.up = (up_host, up_port)
        self.one_way = delay_ms / 2000.0
        self.bytes_up = 0  # client -> server, headers included
        self.bytes_down = 0
        self.connections = 0
        self.active = 0  # connections still open (either direction still pumping)
        self.port = listen_port
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=16)
        loop = asyncio.get_running_loop()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)  # the delay line itself
                writer.write(data)
                await writer.drain()
            with contextlib.suppress(OSError):
                if writer.can_write_eof():
                    writer.write_eof()

        sender = asyncio.create_task(send())
        try:
            while data := await reader.read(256 * 1024):
                if up:
                    self.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)
                await queue.put((loop.time() + self.one_way, data))
        except OSError:
            pass
        finally:
            await queue.put((0.0, b""))
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await sender

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.active += 1
        try:
            try:
                s_reader, s_writer = await asyncio.open_connection(*self.up)
            except OSError:
                c_writer.close()
                return
            try:
                await asyncio.gather(self._pump(c_reader, s_writer, True), self._pump(s_reader, c_writer, False))
            finally:
                for w in (c_writer, s_writer):
                    with contextlib.suppress(OSError):
                        w.close()
        finally:
            self.active -= 1

    async def serve(self) -> None:
        self._server = await asyncio.start_server(self._handle, *self.listen, limit=1 << 20)
        self.port = self._server.sockets[0].getsockname()[1]

    # -- in a thread (resume workload) ------------------------------------------------------------
    def start_thread(self) -> DelayRelay:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            loop.run_until_complete(self.serve())
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="bench-relay", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("relay did not start")
        return self

    def stop_thread(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("listen_host")
    p.add_argument("listen_port", type=int)
    p.add_argument("up_host")
    p.add_argument("up_port", type=int)
    p.add_argument("--delay-ms", type=float, default=0.0, help="extra round-trip time per request (default 0)")
    p.add_argument("--lifetime", type=float, default=3600.0, help="exit after this many seconds (default 3600)")
    a = p.parse_args()

    async def run() -> None:
        relay = DelayRelay(a.listen_host, a.listen_port, a.up_host, a.up_port, a.delay_ms)
        await relay.serve()
        print(f"relay ready on {a.listen_host}:{relay.port}", flush=True)
        await asyncio.sleep(a.lifetime)  # bounded: the benchmark kills it long before

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
