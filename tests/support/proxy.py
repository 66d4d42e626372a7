"""A counting, fault-injecting HTTP proxy that sits between code under test and Azurite."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import socket
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import unquote
from xml.sax.saxutils import escape

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

OPS = frozenset(
    {
        "put_block",
        "put_block_from_url",  # Put Block From URL: the service reads the source itself
        "copy_blob",  # Copy Blob (From URL)
        "put_block_list",
        "get_block_list",
        "put_blob",
        "create_container",
        "delete_container",
        "get_properties",
        "set_metadata",
        "set_properties",
        "get_blob",
        "list_blobs",
        "delete_blob",
        "batch",
        "other",
    }
)

# Connection-level headers (RFC 9110 §7.6.1) describe one hop, so they are never relayed. Host is set again to the
# client's (as a reverse proxy passes it on: Azurite reads a copy source as its own only when the source URL's
# host is the Host it was asked under); Expect is answered by the proxy itself. None of them is covered by the
# Shared Key signature, so dropping them keeps Authorization valid.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "expect",
    }
)
# aiohttp would otherwise invent these on the upstream request; Content-Type in particular is part of
# the Shared Key string-to-sign, so adding one the client did not send breaks authentication.
_NO_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


# --------------------------------------------------------------------------------------------------
# Actions
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Respond:
    """Answer with an Azure-style error instead of forwarding."""

    status: int
    error_code: str
    retry_after: float | None = None
    message: str | None = None

    name = "respond"


@dataclass(frozen=True)
class ResetBefore:
    """Abort the client connection (TCP RST) without forwarding or answering."""

    name = "reset_before"


@dataclass(frozen=True)
class ResetAfter:
    """Forward (so the service applies the request), then abort the client connection unanswered."""

    name = "reset_after"


@dataclass(frozen=True)
class ResetMidResponse:
    """Forward, relay status, headers and ``keep`` of the body (a fraction if < 1, else bytes), then close."""

    keep: float = 0.5

    name = "reset_mid_response"


@dataclass(frozen=True)
class StallMidResponse:
    """Forward, relay status, headers and ``keep`` of the body, then send nothing more for ``seconds``
    (None: until ``release_holds()``) and close: a response body that stops making progress."""

    keep: float = 0.5
    seconds: float | None = None

    name = "stall_mid_response"


@dataclass(frozen=True)
class Stall:
    """Wait ``seconds`` (None: until ``release_holds()``) before forwarding."""

    seconds: float | None = None

    name = "stall"


@dataclass(frozen=True)
class StallBody:
    """Read ``after`` bytes of the request body, then stop reading it for ``seconds`` (None: until
    ``release_holds()``), then read the rest and forward. The server stops reading the socket, so the
    client's sends block once the TCP buffers are full: a request-body stall, as from a dead peer."""

    after: int = 0
    seconds: float | None = None

    name = "stall_body"


@dataclass(frozen=True)
class FlipByte:
    """Invert the request-body byte at ``offset`` (default: the middle; length unchanged), then forward."""

    offset: int | None = None

    name = "flip_byte"


@dataclass(frozen=True)
class FlipResponseByte:
    """Forward, then invert the response-body byte at ``offset`` (default: a random one, so that two damaged
    answers differ, as real damage in transit does): what a faulty middlebox or NIC does and TCP does not
    catch. Headers (Content-MD5 included) are untouched."""

    offset: int | None = None

    name = "flip_response_byte"


@dataclass(frozen=True)
class ForgetIfMatch:
    """Forward without the request's If-Match: a server (or a cache in between) that ignores the condition;
    with ``held``, only after ``release_holds()`` (the test changes the blob meanwhile)."""

    held: bool = False

    name = "forget_if_match"


@dataclass(frozen=True)
class DropEtag:
    """Forward, then answer without any ETag (the header, and `<Etag>` in a listing): a server or a proxy that
    names no version of a blob, so no read can be pinned to one."""

    name = "drop_etag"


