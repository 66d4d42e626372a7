"""The blocking API called where an event loop already runs (a notebook cell, an async framework): an interrupt
stops the job within a second, not after the whole transfer, and leaves it resumable (issue 26, point 12).
A real running loop in a child process, a real SIGINT."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import blobsync
from blobsync import TransferConfig
from blobsync.config import MiB
from conftest import ContainerHandle
from support.cli import random_file
from support.processes import as_from_a_terminal

_HOST = '''
import asyncio, sys, time
from pathlib import Path
import blobsync

class Started(blobsync.BaseSubscriber):
    said = False
    def on_progress(self, rel, nbytes):
        if not self.said:
            self.said = True
            print("moving", flush=True)

def cell():
    config = blobsync.TransferConfig.from_mib(block_size_mb=1, cap_mbps=8, journal_path=Path(sys.argv[3]))
    blobsync.copy(sys.argv[1], sys.argv[2], config, subscribers=[Started()])

async def main():
    cell()  # blocking, inside the running loop: what a notebook cell does

try:
    if sys.argv[4] == "asyncio.run":
        asyncio.run(main())
    else:  # a loop without asyncio.run's SIGINT handler: the interrupt arrives as KeyboardInterrupt
        asyncio.new_event_loop().run_until_complete(main())
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
print("finished", flush=True)
'''


@pytest.mark.parametrize("host", ["asyncio.run", "run_until_complete"])
def test_an_interrupt_inside_a_running_loop_stops_the_job_at_once_and_it_resumes(
        container: ContainerHandle, tmp_path: Path, host: str) -> None:
    data = random_file(tmp_path / "big.bin", 24 * MiB, seed=8)  # ~25 s at the 8 Mbit/s cap
    script = tmp_path / "host.py"
    script.write_text(_HOST)
    url = f"{container.url}/big.bin"
    journal = tmp_path / "j.db"
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "big.bin"), url, str(journal), host],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_from_a_terminal)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "moving"
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        stopped_after = time.monotonic() - sent
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 130 and "interrupted" in out, (out, err)
    assert stopped_after < 5, stopped_after  # the rest of the transfer would take ~20 s more
    assert "Traceback" not in err
    report = blobsync.copy(tmp_path / "big.bin", url, TransferConfig.from_mib(block_size_mb=1, journal_path=journal))
    assert report.files_failed == 0
    assert 0 < report.bytes_sent < len(data)  # resumed: what was acknowledged before the interrupt is not re-sent
    assert container.download("big.bin") == data
