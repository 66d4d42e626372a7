"""The library's signatures are explicit: mypy --strict on a caller reports misspelt keywords, wrong types and
bad literals (tests/typing/misuse.py marks each line it must report)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

MISUSE = Path(__file__).resolve().parent / "typing" / "misuse.py"


def test_mypy_reports_every_misuse_and_nothing_else() -> None:
    lines = MISUSE.read_text(encoding="utf-8").splitlines()
    expected = {n for n, line in enumerate(lines, 1) if line.rstrip().endswith("# expect-error")}
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", "/dev/null",
                           str(MISUSE)], capture_output=True, text=True, timeout=300)
    reported = {int(m.group(1)) for m in re.finditer(rf"{re.escape(MISUSE.name)}:(\d+): error", done.stdout)}
    assert len(expected) >= 10
    assert reported == expected, done.stdout