@dataclass(frozen=True)
class ShiftRange:
    """Forward with the requested byte range moved ``by`` bytes: a server that answers another range than asked
    (its Content-Range says which). Sign requests with a SAS: a Shared Key signature covers the Range header."""

    by: int

    name = "shift_range"


@dataclass(frozen=True)
class Hold:
    """Neither forward nor answer until ``release_holds()`` (then forward) or the proxy stops (then abort)."""

    name = "hold"


Action = (Respond | ResetBefore | ResetAfter | ResetMidResponse | StallMidResponse | Stall | StallBody | FlipByte
          | FlipResponseByte | ForgetIfMatch | ShiftRange | DropEtag
          | Hold)


def respond(
    status: int, error_code: str, retry_after: float | None = None, message: str | None = None
) -> Respond:
    return Respond(status, error_code, retry_after, message)


def reset_before() -> ResetBefore:
    return ResetBefore()


def reset_after() -> ResetAfter:
    return ResetAfter()


def reset_mid_response(keep: float = 0.5) -> ResetMidResponse:
    return ResetMidResponse(keep)


def stall_mid_response(keep: float = 0.5, seconds: float | None = None) -> StallMidResponse:
    return StallMidResponse(keep, seconds)


def stall(seconds: float | None = None) -> Stall:
    return Stall(seconds)


def stall_body(after: int = 0, seconds: float | None = None) -> StallBody:
    return StallBody(after, seconds)


def flip_byte(offset: int | None = None) -> FlipByte:
    return FlipByte(offset)


def flip_response_byte(offset: int | None = None) -> FlipResponseByte:
    return FlipResponseByte(offset)


def hold() -> Hold:
    return Hold()


def forget_if_match(held: bool = False) -> ForgetIfMatch:
    return ForgetIfMatch(held)


def drop_etag() -> DropEtag:
    return DropEtag()


def shift_range(by: int) -> ShiftRange:
    return ShiftRange(by)


def _moved(headers: CIMultiDict[str], action: Action | None) -> None:
    """The request's headers as the fault changes them (If-Match dropped, the range moved)."""
    if isinstance(action, ForgetIfMatch):
        headers.popall("If-Match", None)
    if isinstance(action, ShiftRange):
        for name in ("x-ms-range", "Range"):
            first, _, last = headers.get(name, "").removeprefix("bytes=").partition("-")
            if first.isdigit() and last.isdigit():
                headers[name] = f"bytes={int(first) + action.by}-{int(last) + action.by}"


# --------------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------------
@dataclass(eq=False)
class Rule:
    """Apply ``action`` to requests matching ``op`` (None: any) and ``blob`` (substring of the blob name; of a
    listing's prefix for ``list_blobs``).

    Occurrences are counted per rule over *matching* requests, 1-based, whether or not an earlier rule
    fired. Selectors combine with AND; with none given the rule fires on every match:
      nth         int or container (set, range) of occurrence numbers, e.g. ``nth={2, 3}``
      every       fire on every k-th occurrence
      probability fire with this probability, drawn from ``random.Random(seed)``
      times       fire at most this many times in total
    ``action`` may be an Action instance or a zero-argument factory such as ``reset_before``.
    """

    op: str | None
    action: Action | Callable[[], Action]
    blob: str | None = None
    nth: int | Container[int] | None = None
    every: int | None = None
    probability: float | None = None
    seed: int = 0
    times: int | None = None
    seen: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.op is not None and self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}; expected one of {sorted(OPS)}")
        if not isinstance(self.action, Action):
            self.action = self.action()  # allow Rule("put_block", reset_before)
        if isinstance(self.nth, int):
            self.nth = {self.nth}
        self._rng = random.Random(self.seed)

    def _decide(self, op: str, blob: str | None) -> Action | None:
        """Count a matching occurrence and return the action if the rule fires (caller holds the lock)."""
        if self.op is not None and self.op != op:
            return None
        if self.blob is not None and (blob is None or self.blob not in blob):
            return None
        self.seen += 1
        n = self.seen
        if self.nth is not None and n not in self.nth:  # type: ignore[operator]
            return None
        if self.every is not None and n % self.every:
            return None
        if self.probability is not None and self._rng.random() >= self.probability:
            return None
        if self.times is not None and self.fired >= self.times:
            return None
        self.fired += 1
        assert isinstance(self.action, Action)
        return self.action


