"""Groups of asyncio tasks: wait for all, and on a failure cancel the rest and collect every outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any


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
