"""A throw-away S3 service for tests: moto's server (from PyPI) on a free port of 127.0.0.1, its own process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from support.azurite import free_port
from support.processes import LONG_LIVED

ACCESS_KEY = "blobsync-test-key"
SECRET_KEY = "blobsync-test-secret-0123456789"  # moto accepts any pair; the SigV4 signature is still checked
MOTO_SERVER = Path(sys.executable).with_name("moto_server")


class MotoS3:
    """`with MotoS3() as s3:` then `s3.env` (what blobsync reads) and `s3.client()` (boto3, the independent check)."""

    host = "127.0.0.1"

    def __init__(self) -> None:
        self.port = free_port(self.host)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1"}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1")

    def start(self) -> None:
        env = {**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}
        self._proc = subprocess.Popen([str(MOTO_SERVER), "-H", self.host, "-p", str(self.port)], env=env,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True)
        LONG_LIVED.add(self._proc.pid)
        deadline = time.monotonic() + 30
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with code {self._proc.returncode}")
            with socket.socket() as s:
                s.settimeout(1.0)
                if s.connect_ex((self.host, self.port)) == 0:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"moto_server did not listen on {self.endpoint} within 30 s")
            time.sleep(0.05)  # polling the port, not a synchronisation sleep

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        LONG_LIVED.discard(proc.pid)

    def __enter__(self) -> MotoS3:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
