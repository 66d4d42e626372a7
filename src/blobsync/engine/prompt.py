"""--overwrite prompt: one question at a time about a file that exists, with 'all' and 'none' remembered."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from blobsync.options import Answer as Answer


class OverwritePrompt:
    """Asks `ask(description)` in a worker thread (it may block on a terminal), one file at a time."""

    def __init__(self, ask: Callable[[str], Answer]) -> None:
        self._ask = ask
        self._lock = asyncio.Lock()
        self._always: bool | None = None

    async def __call__(self, description: str) -> bool:
        """True to overwrite the file `description` names."""
        async with self._lock:
            if self._always is not None:
                return self._always
            answer = await asyncio.to_thread(self._ask, description)
            if answer in (Answer.ALL, Answer.NONE):
                self._always = answer is Answer.ALL
            return answer in (Answer.YES, Answer.ALL)
