"""A tiny run of the benchmark harness (bench/run.py), so it keeps working; the real runs are by hand, never CI.

It needs only blobsync, the SDK and the pinned Azurite: rclone, obstore and network namespaces are not used.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "bench" / "run.py"
AZURITE_BIN = REPO / ".tools/azurite/node_modules/.bin/azurite-blob"
BLOBSYNC_BIN = REPO / ".venv/bin/blobsync"

pytestmark = pytest.mark.skipif(
    not (os.access(AZURITE_BIN, os.X_OK) and os.access(BLOBSYNC_BIN, os.X_OK)),
    reason="needs scripts/setup.sh (pinned Azurite, .venv with blobsync)",
)


@pytest.mark.timeout(180)
def test_harness_smoke_run(tmp_path: Path) -> None:
    report, raw = tmp_path / "report.md", tmp_path / "runs.json"
    cmd = [
        sys.executable, str(RUN), "upload-large", "upload-small", "noop-sync", "throttled", "delta",
        "--large-mib", "4", "--small-files", "20", "--noop-files", "50", "--repeat", "1",
        "--tools", "blobsync,sdk,minimal", "--quick", "--markdown",
        "--cache-dir", str(tmp_path / "cache"), "--out", str(report), "--json", str(raw), "--timeout", "120",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=170, cwd=REPO)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"

    runs = json.loads(raw.read_text())
    assert set(runs) == {"upload-large", "upload-small", "noop-sync", "throttled", "delta"}
    assert runs["upload-large"]["tools"] == ["blobsync", "sdk", "minimal"]  # the reference: a file or a tree up
    assert runs["upload-small"]["tools"] == ["blobsync", "sdk", "minimal"]
    assert runs["noop-sync"]["tools"] == runs["delta"]["tools"] == ["blobsync"]  # the SDK has no sync
    assert runs["throttled"]["tools"] == ["blobsync", "sdk"]
    assert all(r["extra"]["requests"] >= 2 for r in runs["throttled"]["runs"])  # it went through the proxy
    for name, data in runs.items():
        assert data["runs"], name
        for r in data["runs"]:
            assert r["valid"], (name, r["tool"], r["error"])
            assert 0 < r["wall_s"] < 120, (name, r)
            assert 0 < r["cpu_s"] < 120, (name, r)
            assert 10 < r["rss_mib"] < 2048, (name, r)  # a Python client's own peak, not the harness's
            assert math.isfinite(r["azurite_cpu_s"]) and r["azurite_cpu_s"] >= 0, (name, r)

    text = report.read_text()
    for heading in ("#### `upload-large`", "#### `upload-small`", "#### `noop-sync`"):
        assert heading in text
    assert "| Tool | Valid runs | Wall s | MB/s |" in text
    assert "| blobsync | 1/1 |" in text and "| sdk | 1/1 |" in text and "| minimal | 1/1 |" in text
    assert "Against the targets" in text
    assert "blobsync / sdk, files/s" in text  # a ratio row of upload-small
    assert "Azurite" in text and "2-core" in text  # every report says what bounds its figures
