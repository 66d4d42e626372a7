"""Ranks of a real gloo process group as processes of their own, for the blobsync.torch tests: the test side starts
them and collects what each found; the rank side (a script under support/) reads its arguments and writes its
result. A rank still running when the test ends is killed with its process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
SRC = str(TESTS.parent / "src")


def start(script: Path, args: dict[str, Any], rank: int, world: int, port: int, out: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, str(TESTS), str(script.parent)]), "OMP_NUM_THREADS": "1"}
    given = {**args, "rank": rank, "world": world, "port": port, "out": str(out)}
    return subprocess.Popen([sys.executable, str(script), json.dumps(given)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def run(script: Path, args: dict[str, Any], world: int, tmp: Path, timeout: float = 240) -> list[Any]:
    """Run `world` ranks of `script` to the end; each one's result, by rank."""
    from support.azurite import free_port

    out, port = tmp / f"result-{time.monotonic_ns()}", free_port()
    procs = [start(script, args, rank, world, port, out) for rank in range(world)]
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(world)]


def rank_main(work: Callable[[dict[str, Any]], Any]) -> None:
    """A rank script's entry: its arguments from argv, its result to the file the test reads, then out at once
    (gloo's threads can hold a clean exit up)."""
    given = json.loads(sys.argv[1])
    result = work(given)
    Path(given["out"] + f".{given['rank']}").write_text(json.dumps(result), encoding="utf-8")
    sys.stdout.flush()
    os._exit(0)
