"""Start, stop and restart a throw-away Azurite blob service: the one launcher of the tests and of bench/."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from types import TracebackType

from support.processes import LONG_LIVED

REPO_ROOT = Path(__file__).resolve().parents[2]
AZURITE_BIN = REPO_ROOT / ".tools/azurite/node_modules/.bin" / ("azurite-blob.cmd" if os.name == "nt"
                                                               else "azurite-blob")

# The well-known development-storage account baked into Azurite (public, not a secret).
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
# A second account of the same instance (blob-to-blob copies between accounts); its key is made up here.
SECOND_ACCOUNT = "blobsyncsecond"
SECOND_KEY = "c2Vjb25kLWFjY291bnQta2V5LWZvci1ibG9ic3luYy10ZXN0cy0wMDAwMDAwMDA="

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free a moment ago (the OS picks it, so collisions are unlikely)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def connection_string(blob_endpoint: str, account: str = DEV_ACCOUNT, key: str = DEV_KEY) -> str:
    """Build a Shared Key connection string for ``blob_endpoint`` (e.g. a proxy in front of Azurite)."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};BlobEndpoint={blob_endpoint};"
    )


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGKILL Azurite if the test process
    # dies without running its cleanup (e.g. pytest itself is SIGKILLed), so node never outlives us.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class AzuriteError(RuntimeError):
    """Azurite is not installed or did not come up."""


