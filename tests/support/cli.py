"""Helpers to run blobsync as a real process (for crash and CLI tests) and to make test files."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from support.processes import as_from_a_terminal
from support.proxy import FaultProxy


def blobsync_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "blobsync", *args]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test process's environment without Azure credentials, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_STORAGE")}
    env.update(extra or {})
    return env


def run(args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 120,
        **kwargs: object) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("preexec_fn", as_from_a_terminal)
    return subprocess.run(blobsync_cmd(*args), env=clean_env(env), capture_output=True, text=True,
                          timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload, no-any-return]


def start(args: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """blobsync as a command typed at a terminal (SIGINT at its default); the conftest guard kills it if the
    test does not."""
    return subprocess.Popen(blobsync_cmd(*args), env=clean_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal)


def random_file(path: Path, size: int, seed: int = 0) -> bytes:
    """Write `size` pseudo-random bytes (fast, deterministic per seed) and return them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    chunks = []
    counter = 0
    remaining = size
    while remaining > 0:
        block = hashlib.sha512(f"{seed}:{counter}".encode()).digest() * 512  # 32 KiB
        chunks.append(block[:remaining])
        remaining -= len(chunks[-1])
        counter += 1
    data = b"".join(chunks)
    path.write_bytes(data)
    return data


def kill_when_held(args: Sequence[str], proxy: FaultProxy, env: Mapping[str, str] | None = None, *,
                   until: Callable[[], bool] | None = None, linger: float = 0.0) -> None:
    """Start blobsync, SIGKILL it once the proxy holds one of its requests (and `until()` holds, then `linger`
    seconds more), and settle the proxy.

    Afterwards nothing of the killed run is in flight or still being counted (wait_idle), so the test can
    reset the proxy's stats and measure a second run alone."""
    proc = start(args, env)
    try:
        proxy.wait_for_held(1, timeout=60)
        if until is not None:
            proxy.wait_until(until)
        time.sleep(linger)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    proxy.clear_rules()
    proxy.release_holds()  # the client is gone: held requests are dropped, never forwarded
    proxy.wait_idle()