@dataclass
class _HoldGate:
    """State of ``hold_after``: admit at most ``count`` ``op`` requests upstream until they succeeded."""

    op: str
    count: int
    inflight: int = 0
    succeeded: int = 0

    @property
    def triggered(self) -> bool:
        return self.succeeded >= self.count

    def slot_free(self) -> bool:
        return self.succeeded + self.inflight < self.count


# --------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------
@dataclass
class Stats:
    """Per-op counters. ``responses`` only counts responses fully delivered to the client."""

    requests: Counter[str] = field(default_factory=Counter)
    responses: defaultdict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    bytes_in: Counter[str] = field(default_factory=Counter)  # request body bytes received from clients
    bytes_out: Counter[str] = field(default_factory=Counter)  # response body bytes sent to clients
    faults: Counter[str] = field(default_factory=Counter)  # injected faults (any action), by op

    def ok(self, op: str) -> int:
        """Number of 2xx responses delivered for ``op``."""
        return sum(n for status, n in self.responses[op].items() if 200 <= status < 300)

    def copy(self) -> Stats:
        responses: defaultdict[str, Counter[int]] = defaultdict(Counter)
        for op, c in self.responses.items():
            responses[op] = Counter(c)
        return Stats(Counter(self.requests), responses, Counter(self.bytes_in), Counter(self.bytes_out),
                     Counter(self.faults))  # fmt: skip


@dataclass(frozen=True)
class LogEntry:
    """One finished request. ``status`` is None when the client got no status line at all."""

    op: str
    method: str
    container: str | None
    blob: str | None  # percent-decoded blob name
    query: dict[str, str]
    status: int | None
    request_bytes: int
    response_bytes: int
    headers: dict[str, str]  # request headers, lower-cased names, Authorization removed
    fault: str | None  # action name applied, "upstream_error" or "client_gone"
    error_code: str | None  # x-ms-error-code of the response, if any


@dataclass
class _Req:
    op: str
    method: str
    container: str | None
    blob: str | None
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    fault: str | None = None
    gated: bool = False
    recorded: bool = False

    @property
    def selected(self) -> str | None:
        """What a rule's ``blob`` is matched against: the blob name, or a listing's prefix."""
        return self.query.get("prefix", "") if self.op == "list_blobs" else self.blob


