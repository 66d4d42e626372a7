"""One fresh Azurite blob service per run: in memory (default) or on disk, on 127.0.0.1 or inside a namespace."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness.measure import die_with_parent, group_cpu_seconds, kill_group, tail

REPO = Path(__file__).resolve().parents[2]
AZURITE_BIN = REPO / ".tools/azurite/node_modules/.bin/azurite-blob"

# Azurite's well-known development account (public, documented, not a secret).
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
# A second account of the same instance (copies between accounts, bench/s2s.py); its key is made up here.
SECOND_ACCOUNT = "blobsyncsecond"
SECOND_KEY = "c2Vjb25kLWFjY291bnQta2V5LWZvci1ibG9ic3luYy10ZXN0cy0wMDAwMDAwMDA="
HOST = "127.0.0.1"  # the only host-side address the benchmark ever talks to


class BenchError(RuntimeError):
    """A set-up problem the user must fix (missing Azurite, missing venv, ...)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def connection_string(blob_endpoint: str) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};BlobEndpoint={blob_endpoint};"
    )


class Azurite:
    """One fresh Azurite blob service in its own process group.

    `netns`: run it inside that network namespace (reached through a proxy there); `in_memory=False` keeps the
    data on disk under `workdir` (for uploads larger than memory allows).
    """

    def __init__(
        self, workdir: Path, *, netns: str | None = None, in_memory: bool = True, startup_timeout: float = 60.0
    ) -> None:
        self.workdir = workdir
        self.netns = netns
        self.in_memory = in_memory
        self.port = 10001 if netns else free_port()  # a fresh namespace has every port free
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def blob_endpoint(self) -> str:
        return f"http://{HOST}:{self.port}/{DEV_ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return connection_string(self.blob_endpoint)

    @property
    def log(self) -> Path:
        return self.workdir / "azurite.log"

    def start(self) -> None:
        if not os.access(AZURITE_BIN, os.X_OK):
            raise BenchError(f"Azurite not found at {AZURITE_BIN}: run scripts/setup.sh to install it project-locally")
        cmd = [
            str(AZURITE_BIN),
            "--blobHost", HOST,
            "--blobPort", str(self.port),
            "--skipApiVersionCheck",  # the SDK may be newer than this Azurite release
            "--loose",  # ignore headers Azurite does not implement instead of failing the request
            "--silent",  # an access log line per request would cost Azurite CPU
            "--disableTelemetry",  # telemetry would try to reach the internet
        ]  # fmt: skip
        if self.in_memory:
            cmd.append("--inMemoryPersistence")  # nothing touches the disk, so the disk is never the bottleneck
        else:
            (self.workdir / "azurite-data").mkdir(exist_ok=True)
            cmd += ["--location", str(self.workdir / "azurite-data")]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]  # ip execs node: the pid stays node's
        env = {**os.environ, "AZURITE_ACCOUNTS": f"{DEV_ACCOUNT}:{DEV_KEY};{SECOND_ACCOUNT}:{SECOND_KEY}"}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                cwd=self.workdir,  # Azurite's default location; it may write its debug/log files there
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: stop() kills node and anything it spawned
                preexec_fn=die_with_parent,
            )
        try:
            self._wait_until_listening()
        except BaseException:
            self.stop()
            raise

    def _listening(self) -> bool:
        if self.netns:  # not reachable from here: Azurite says so in its log
            return "successfully listens" in tail(self.log)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            return s.connect_ex((HOST, self.port)) == 0

    def _wait_until_listening(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while not self._listening():
            if self.proc.poll() is not None:
                raise BenchError(f"Azurite exited with code {self.proc.returncode}:\n{tail(self.log)}")
            if time.monotonic() > deadline:
                raise BenchError(f"Azurite did not listen on port {self.port} within {self.startup_timeout:.0f} s")
            time.sleep(0.05)  # port polling interval

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return group_cpu_seconds(self.proc.pid)

    def peak_rss_mib(self) -> float:
        """Azurite's high-water RSS (VmHWM), to show how much the in-memory store holds."""
        assert self.proc is not None
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        kill_group(proc.pid)  # SIGKILL whatever is left, including stragglers if the leader already exited
        proc.wait()

    def __enter__(self) -> Azurite:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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

    def __init__(self, workdir: Path, seeds: tuple[str, ...] = (), netns: str | None = None, **kwargs: object) -> None:
        super().__init__(workdir, netns=netns)
        self.seeds = seeds

    def _listening(self) -> bool:
        if self.netns:
            return "null server listening" in tail(self.log)
        return super()._listening()

    def start(self) -> None:
        script = Path(__file__).resolve().parent / "nullserver.py"
        cmd = [sys.executable, str(script), "--port", str(self.port), *(f"--seed={s}" for s in self.seeds)]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)
        try:
            self._wait_until_listening()
        except BaseException:
            self.stop()
            raise
