"""The real AzCopy as a peer: where scripts/setup.sh put it, whether it runs here, and running it in a sandbox."""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from support.azurite import REPO_ROOT

AZCOPY_BIN = REPO_ROOT / ".tools/azcopy/node_modules/@azure-tools/azcopy-linux/dist/bin/azcopy_linux_amd64"


@functools.cache
def azcopy_missing() -> str | None:
    """None when AzCopy runs here, else why not (the reason a skipped test gives)."""
    if not AZCOPY_BIN.is_file():
        return f"AzCopy is not installed ({AZCOPY_BIN.relative_to(REPO_ROOT)}; scripts/setup.sh installs it)"
    try:
        done = subprocess.run([str(AZCOPY_BIN), "--version"], capture_output=True, text=True, timeout=30,
                              check=False)
    except OSError as exc:
        return f"AzCopy does not start: {exc}"
    if done.returncode != 0:
        return f"AzCopy does not start (libsecret-1-0 missing?): {(done.stderr or done.stdout).strip()[:200]}"
    return None


def run_azcopy(args: Sequence[str], cwd: Path, state: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """AzCopy with its job plans and logs under `state`, no proxy, no credentials from the environment."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AZURE_", "AZCOPY_")) and k.lower() not in ("https_proxy", "http_proxy", "all_proxy")}
    env.update(AZCOPY_JOB_PLAN_LOCATION=str(state / "plans"), AZCOPY_LOG_LOCATION=str(state / "logs"))
    return subprocess.run([str(AZCOPY_BIN), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