def classify(method: str, raw_path: str, headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> _Req:
    """Split an Azure blob request into (op, container, blob name, query)."""
    url = URL(raw_path, encoded=True)
    query = {k.lower(): v for k, v in url.query.items()}
    # path = /<account>/<container>/<blob name…>; the blob name may itself contain "/".
    parts = url.raw_path.lstrip("/").split("/", 2)
    container = unquote(parts[1]) if len(parts) > 1 and parts[1] else None
    blob = unquote(parts[2]) if len(parts) > 2 and parts[2] else None
    comp = query.get("comp", "").lower()
    restype = query.get("restype", "").lower()
    op = "other"
    if blob is not None:
        if method == "PUT":
            op = {"block": "put_block", "blocklist": "put_block_list", "metadata": "set_metadata",
                  "properties": "set_properties"}.get(comp, "other")  # fmt: skip
            if not comp and "x-ms-blob-type" in headers:
                op = "put_blob"
            elif "x-ms-copy-source" in headers:
                op = "put_block_from_url" if comp == "block" else "copy_blob" if not comp else op
        elif method == "GET":
            op = {"blocklist": "get_block_list", "": "get_blob"}.get(comp, "other")
        elif method == "HEAD" and not comp:
            op = "get_properties"
        elif method == "DELETE" and not comp:
            op = "delete_blob"
    elif container is not None and restype == "container":
        if method == "PUT" and not comp:
            op = "create_container"
        elif method == "GET" and comp == "list":
            op = "list_blobs"
        elif method == "DELETE" and not comp:
            op = "delete_container"
        elif method == "POST" and comp == "batch":
            op = "batch"
    logged = {k.lower(): v for k, v in headers.items() if k.lower() != "authorization"}
    return _Req(op, method, container, blob, query, logged, b"")


def _error_body(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="utf-8"?>'
        f"<Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>"
    ).encode()


# --------------------------------------------------------------------------------------------------
# Proxy
# --------------------------------------------------------------------------------------------------
class FaultProxy:
    """HTTP proxy on 127.0.0.1 running its own event loop in a background thread.

    Every public method is safe to call from any thread except the proxy's own. Typical use::

        proxy.add_rule(Rule("put_block", respond(503, "ServerBusy", retry_after=1), nth={2, 3}))
        proxy.add_rule(Rule("get_blob", reset_mid_response(0.5), blob="big", times=1))
        proxy.hold_after("put_block", 5)      # then: proxy.wait_for("put_block", 5); kill the client
        proxy.stats.ok("put_block"), proxy.stats.bytes_in["put_block"], proxy.log[-1].fault
    """

    def __init__(self, target_base_url: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = target_base_url.rstrip("/")
        self.host = host
        self._port = port
        # Re-entrant so that wait_until() predicates may call the public getters (stats, log, held).
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)  # test threads wait on this (wait_for, …)
        self._stats = Stats()
        self._log: list[LogEntry] = []
        self._rules: list[Rule] = []
        self._gate: _HoldGate | None = None
        self._release_gen = 0  # bumped by release_holds(); waiters compare with the value they started at
        self._held = 0
        self._active = 0  # requests whose handler is running (body being read, held, or forwarded)
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.ServerRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._changed: asyncio.Event | None = None  # loop-side wake-up, replaced after each notification

    # -- lifecycle -----------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:PORT`` (no account segment)."""
        return f"http://{self.host}:{self._port}"

    def endpoint(self, account: str = "devstoreaccount1") -> str:
        """Blob endpoint through the proxy, e.g. ``http://127.0.0.1:PORT/devstoreaccount1``."""
        return f"{self.url}/{account}"

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        self._stopping = False
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=self._run_loop, args=(loop,), name="FaultProxy", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._astart(), loop).result(timeout=30)

    def stop(self) -> None:
        """Stop serving; held/stalled requests are aborted, never forwarded."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        try:
            asyncio.run_coroutine_threadsafe(self._astop(), loop).result(timeout=30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)
            self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    async def _astart(self) -> None:
        self._changed = asyncio.Event()
        self._session = aiohttp.ClientSession(
            # A fresh upstream connection per request: no stale pooled sockets after Azurite restarts or
            # closes idle keep-alive connections (which would surface as spurious proxy errors).
            connector=aiohttp.TCPConnector(force_close=True, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,  # relay bodies byte-for-byte
            skip_auto_headers=_NO_AUTO_HEADERS,
        )
        # handler_cancellation: when a client disappears (e.g. SIGKILLed blobsync) its held/stalled request
        # is cancelled instead of being forwarded later on behalf of a dead process.
        server = web.Server(self._handle, handler_cancellation=True, access_log=None)
        self._runner = web.ServerRunner(server, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port)
        await site.start()
        self._port = int(self._runner.addresses[0][1])  # the OS-assigned port when port=0

    async def _astop(self) -> None:
        self._notify_loop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # -- state shared with test threads ----------------------------------------------------------------
    @property
    def stats(self) -> Stats:
        """A snapshot copy of the counters."""
        with self._lock:
            return self._stats.copy()

    @property
    def log(self) -> list[LogEntry]:
        """A snapshot copy of the finished-request log, oldest first."""
        with self._lock:
            return list(self._log)

    def reset_stats(self) -> None:
        """Zero the counters and the log (rules, their occurrence counts and holds are kept)."""
        with self._cond:
            self._stats = Stats()
            self._log.clear()

    def add_rule(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear_rules(self) -> None:
        """Remove all rules and any ``hold_after``; already-held requests stay held until release_holds()."""
        with self._lock:
            self._rules.clear()
            self._gate = None
        self._notify_loop_threadsafe()

    def hold_after(self, op: str, count: int) -> None:
        """Let exactly ``count`` ``op`` requests succeed upstream, then hold every later request (any op).

        Until the threshold is reached other ops pass through, and at most ``count - succeeded`` ``op``
        requests are in flight upstream (extra concurrent ones wait), so the service ends up with exactly
        ``count`` applied ``op`` requests unless one fails. Counting starts now.
        """
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}")
        with self._lock:
            self._gate = _HoldGate(op, count)
        self._notify_loop_threadsafe()

    def release_holds(self) -> None:
        """Forward every currently held or stalled request (if its client is still connected) and disarm
        ``hold_after``. Explicit ``hold()`` rules stay armed until ``clear_rules()``."""
        with self._cond:
            self._release_gen += 1
            self._gate = None
        self._notify_loop_threadsafe()

    release = release_holds

    @property
    def held(self) -> int:
        """Number of requests currently held (by a hold rule, ``hold_after`` or a stall)."""
        with self._lock:
            return self._held

    def wait_for(self, op: str, count: int, timeout: float = 60) -> None:
        """Block until ``count`` 2xx ``op`` responses have been delivered (since the last reset_stats)."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}")
        with self._cond:
            if not self._cond.wait_for(lambda: self._stats.ok(op) >= count, timeout):
                raise TimeoutError(
                    f"only {self._stats.ok(op)} of {count} successful {op} after {timeout}s; "
                    f"requests={dict(self._stats.requests)} held={self._held}"
                )

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 60) -> None:
        """Block until ``predicate()`` is true; it is re-checked whenever a request changes proxy state, and every
        50 ms (a predicate may read state of its own: a client's journal).

        E.g. ``proxy.wait_until(lambda: any(e.op == "put_blob" for e in proxy.log))``.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"condition not met after {timeout}s; held={self._held}")
                self._cond.wait(min(left, 0.05))

    def wait_idle(self, timeout: float = 60) -> None:
        """Block until no request is being handled: e.g. a killed client's held requests have been dropped.

        Call it between two runs before ``reset_stats()`` so that nothing of the first run is counted in the
        second.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._active == 0, timeout):
                raise TimeoutError(f"{self._active} requests still being handled after {timeout}s")

    def wait_for_held(self, count: int = 1, timeout: float = 60) -> None:
        """Block until at least ``count`` requests are being held at the same time."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._held >= count, timeout):
                raise TimeoutError(f"only {self._held} of {count} requests held after {timeout}s")

    # -- loop-side synchronisation ------------------------------------------------------------------------
    def _notify_loop(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def _notify_loop_threadsafe(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop closing concurrently
                loop.call_soon_threadsafe(self._notify_loop)

    async def _wait_until(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait on the loop until ``predicate()`` (evaluated under the lock) holds; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if predicate():
                    return True
            assert self._changed is not None
            event = self._changed  # grabbed before yielding, so no notification can be missed
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                return False

    # -- request handling --------------------------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        with self._cond:
            self._active += 1
        try:
            return await self._handle_counted(request)
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    async def _handle_counted(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.headers.get("Expect", "").lower() == "100-continue":
            # The low-level server has no router to answer Expect for us, and clients would otherwise wait.
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        req = classify(request.method, request.raw_path, request.headers)
        early = self._decide_before_body(req)
        if early is None:
            req.body = await request.content.read()
        else:
            body = await self._read_stalling(request, early)
            if body is None:  # the client gave up on the request (or the proxy is stopping)
                req.fault = early.name
                self._admit(req, early)
                return self._abort(request, req, rst=True)
            req.body = body
        action = self._admit(req, early)
        try:
            return await self._dispatch(request, req, action)
        except asyncio.CancelledError:
            # The client disconnected while we were holding, stalling or forwarding its request.
            if not req.recorded:
                self._record(req, None, 0, fault="client_gone")
            raise
        finally:
            if req.gated:
                with self._lock:
                    if self._gate is not None:
                        self._gate.inflight -= 1
                self._notify_loop()

    def _decide_before_body(self, req: _Req) -> StallBody | None:
        """Body-stall rules see a request before its body is read (each rule still counts it once)."""
        with self._lock:
            for rule in self._rules:
                if isinstance(rule.action, StallBody):
                    action = rule._decide(req.op, req.selected)
                    if isinstance(action, StallBody):
                        return action
        return None

    async def _read_stalling(self, request: web.BaseRequest, action: StallBody) -> bytes | None:
        """Read the body with a pause after ``action.after`` bytes; None if the client went away."""
        sock = request.transport.get_extra_info("socket") if request.transport is not None else None
        if sock is not None:
            # A small, fixed receive buffer (no autotuning) so the kernel cannot absorb the rest of the body
            # while we do not read: the client's sends really block.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        try:
            head = await request.content.readexactly(min(action.after, request.content_length or 0))
            if not await self._hold(request, action.seconds):
                return None
            return head + await request.content.read()
        except (ConnectionError, asyncio.IncompleteReadError, aiohttp.ClientPayloadError):
            return None

    def _admit(self, req: _Req, early: Action | None = None) -> Action | None:
        """Count the request and pick the fault to apply, if any (``early``: already picked)."""
        with self._cond:
            self._cond.notify_all()
            self._stats.requests[req.op] += 1
            self._stats.bytes_in[req.op] += len(req.body)
            if early is not None:
                self._stats.faults[req.op] += 1
                return early
            if self._gate is not None and self._gate.triggered:
                self._stats.faults[req.op] += 1
                return Hold()
            for rule in self._rules:
                if isinstance(rule.action, StallBody):
                    continue
                action = rule._decide(req.op, req.selected)
                if action is not None:
                    self._stats.faults[req.op] += 1
                    return action
        return None

    async def _dispatch(
        self, request: web.BaseRequest, req: _Req, action: Action | None
    ) -> web.StreamResponse:
        if action is not None:
            req.fault = action.name
        if isinstance(action, Respond):
            return await self._respond_error(request, req, action)
        if isinstance(action, ResetBefore):
            return self._abort(request, req, rst=True)
        if isinstance(action, Hold) or (isinstance(action, ForgetIfMatch) and action.held):
            if not await self._hold(request, None):
                return self._abort(request, req, rst=True)
        elif isinstance(action, Stall) and not await self._hold(request, action.seconds):
            return self._abort(request, req, rst=True)
        if isinstance(action, FlipByte) and req.body:
            i = len(req.body) // 2 if action.offset is None else action.offset % len(req.body)
            body = bytearray(req.body)
            body[i] ^= 0xFF
            req.body = bytes(body)
        if not await self._acquire_gate_slot(request, req):
            return self._abort(request, req, rst=True)
        return await self._forward(request, req, action)

    async def _hold(self, request: web.BaseRequest, seconds: float | None) -> bool:
        """Wait for release_holds() (or ``seconds``). False if the proxy is stopping or the client left."""
        with self._cond:
            gen = self._release_gen
            self._held += 1
            self._cond.notify_all()
        try:
            await self._wait_until(lambda: self._stopping or self._release_gen != gen, seconds)
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify_all()
        return not self._stopping and not _client_gone(request)

    async def _acquire_gate_slot(self, request: web.BaseRequest, req: _Req) -> bool:
        """Apply hold_after: wait for an upstream slot, or be held for good once the gate has triggered."""
        while True:
            with self._lock:
                gate = self._gate
                if gate is None:
                    return True
                if gate.triggered:
                    break
                if gate.op != req.op:
                    return True
                if gate.slot_free():
                    gate.inflight += 1
                    req.gated = True
                    return True

            # Throttled: `count` requests of this op are already in flight; wait until one of them fails
            # (slot frees), they all succeed (trigger), or the gate is removed.
            def changed(g: _HoldGate = gate) -> bool:
                return self._gate is not g or self._stopping or g.triggered or g.slot_free()

            await self._wait_until(changed)
            if self._stopping or _client_gone(request):
                return False
        req.fault = "hold"
        return await self._hold(request, None)

    async def _forward(
        self, request: web.BaseRequest, req: _Req, action: Action | None
    ) -> web.StreamResponse:
        assert self._session is not None
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP)
        headers["Host"] = request.host
        _moved(headers, action)
        # A chunked request body has no Content-Length; keep it chunked so the signed headers are unchanged.
        chunked = "content-length" not in headers and bool(req.body)
        url = URL(self.target + request.raw_path, encoded=True)  # keep the client's exact percent-encoding
        try:
            async with self._session.request(
                request.method, url, headers=headers, data=req.body or None, chunked=chunked or None,
                allow_redirects=False,
            ) as upstream:  # fmt: skip
                body = await upstream.read()
                status, reason = upstream.status, upstream.reason
                resp_headers = CIMultiDict(
                    (k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP
                )
        except (aiohttp.ClientError, OSError, TimeoutError):
            # The service is unreachable (e.g. Azurite restarting): the client sees a dropped connection,
            # as it would if the real endpoint were down.
            req.fault = "upstream_error"
            return self._abort(request, req, rst=True)

        if req.gated:
            with self._lock:
                if self._gate is not None and 200 <= status < 300:
                    # Counted as soon as the service has applied it, before the client can react, so
                    # that nothing the client sends afterwards slips past the trigger.
                    self._gate.succeeded += 1
                if self._gate is not None:
                    self._gate.inflight -= 1
            req.gated = False
            self._notify_loop()

        error_code = resp_headers.get("x-ms-error-code")
        partial = isinstance(action, ResetMidResponse | StallMidResponse)
        if isinstance(action, ResetAfter) or (partial and len(body) < 2):
            return self._abort(request, req, rst=True, status=status, error_code=error_code)
        if isinstance(action, ResetMidResponse | StallMidResponse):
            pause = action if isinstance(action, StallMidResponse) else None
            return await self._partial(request, req, action.keep, status, reason, resp_headers, body, pause)

        if isinstance(action, DropEtag):
            resp_headers.popall("ETag", None)
            if req.op == "list_blobs":
                body = re.sub(rb"<Etag>[^<]*</Etag>", b"", body)
                resp_headers.popall("Content-Length", None)
        if isinstance(action, FlipResponseByte) and body:
            i = random.randrange(len(body)) if action.offset is None else action.offset % len(body)
            damaged = bytearray(body)
            damaged[i] ^= 0xFF
            body = bytes(damaged)
        if "content-length" not in resp_headers and request.method != "HEAD":
            resp_headers["Content-Length"] = str(len(body))  # upstream was chunked; we send it whole
        response = web.Response(status=status, reason=reason, headers=resp_headers, body=body or None)
        return await self._send(request, req, response, len(body), error_code)

    async def _send(
        self,
        request: web.BaseRequest,
        req: _Req,
        response: web.Response,
        body_len: int,
        error_code: str | None,
    ) -> web.StreamResponse:
        sent = 0 if request.method == "HEAD" else body_len
        # Record first: the client may act on the response (and the test may look at the stats) before
        # this coroutine resumes after the write, so counting afterwards would be racy.
        entry = self._record(req, response.status, sent, error_code=error_code, delivered=True)
        try:
            await response.prepare(request)
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            self._unrecord(entry)
            self._record(req, None, 0, fault=req.fault or "client_gone")
            raise
        return response

    async def _respond_error(
        self, request: web.BaseRequest, req: _Req, action: Respond
    ) -> web.StreamResponse:
        request_id = str(uuid.uuid4())
        message = action.message or f"Injected {action.error_code} by FaultProxy."
        body = _error_body(action.error_code, f"{message}\nRequestId:{request_id}\nTime:{_now_iso()}")
        headers = CIMultiDict(
            {
                "Content-Type": "application/xml",
                "x-ms-error-code": action.error_code,
                "x-ms-request-id": request_id,
                "x-ms-version": request.headers.get("x-ms-version", "2021-12-02"),
            }
        )
        if "x-ms-client-request-id" in request.headers:
            headers["x-ms-client-request-id"] = request.headers["x-ms-client-request-id"]
        if action.retry_after is not None:
            ra = action.retry_after
            headers["Retry-After"] = str(int(ra)) if float(ra).is_integer() else str(ra)
        response = web.Response(status=action.status, headers=headers, body=body)
        return await self._send(request, req, response, len(body), action.error_code)

    async def _partial(
        self,
        request: web.BaseRequest,
        req: _Req,
        keep_spec: float,
        status: int,
        reason: str | None,
        headers: CIMultiDict[str],
        body: bytes,
        pause: StallMidResponse | None = None,
    ) -> web.StreamResponse:
        keep = int(len(body) * keep_spec) if keep_spec < 1 else int(keep_spec)
        keep = max(1, min(keep, len(body) - 1))
        headers["Content-Length"] = str(len(body))  # promise the whole body, deliver only part of it
        response = web.StreamResponse(status=status, reason=reason, headers=headers)
        try:
            await response.prepare(request)
            await response.write(body[:keep])
            transport = request.transport
            # Let the partial bytes reach the kernel before closing, so the client deterministically sees
            # them followed by EOF (a "connection closed mid-body" error), not a bare reset.
            while transport is not None and not transport.is_closing() and transport.get_write_buffer_size():
                await asyncio.sleep(0.001)
            if pause is not None:
                await self._hold(request, pause.seconds)
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            pass
        self._record(req, status, keep, error_code=headers.get("x-ms-error-code"))
        if request.transport is not None:
            request.transport.abort()
        return response

    def _abort(
        self,
        request: web.BaseRequest,
        req: _Req,
        *,
        rst: bool,
        status: int | None = None,
        error_code: str | None = None,
    ) -> web.StreamResponse:
        transport = request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if rst and sock is not None:
                # SO_LINGER 0 turns the close into a TCP RST: the client gets ECONNRESET, not a clean EOF.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            transport.abort()
        self._record(req, status, 0, error_code=error_code)
        # aiohttp fails to write this to the closed transport, which it treats as a quiet disconnect.
        return web.Response(status=499)

    def _record(
        self,
        req: _Req,
        status: int | None,
        response_bytes: int,
        *,
        fault: str | None = None,
        error_code: str | None = None,
        delivered: bool = False,
    ) -> LogEntry:
        req.recorded = True
        entry = LogEntry(
            op=req.op,
            method=req.method,
            container=req.container,
            blob=req.blob,
            query=req.query,
            status=status,
            request_bytes=len(req.body),
            response_bytes=response_bytes,
            headers=req.headers,
            fault=fault or req.fault,
            error_code=error_code,
        )
        with self._cond:
            self._log.append(entry)
            if delivered and status is not None:
                self._stats.responses[req.op][status] += 1
            self._stats.bytes_out[req.op] += response_bytes
            self._cond.notify_all()
        return entry

    def _unrecord(self, entry: LogEntry) -> None:
        """Undo a delivered-response record whose write then failed (client went away meanwhile)."""
        with self._cond:
            with contextlib.suppress(ValueError):
                self._log.remove(entry)
            if entry.status is not None:
                self._stats.responses[entry.op][entry.status] -= 1
            self._stats.bytes_out[entry.op] -= entry.response_bytes


def _client_gone(request: web.BaseRequest) -> bool:
    """True if the client closed its end (e.g. was killed) even if the loop has not noticed yet."""
    transport = request.transport
    if transport is None or transport.is_closing():
        return True
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        with sock.dup() as probe:  # a private duplicate, so the peek cannot disturb asyncio's socket object
            data = probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return bool(data == b"")


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


__all__ = [
    "OPS",
    "Action",
    "FaultProxy",
    "FlipByte",
    "FlipResponseByte",
    "Hold",
    "LogEntry",
    "ResetAfter",
    "ResetBefore",
    "ResetMidResponse",
    "Respond",
    "Rule",
    "Stall",
    "StallBody",
    "StallMidResponse",
    "Stats",
    "classify",
    "flip_byte",
    "flip_response_byte",
    "forget_if_match",
    "hold",
    "reset_after",
    "reset_before",
    "reset_mid_response",
    "respond",
    "shift_range",
    "stall",
    "stall_body",
    "stall_mid_response",
]
