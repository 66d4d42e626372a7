"""What the jobs of one Client share (stores and their connection pools and tokens, the journal, the request and
memory budgets, the bandwidth cap, the thread pools), and one job's engine context made from it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from blobsync.backends.base import Location, Store
from blobsync.backends.registry import Wire, open_store, parse_location
from blobsync.config import TransferConfig, session_fields
from blobsync.engine.bandwidth import TokenBucket
from blobsync.engine.budget import MemoryBudget, RequestLimiter
from blobsync.engine.context import (
    EngineContext,
    RequestPath,
    job_retrier,
    memory_budget,
    shared_tuning,
)
from blobsync.engine.digest import HashLanes, hash_threads
from blobsync.engine.prompt import OverwritePrompt
from blobsync.errors import UsageError
from blobsync.events import Progress
from blobsync.journal import Journal, default_journal_path

MAX_CHILDREN = 16  # sessions made for calls with other session settings, kept until the parent closes


class Session:
    """Shared by every call of a Client: one store per container (each with one connection pool and one credential,
    so one token cache), one journal, one request limit and one memory budget for all calls in flight, one
    bandwidth cap and one pair of thread pools, all set by `config`'s session fields. A call whose config sets a
    session field to another value (its own cap, proxy, retries...) runs on a session of its own, made from this
    one and kept for the next call with the same settings (see `context`)."""

    def __init__(self, config: TransferConfig, env: Mapping[str, str], journal: Journal | Callable[[], Journal],
                 wire_progress: Progress | None = None, credential: object = None, home: str | None = None, *,
                 bucket: TokenBucket | None = None, owns_journal: bool = True) -> None:
        self.config = config
        self._home_url = home
        # A Client's credential object (None: the URL's SAS or the environment), for its own account (`home`'s) only.
        self.credential = credential
        self._home = _home_account(home) if home is not None and credential is not None else None
        self.env = env
        # Opened when a call first needs it: ls, rm and make never create the journal's folder.
        self._journal: Journal | None = journal if isinstance(journal, Journal) else None
        self._open_journal: Callable[[], Journal] | None = None if isinstance(journal, Journal) else journal
        self._owns_journal = owns_journal
        # The job's cap: this session's own, or one handed in (a worker process draws on its job's shared cap).
        self.bucket = bucket or (TokenBucket(config.cap_bytes) if config.cap_bytes else None)
        # Bytes on the wire as they move (a display figure): the one call's, or the Client's for all its calls.
        self.progress = wire_progress or Progress()
        self.memory = MemoryBudget(memory_budget(config))
        self.limiter = RequestLimiter(config.start_concurrency, config.max_concurrency)
        self.tuning = shared_tuning(self.limiter)  # one tuner for every call in flight on the one limiter
        self.io_pool = ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2) + 2), thread_name_prefix="bs-io")
        self.hashing = HashLanes(hash_threads(env))  # whole-file MD5s: one lane a file, files side by side
        self._stores: dict[tuple[str, str], Store] = {}
        self._children: dict[tuple[object, ...], Session] = {}
        self.closed = False

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            assert self._open_journal is not None
            self._journal = self._open_journal()
        return self._journal

    def store(self, location: str | Location) -> Store:
        """The store of the container `location` names (opened on first use, then reused)."""
        loc = parse_location(location) if isinstance(location, str) else location
        key = (loc.container_url, str(getattr(loc, "sas", "") or ""))
        store = self._stores.get(key)
        if store is None:
            wire = Wire(self.bucket.take if self.bucket else None, self.progress.on_wire)
            store = self._stores[key] = open_store(loc, self.config, self.env, wire, self.credential_for(loc))
        return store  # container-scoped: a job takes its path from its own location

    def credential_for(self, loc: Location) -> object:
        """The Client's credential belongs to its account: another account's URL (another host) is signed by its own
        SAS or the environment under the trusted-host rule, and a URL that carries a SAS of its own uses that."""
        if self.credential is None or getattr(loc, "sas", None) or _account(loc) != self._home:
            return None
        return self.credential

    def context(self, location: str | Location, config: TransferConfig, *, progress: Progress,
                overwrite_prompt: OverwritePrompt | None = None) -> EngineContext:
        """The engine context of one call: the session's store, budgets and pools, the call's config, progress
        and retry counters. Nothing in it needs closing apart from the session. The call's config is read as on
        this session (its session fields left at their defaults are this session's); where it still sets one to
        another value, the call runs on a session of its own, never silently on this one's."""
        config = config.in_session(self.config)
        if config.session_key() != self.config.session_key():
            return self.child(config).context(location, config, progress=progress, overwrite_prompt=overwrite_prompt)
        store = self.store(location)
        requests = self.requests(config, progress)
        return EngineContext(store, lambda: self.journal, config, self.memory, requests, self.io_pool, self.hashing,
                             progress, overwrite_prompt, self.bucket, self.tuning)

    def requests(self, config: TransferConfig, progress: Progress) -> RequestPath:
        """A request path of one call (its retry policy and counters) under the session's one request limit."""
        config = config.in_session(self.config)
        if config.session_key() != self.config.session_key():
            return self.child(config).requests(config, progress)
        return RequestPath(self.limiter, job_retrier(config, progress), progress)

    def child(self, config: TransferConfig) -> Session:
        """The session of calls whose session fields are `config`'s: made once from this one (its credential, its
        journal where the call names the same one, its wire progress), closed with it."""
        key = config.session_key()
        found = self._children.get(key)
        if found is None or found.closed:
            if self.closed:
                raise RuntimeError("the session is closed")
            if found is None and len(self._children) >= MAX_CHILDREN:
                differ = [n for n in session_fields() if getattr(config, n) != getattr(self.config, n)]
                raise UsageError(f"this Client already runs calls on {MAX_CHILDREN} other settings of its session, "
                                 f"each with its own connections and budgets; this call sets {', '.join(differ)}",
                                 hint="set these on the Client's own config, or open another Client for them")
            same_journal = config.journal_path == self.config.journal_path
            journal: Callable[[], Journal] = (lambda: self.journal) if same_journal else \
                (lambda: Journal(config.journal_path or default_journal_path(self.env)))
            found = self._children[key] = Session(config, self.env, journal, self.progress, self.credential,
                                                  self._home_url, owns_journal=not same_journal)
        return found

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            for child in self._children.values():
                await child.close()
            for store in self._stores.values():
                await store.close()
        finally:
            self._children.clear()
            self._stores.clear()
            await asyncio.to_thread(self.io_pool.shutdown, wait=True)
            self.hashing.shutdown()
            self.memory.close()
            if self._journal is not None and self._owns_journal:
                self._journal.close()


def _home_account(url: str) -> str:
    """The account of a Client's URL: a container URL's, or an account URL's own (which names no container)."""
    try:
        return _account(parse_location(url))
    except UsageError:
        base, _, query = url.partition("?")
        return _account(parse_location(f"{base.rstrip('/')}/container" + (f"?{query}" if query else "")))


def _account(loc: Location) -> str:
    """The account a location belongs to: its container URL without the container (scheme, host, port, and the
    account of an emulator's path-style URL)."""
    return loc.container_url.rsplit("/", 1)[0].lower()
