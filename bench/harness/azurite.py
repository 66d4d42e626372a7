"""One fresh Azurite blob service per run (the tests' launcher): in memory or on disk, on 127.0.0.1 or in a netns."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

from harness.measure import group_cpu_seconds

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))  # one Azurite launcher for the tests and the benchmark

import support.azurite as support_azurite  # noqa: E402
from support.azurite import (  # noqa: E402
    AZURITE_BIN,
    DEV_ACCOUNT as DEV_ACCOUNT,
    DEV_KEY as DEV_KEY,
    SECOND_ACCOUNT as SECOND_ACCOUNT,
    SECOND_KEY as SECOND_KEY,
)

HOST = "127.0.0.1"  # the only host-side address the benchmark ever talks to


class BenchError(RuntimeError):
    """A set-up problem the user must fix (missing Azurite, missing venv, ...)."""


def free_port() -> int:
    return support_azurite.free_port(HOST)


def connection_string(blob_endpoint: str) -> str:
    return support_azurite.connection_string(blob_endpoint)


class Azurite(support_azurite.Azurite):
    """The tests' launcher (tests/support/azurite.py), with the benchmark's workdir, its CPU and memory counted.

    `netns`: run it inside that network namespace (reached through a proxy there); `in_memory=False` keeps the
    data on disk under `workdir` (for uploads larger than memory allows)."""

    def __init__(self, workdir: Path, *, netns: str | None = None, in_memory: bool = True,
                 startup_timeout: float = 60.0) -> None:
        super().__init__(workdir=workdir, netns=netns, in_memory=in_memory, startup_timeout=startup_timeout)

    def start(self) -> None:
        try:
            super().start()
        except support_azurite.AzuriteError as exc:
            raise BenchError(str(exc)) from exc

    def cpu_seconds(self) -> float:
        return group_cpu_seconds(self.pid)

    def peak_rss_mib(self) -> float:
        """The server's high-water RSS (VmHWM), to show how much the in-memory store holds."""
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def __enter__(self) -> Azurite:
        self.start()
        return self


def azurite_version() -> str:
    try:
        return subprocess.run(
            [str(AZURITE_BIN), "--version"], capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class NullServer(Azurite):
    """bench/harness/nullserver.py in Azurite's place: it keeps sizes and declared MD5s, never the bytes, so what
    is measured is the client alone (uploads, and downloads of zero-filled blobs named in `seeds`)."""

    ready_line = "null server listening"

    def __init__(self, workdir: Path, seeds: tuple[str, ...] = (), netns: str | None = None, keep: bool = False,
                 processes: int = 1, **kwargs: object) -> None:
        super().__init__(workdir, netns=netns)
        self.seeds = seeds
        self.keep = keep  # the bytes kept: GETs return what was put (nullserver.py --keep)
        self.processes = processes  # server processes sharing the port and one store (a client faster than a core)

    def command(self) -> list[str]:
        script = Path(__file__).resolve().parent / "nullserver.py"
        return [sys.executable, str(script), "--port", str(self.port), *(f"--seed={s}" for s in self.seeds),
                *(["--keep"] if self.keep else []), "--processes", str(self.processes)]


class ListServer(Azurite):
    """bench/harness/listserver.py in Azurite's place: every container holds the same `objects` generated blobs in
    `folders` folders, each list page answered after `latency_ms` (issue 52's scale measurements)."""

    ready_line = "list server listening"

    def __init__(self, workdir: Path, objects: int, folders: int, latency_ms: float, **kwargs: object) -> None:
        super().__init__(workdir)
        self.objects, self.folders, self.latency_ms = objects, folders, latency_ms

    def command(self) -> list[str]:
        script = Path(__file__).resolve().parent / "listserver.py"
        return [sys.executable, str(script), "--port", str(self.port), "--objects", str(self.objects),
                "--folders", str(self.folders), "--latency-ms", str(self.latency_ms)]
