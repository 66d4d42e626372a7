"""A storage look-alike on a real listening socket that keeps every request it is sent: the host a test names as a
destination that must never see a credential meant for another host."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def outside_address() -> str | None:
    """This machine's address on its way out, not loopback (no packet is sent: a UDP connect picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.250", 9))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else str(address)


@dataclass(frozen=True)
class Seen:
    method: str
    target: str  # path and query as sent
    headers: dict[str, str]

    def text(self) -> str:
        return f"{self.method} {self.target}\n" + "\n".join(f"{k}: {v}" for k, v in self.headers.items())


class Recorder:
    """Answers like a blob service that holds nothing (HEAD/GET 404) and takes every write (a copy succeeds at
    once): a tool that would hand it a secret does so, and one that exits 0 here claims a success it cannot check."""

    def __init__(self, host: str) -> None:
        self.seen: list[Seen] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                recorder.seen.append(Seen(self.command, self.path, dict(self.headers.items())))
                if self.command in ("HEAD", "GET"):
                    self.send_response(404)
                    self.send_header("x-ms-error-code", "BlobNotFound")
                elif "x-ms-copy-source" in {k.lower() for k in self.headers}:
                    self.send_response(202)
                    self.send_header("x-ms-copy-status", "success")
                    self.send_header("ETag", '"0x1"')
                else:
                    self.send_response(201)
                    self.send_header("ETag", '"0x1"')
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_HEAD = do_GET = do_PUT = do_POST = do_DELETE = _answer

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.host = host
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}/{path}"

    def everything(self) -> str:
        return "\n".join(s.text() for s in self.seen)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


def recording(host: str) -> Iterator[Recorder]:
    recorder = Recorder(host)
    try:
        yield recorder
    finally:
        recorder.close()