class Azurite:
    """One Azurite blob-service process listening on 127.0.0.1, with all data held in memory.

    The benchmark's options: `workdir` (its log and data stay there; else a private temp dir removed at stop),
    `in_memory=False` (the data on disk under `workdir`, for more than memory holds), `netns` (run inside that
    network namespace, on port 10001, reached through the namespace's own link)."""

    host = "127.0.0.1"
    account = DEV_ACCOUNT
    key = DEV_KEY

    def __init__(self, port: int | None = None, *, startup_timeout: float = 30.0,
                 tls: tuple[Path, Path] | None = None, workdir: Path | None = None, in_memory: bool = True,
                 netns: str | None = None, oauth: bool = False) -> None:
        self._oauth = oauth  # accept Azure AD bearer tokens (Azurite checks their claims, not their signature)
        self._port = 10001 if netns and port is None else port  # a fresh namespace has every port free
        self._tls = tls  # (certificate, key) PEM files: serve HTTPS
        self._startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self._given_workdir = workdir
        self._in_memory = in_memory
        self.netns = netns
        self._finalizer: weakref.finalize[..., Azurite] | None = None

    # -- addresses ---------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._port is None:
            raise AzuriteError("Azurite has not been started yet, so it has no port")
        return self._port

    @property
    def blob_endpoint(self) -> str:
        return f"{self.base_url}/{self.account}"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` without the account segment (what FaultProxy forwards to)."""
        return f"{'https' if self._tls else 'http'}://{self.host}:{self.port}"

    @property
    def connection_string(self) -> str:
        return connection_string(self.blob_endpoint, self.account, self.key)

    @property
    def second_connection_string(self) -> str:
        """The instance's second account (another account's containers, for copies between accounts)."""
        return connection_string(f"{self.base_url}/{SECOND_ACCOUNT}", SECOND_ACCOUNT, SECOND_KEY)

    def connection_string_via(self, blob_endpoint: str) -> str:
        """Connection string with this account's credentials but another endpoint (e.g. a proxy)."""
        return connection_string(blob_endpoint, self.account, self.key)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle -----------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        """The process (and process group) id of the running service."""
        if self._proc is None:
            raise AzuriteError("Azurite is not running")
        return self._proc.pid

    @property
    def log(self) -> Path:
        assert self._workdir is not None, "started"
        return self._workdir / "azurite.log"

    def command(self) -> list[str]:
        """The service's command line (a subclass may start another server in its place)."""
        if not os.access(AZURITE_BIN, os.X_OK):
            raise AzuriteError(
                f"Azurite not found at {AZURITE_BIN}; run scripts/setup.sh to install it project-locally"
            )
        cmd = [
            str(AZURITE_BIN),
            "--blobHost", self.host,
            "--blobPort", str(self.port),
            "--skipApiVersionCheck",  # the SDK may be newer than this Azurite release
            "--loose",  # ignore headers/params Azurite does not implement instead of failing
            "--silent",  # an access log line per request would cost Azurite CPU
            "--disableTelemetry",  # telemetry would try to reach the internet
        ]  # fmt: skip
        if self._in_memory:
            cmd.append("--inMemoryPersistence")  # nothing touches the disk, so the disk is never the bottleneck
        else:
            assert self._workdir is not None
            (self._workdir / "azurite-data").mkdir(exist_ok=True)
            cmd += ["--location", str(self._workdir / "azurite-data")]
        if self._tls:
            cmd += ["--cert", str(self._tls[0]), "--key", str(self._tls[1])]
        if self._oauth:
            cmd += ["--oauth", "basic"]
        return cmd

    def start(self) -> None:
        if self._proc is not None:
            raise AzuriteError("Azurite is already running")
        if self._port is None:
            self._port = free_port(self.host)
        # Azurite refuses --location together with --inMemoryPersistence, so instead its cwd (the default
        # location) is a private temp dir: if it writes anything (its log does) stop() removes it.
        self._workdir = self._given_workdir or Path(tempfile.mkdtemp(prefix="blobsync-azurite-"))
        cmd = self.command()
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]  # ip execs the server: the pid stays the server's
        on_main_thread = threading.current_thread() is threading.main_thread()
        log = self.log.open("wb")
        env = {**os.environ, "AZURITE_ACCOUNTS": f"{DEV_ACCOUNT}:{DEV_KEY};{SECOND_ACCOUNT}:{SECOND_KEY}"}
        try:
            self._proc = subprocess.Popen(
                cmd,
                cwd=self._workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: stop() can kill node and anything it spawns
                # PDEATHSIG is tied to the *thread* that forked, so only use it from the main thread,
                # otherwise Azurite would die when a short-lived helper thread ends.
                preexec_fn=_die_with_parent if on_main_thread else None,
            )
        finally:
            log.close()
        LONG_LIVED.add(self._proc.pid)
        # Backstop for interpreter exit without stop(); detached by stop().
        self._finalizer = weakref.finalize(self, _kill_group, self._proc.pid)
        try:
            self._wait_until_listening()
        except BaseException:
            self.stop()
            raise

    ready_line = "successfully listens"  # what the log says once it serves (seen from outside a namespace)

    def listening(self) -> bool:
        if self.netns:  # not reachable from here: the log says it
            return self.ready_line in self._log_tail()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            return s.connect_ex((self.host, self.port)) == 0

    def _wait_until_listening(self) -> None:
        assert self._proc is not None and self._workdir is not None
        deadline = time.monotonic() + self._startup_timeout
        while True:
            if self._proc.poll() is not None:
                raise AzuriteError(f"Azurite exited with code {self._proc.returncode}:\n{self._log_tail()}")
            if self.listening():
                return
            if time.monotonic() > deadline:
                raise AzuriteError(
                    f"Azurite did not listen on {self.host}:{self.port} within {self._startup_timeout}s:\n"
                    f"{self._log_tail()}"
                )
            time.sleep(0.05)  # polling interval for the port, not a synchronisation sleep

    def _log_tail(self) -> str:
        if self._workdir is None:
            return ""
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it if it has not exited after ``timeout`` seconds."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)
            # Also reaps any straggler in the group even if the leader exited cleanly.
            _kill_group(proc.pid)
            proc.wait()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._workdir is not None and self._given_workdir is None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None

    def kill(self) -> None:
        """Stop abruptly (SIGKILL, no graceful shutdown), like a crashed service."""
        self.stop(timeout=0)

    def restart(self, *, graceful: bool = False) -> None:
        """Stop and start again on the same port; in-memory data (containers, blobs) is lost."""
        if graceful:
            self.stop()
        else:
            self.kill()
        self.start()

    def __enter__(self) -> Azurite:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
