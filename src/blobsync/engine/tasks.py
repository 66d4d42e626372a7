"""Groups of asyncio tasks: wait for all, on a failure cancel the rest and collect every outcome; bounded pools;
work handed to a thread that is waited for even when cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Collection, Iterable
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")


async def in_thread(pool: Executor, fn: Callable[..., T], *args: object) -> T:
    """Run `fn(*args)` in `pool`; if cancelled meanwhile (even repeatedly), still wait for the thread: it uses
    the caller's buffer, which the caller frees once this returns."""
    future = asyncio.get_running_loop().run_in_executor(pool, fn, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            try:
                await asyncio.wait([future])
            except asyncio.CancelledError:
                continue
        if not future.cancelled():
            future.exception()  # seen: the cancellation is what this call reports
        raise


def raise_first_failure(tasks: set[asyncio.Task[Any]]) -> None:
    """Drop finished tasks from `tasks`, raising the first failure among them (a failed part stops its file
    now, not after the rest was read)."""
    for task in [t for t in tasks if t.done()]:
        tasks.discard(task)
        task.result()


async def gather_or_cancel(tasks: Collection[asyncio.Future[Any]]) -> None:
    """Wait for every task; on the first failure cancel the rest and raise that failure."""
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                await cancel_all(tasks)
                task.result()


async def cancel_all(tasks: Collection[asyncio.Future[Any]]) -> None:
    """Cancel what still runs and collect every outcome, so no failure is left 'never retrieved'."""
    live = [t for t in tasks if not t.done()]
    for task in live:
        task.cancel()
    if live:
        await asyncio.wait(live)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # marks it retrieved; the first failure is raised by the caller


async def for_each(items: Iterable[T] | AsyncIterable[T], fn: Callable[[T], Awaitable[None]], workers: int) -> None:
    """`fn(item)` for every item, at most `workers` at once, each worker taking the next item when it is free.

    Only the items being worked on are held, never the whole list: `items` may be a lazy listing or a cursor
    over millions of rows. The first failure cancels the rest and is raised."""
    source: AsyncIterator[T] = aiter(items) if isinstance(items, AsyncIterable) else _async(items)
    lock = asyncio.Lock()  # an async generator must not be advanced by two workers at once
    done = False

    async def worker() -> None:
        nonlocal done
        while not done:
            async with lock:
                if done:
                    return
                try:
                    item = await anext(source)
                except StopAsyncIteration:
                    done = True
                    return
            await fn(item)

    tasks = [asyncio.create_task(worker()) for _ in range(max(1, workers))]
    try:
        await gather_or_cancel(tasks)
    except BaseException:
        await cancel_all(tasks)
        raise
    finally:
        closer = getattr(source, "aclose", None)
        if closer is not None:
            await closer()


async def _async(items: Iterable[T]) -> AsyncIterator[T]:
    for item in items:
        yield item
