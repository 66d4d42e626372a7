"""The one retry policy: which errors are retried, how long to wait (backoff, jitter, Retry-After), how often."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from blobsync.errors import TransientError

if TYPE_CHECKING:
    from tenacity import RetryCallState

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Per-request limits. Every transient failure of one request retries that request only."""

    max_attempts: int = 9  # the first try plus 8 retries
    base_delay: float = 0.25
    max_delay: float = 30.0
    deadline: float = 900.0  # seconds from the first try; a request never retries past this
    max_retry_after: float = 600.0  # honour the service's Retry-After up to this


def backoff_delay(policy: RetryPolicy, attempt: int, error: BaseException | None,
                  rng: Callable[[float, float], float] = random.uniform) -> float:
    """Full-jitter exponential backoff, never shorter than a Retry-After the service sent."""
    ceiling = min(policy.max_delay, policy.base_delay * (2 ** max(0, attempt - 1)))
    delay = rng(0.0, ceiling)
    retry_after = getattr(error, "retry_after", None)
    if retry_after is not None:
        delay = max(delay, min(float(retry_after), policy.max_retry_after))
    return delay


class Retrier:
    """Runs request attempts under a RetryPolicy and counts the retries it made."""

    def __init__(self, policy: RetryPolicy, on_retry: Callable[[BaseException, float], None] | None = None):
        self.policy = policy
        self.retries = 0
        self._on_retry = on_retry

    def note(self, error: BaseException) -> None:
        """Count a retry the caller made itself (a whole file fetched again)."""
        self.retries += 1
        if self._on_retry is not None:
            self._on_retry(error, 0.0)

    def _wait(self, state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        return backoff_delay(self.policy, state.attempt_number + 1, error)  # the bare first try came before

    def _before_sleep(self, state: RetryCallState) -> None:
        self.retries += 1
        if self._on_retry is not None and state.outcome is not None:
            error = state.outcome.exception()
            if error is not None:
                self._on_retry(error, state.upcoming_sleep)

    async def call(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """Await `attempt()` until it succeeds, fails with a non-transient error, or the policy gives up."""
        # The first try runs bare: setting up a tenacity loop costs more CPU than a small Put Blob, and
        # almost every request succeeds at once. Tenacity takes over from the first transient failure.
        started = time.monotonic()
        try:
            return await attempt()
        except TransientError as exc:
            if self.policy.max_attempts <= 1:
                raise
            first = exc
        delay = backoff_delay(self.policy, 1, first)
        self.retries += 1
        if self._on_retry is not None:
            self._on_retry(first, delay)
        await asyncio.sleep(delay)
        # Imported here, at the first failure: a run without one never needs it (~5 ms of start-up).
        from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, stop_after_delay

        remaining = self.policy.deadline - (time.monotonic() - started)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.policy.max_attempts - 1) | stop_after_delay(max(0.0, remaining)),
            wait=self._wait,
            retry=retry_if_exception_type(TransientError),
            before_sleep=self._before_sleep,
            reraise=True,
        )

        async def again() -> T:
            # A coroutine function of our own: tenacity decides sync or async by inspecting what it is
            # given, and an `attempt` that is a lambda or a callable object returning an awaitable looks
            # sync to it (it would hand back the coroutine unrun).
            return await attempt()

        return await retrying(again)
