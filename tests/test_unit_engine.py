"""Unit tests: block planning, IDs, retry delays and Retry-After, error explanations, redaction, config, budgets."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, strategies as st

from blobsync.backends.answers import parse_retry_after
from blobsync.backends.azure.errors import error_from_response
from blobsync.backends.azure.location import BlobLocation, parse_location
from blobsync.backends.azure.rules import MAX_BLOCKS
from blobsync.backends.azure.writer import BLOCK_ID_LENGTH, block_id
from blobsync.config import MiB, TransferConfig, parse_metadata
from blobsync.engine.blocks import block_count, block_ranges, choose_block_size, new_nonce
from blobsync.engine.budget import MemoryBudget
from blobsync.engine.mtime import format_mtime, parse_mtime
from blobsync.engine.retry import RetryPolicy, backoff_delay
from blobsync.errors import AuthError, ContainerNotFoundError, CorruptedInTransitError, ThrottledError, UsageError
from blobsync.redact import redact


@given(
    size=st.integers(min_value=0, max_value=4000 * MiB * MAX_BLOCKS),
    requested=st.sampled_from([MiB, 4 * MiB, 8 * MiB]),
)
def test_block_size_keeps_blob_under_50000_blocks(size: int, requested: int) -> None:
    from blobsync.backends.azure.store import AzureContainerStore

    bs = choose_block_size(size, requested, AzureContainerStore.capabilities)
    assert bs >= requested
    assert block_count(size, bs) <= MAX_BLOCKS
    if size <= requested * MAX_BLOCKS:
        assert bs == requested


@given(size=st.integers(min_value=0, max_value=10**7), bs=st.integers(min_value=1000, max_value=10**6))
def test_block_ranges_tile_the_file(size: int, bs: int) -> None:
    ranges = list(block_ranges(size, bs))
    assert len(ranges) == block_count(size, bs)
    pos = 0
    for idx, (i, off, length) in enumerate(ranges):
        assert (i, off) == (idx, pos) and 0 < length <= bs
        pos += length
    assert pos == size


def test_block_ids_are_deterministic_and_fixed_length() -> None:
    nonce = new_nonce()
    assert block_id(nonce, 7) == block_id(nonce, 7)
    assert block_id(nonce, 7) != block_id(new_nonce(), 7)
    assert {len(block_id(nonce, i)) for i in (0, 9, 10, 49_999)} == {BLOCK_ID_LENGTH}


def test_backoff_is_jittered_capped_and_honours_retry_after() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=8.0)
    assert backoff_delay(policy, 10, None, rng=lambda lo, hi: hi) == 8.0
    assert backoff_delay(policy, 1, None, rng=lambda lo, hi: hi) == 1.0
    assert backoff_delay(policy, 3, None, rng=lambda lo, hi: lo) == 0.0
    throttled = ThrottledError("busy", status=503, retry_after=20.0)
    assert backoff_delay(policy, 1, throttled, rng=lambda lo, hi: lo) == 20.0


def test_retry_after_forms() -> None:
    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("Mon, 30 Nov 2026 12:00:30 GMT", now) == 30.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def _sas_url(**fields: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {**fields, "sig": "secret"}.items())
    return f"https://acct.blob.core.windows.net/cont?{query}"


def test_explain_sas() -> None:
    past = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    future = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    def explain_sas(loc: BlobLocation, method: str) -> str | None:
        assert loc.sas_token is not None
        return loc.sas_token.explain(method, loc.scheme)

    assert "expired" in (explain_sas(parse_location(_sas_url(sp="rw", se=past)), "PUT") or "")
    assert "not valid before" in (explain_sas(parse_location(_sas_url(sp="rw", se=future, st=future)), "PUT") or "")
    assert "lacks 'w'" in (explain_sas(parse_location(_sas_url(sp="rl", se=future)), "PUT") or "")
    assert "'c' (create) without 'w'" in (explain_sas(parse_location(_sas_url(sp="rc", se=future)), "PUT") or "")
    assert explain_sas(parse_location(_sas_url(sp="racwdl", se=future)), "PUT") is None


def _error(status: int, code: str, url: str = "https://acct.blob.core.windows.net/cont", detail: str = "") -> object:
    body = (f"<Error><Code>{code}</Code><Message>m</Message>"
            f"<AuthenticationErrorDetail>{detail}</AuthenticationErrorDetail></Error>")
    return error_from_response(status=status, headers={"x-ms-error-code": code, "retry-after": "3"},
                               body=body.encode(), method="PUT", what="put blob 'x'",
                               loc=parse_location(url), credential_description="SAS token from the URL")


def test_error_mapping() -> None:
    assert isinstance(_error(503, "ServerBusy"), ThrottledError)
    assert _error(503, "ServerBusy").retry_after == 3.0  # type: ignore[attr-defined]
    assert isinstance(_error(500, "OperationTimedOut"), ThrottledError)
    assert isinstance(_error(400, "Md5Mismatch"), CorruptedInTransitError)
    missing = _error(404, "ContainerNotFound")
    assert isinstance(missing, ContainerNotFoundError) and "--create-container" in str(missing)
    past = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    expired = _error(403, "AuthenticationFailed", _sas_url(sp="rw", se=past),
                     detail="Signature not valid in the specified time frame")
    assert isinstance(expired, AuthError) and "expired" in str(expired) and "secret" not in str(expired)
    # Azurite answers 403 AuthorizationFailure with no detail: the SAS fields explain it.
    readonly = _error(403, "AuthorizationFailure", _sas_url(sp="rl", se="2099-01-01"))
    assert "lacks 'w'" in str(readonly)


def test_redaction() -> None:
    text = ("GET https://a.blob.core.windows.net/cont?sv=1&sig=AbC%2Bd%3D&se=x "
            "AccountKey=Zm9vYmFy; Authorization: SharedKey acct:c2lnbmF0dXJl Bearer eyJ0eXAi.abc.def")
    out = redact(text)
    for secret in ("AbC%2Bd%3D", "Zm9vYmFy", "c2lnbmF0dXJl", "eyJ0eXAi"):
        assert secret not in out
    assert "se=x" in out


def test_mtime_roundtrip() -> None:
    ns = 1_764_470_000_123_456_789
    assert format_mtime(ns) == "2025-11-30T02:33:20.123456789Z"
    assert parse_mtime(format_mtime(ns)) == ns
    assert parse_mtime("2025-11-30T02:33:20Z") == 1_764_470_000 * 10**9
    assert parse_mtime("nonsense") is None


def test_config_validation() -> None:
    with pytest.raises(UsageError, match="block-size-mb"):
        TransferConfig.from_mib(block_size_mb=5000)
    with pytest.raises(UsageError, match="block-size-mb"):
        TransferConfig.from_mib(block_size_mb=0)
    with pytest.raises(UsageError, match="memory-mb"):
        TransferConfig.from_mib(block_size_mb=64, memory_mb=32)
    with pytest.raises(UsageError, match="concurrency"):
        TransferConfig(concurrency=0)
    cfg = TransferConfig.from_mib(block_size_mb=4, memory_mb=2048)
    assert cfg.single_put_limit == 4 * MiB
    assert TransferConfig.from_mib(put_blob_size_mb=0).single_put_limit == 0


def test_metadata_parsing() -> None:
    assert parse_metadata("team=ml; run_id=42") == {"team": "ml", "run_id": "42"}
    for bad in ("noequals", "a b=x", "a:b=x", "mtime=x", "k=ü"):
        with pytest.raises(UsageError):
            parse_metadata(bad)
    # The names a store takes are its own: Azure's are C# identifiers, checked before anything moves.
    from blobsync.backends.azure import rules

    for name in ("1abc", "a-b"):
        assert parse_metadata(f"{name}=x") == {name: "x"}
        with pytest.raises(UsageError, match="not starting with a digit"):
            rules.check_writes({name: "x"}, {})


def test_memory_budget_bounds_and_reuses_buffers() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(3 * 100)
        bufs = [await budget.buffer(100) for _ in range(3)]
        assert budget.counted == 300
        waiter = asyncio.create_task(budget.buffer(100))
        await asyncio.sleep(0)
        assert not waiter.done()  # over budget: waits
        budget.release(bufs[0])
        got = await asyncio.wait_for(waiter, 5)
        assert got is bufs[0]  # reused, not reallocated
        # A bigger buffer evicts idle ones instead of waiting forever.
        budget.release(got)
        budget.release(bufs[1])
        budget.release(bufs[2])
        big = await asyncio.wait_for(budget.buffer(250), 5)
        assert len(big) == 250 and budget.counted <= 300
        # A buffer bigger than the whole budget is granted once nothing else is held, never clipped.
        waiter = asyncio.create_task(budget.buffer(1000))
        await asyncio.sleep(0)
        assert not waiter.done()
        budget.release(big)
        huge = await asyncio.wait_for(waiter, 5)
        assert len(huge) == 1000

    asyncio.run(scenario())


def test_a_worker_keeps_a_closed_sessions_buffers_for_the_next_and_a_library_keeps_none() -> None:
    """A split file's worker runs one range task's session after another: the next one's blocks land in the pages
    the last one touched (blobsync's own workers keep them, up to a limit); elsewhere a closed budget drops them."""
    from blobsync.engine.budget import WARM

    block = 2 * MiB

    async def session(n: int) -> list[object]:
        budget = MemoryBudget(8 * block)
        bufs = [await budget.buffer(block) for _ in range(n)]
        for buf in bufs:
            budget.release(buf)
        budget.close()
        return bufs

    assert WARM.limit == 0  # the suite's own process is a library's host
    try:
        first = asyncio.run(session(3))
        assert not {id(b) for b in asyncio.run(session(3))} & {id(b) for b in first}  # none kept
        WARM.keep(2 * block)  # as a --processes worker does
        first = asyncio.run(session(3))
        again = asyncio.run(session(3))
        assert len({id(b) for b in again} & {id(b) for b in first}) == 2  # the limit's worth reused, the rest new
        budget = MemoryBudget(8 * block)
        other = asyncio.run(budget.buffer(block // 2))  # another size: a new buffer, never a kept one cut down
        assert len(other) == block // 2
    finally:
        WARM.keep(0)
        WARM.give([])


def test_request_limiter_backs_off_and_recovers() -> None:
    from blobsync.engine.budget import RequestLimiter

    now = [0.0]
    limiter = RequestLimiter(16, clock=lambda: now[0])
    limiter.on_throttled()
    assert limiter.limit == 8
    limiter.on_throttled()  # the same burst: not cut again within a second
    assert limiter.limit == 8
    now[0] = 1.5
    limiter.on_throttled()
    assert (limiter.limit, limiter.lowest, limiter.throttled) == (4, 4, 3)

    async def succeed(times: int) -> None:
        for _ in range(times):
            await limiter.on_success()

    asyncio.run(succeed(4))  # a limit's worth of successes: one more slot
    assert limiter.limit == 5
    asyncio.run(succeed(1000))
    assert limiter.limit == 16  # never above the configured maximum



def test_request_slots_hold_the_limit_in_arrival_order_through_cancels_and_limit_moves() -> None:
    from blobsync.engine.budget import RequestLimiter

    async def scenario() -> None:
        limiter = RequestLimiter(2, maximum=8)
        order: list[int] = []
        peak = [0]
        gates = {i: asyncio.Event() for i in range(8)}

        async def request(i: int) -> None:
            async with limiter.slot():
                order.append(i)
                peak[0] = max(peak[0], limiter.active)
                await gates[i].wait()

        tasks = {i: asyncio.create_task(request(i)) for i in range(8)}
        await asyncio.sleep(0)
        assert order == [0, 1] and limiter.active == 2  # the others wait
        tasks[2].cancel()  # a waiter that gives up takes no slot and blocks no one
        await asyncio.sleep(0)
        gates[0].set()
        for _ in range(3):
            await asyncio.sleep(0)
        assert order == [0, 1, 3]  # first come, first served
        gates[3].set()
        tasks[4].cancel()  # woken (3 left) and cancelled before it ran: its turn passes on
        for _ in range(3):
            await asyncio.sleep(0)
        assert order == [0, 1, 3, 5]
        await limiter.set_target(4)  # more slots wake as many waiters
        for _ in range(3):
            await asyncio.sleep(0)
        assert order == [0, 1, 3, 5, 6, 7] and limiter.active == 4
        limiter.on_throttled()  # a cut: no new request starts until the active ones fall under it
        for i in (1, 5, 6, 7):
            gates[i].set()
        await asyncio.gather(*(t for i, t in tasks.items() if i not in (2, 4)))
        assert limiter.active == 0 and peak[0] == 4 and limiter.finished == 6

    async def no_stealing() -> None:
        # A slot freed for a woken waiter is its own until it runs: a request asking in that same step queues.
        limiter = RequestLimiter(1)
        order: list[str] = []

        async def twice() -> None:
            async with limiter.slot():
                order.append("a")
                await asyncio.sleep(0)  # b queues meanwhile
            async with limiter.slot():  # asks right after its release woke b, before b ran
                order.append("c")

        async def once() -> None:
            async with limiter.slot():
                order.append("b")

        await asyncio.gather(twice(), once())
        assert order == ["a", "b", "c"] and limiter.active == 0

    asyncio.run(scenario())
    asyncio.run(no_stealing())

def test_a_thread_job_keeps_its_buffer_however_often_the_caller_is_cancelled() -> None:
    # The buffer goes back to the pool when the awaiting call returns; a second cancellation arriving while it
    # waits for the thread (a gather cancelling its children, then the parent cancelling them again) must not
    # let it return while the thread still reads the buffer.
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from blobsync.engine.tasks import in_thread

    buf = bytearray(b"x" * 1024)
    started, seen = threading.Event(), []

    def job(view: memoryview) -> None:
        started.set()
        time.sleep(0.3)
        seen.append(bytes(view[:1]))  # raises ValueError if the view was released meanwhile

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as pool:
            view = memoryview(buf)
            task = asyncio.ensure_future(in_thread(pool, job, view))
            await loop.run_in_executor(None, started.wait)
            t0 = time.monotonic()
            for _ in range(3):
                task.cancel()
                await asyncio.sleep(0.02)
            with pytest.raises(asyncio.CancelledError):
                await task
            view.release()
            return time.monotonic() - t0

    waited = asyncio.run(scenario())
    assert seen == [b"x"] and waited >= 0.2
