#!/usr/bin/env bash
# The whole check: set-up if needed, then ruff, mypy --strict on src/, and the pytest suite (Azurite-backed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check src tests bench
echo "== mypy --strict src"
.venv/bin/mypy --strict src
echo "== pytest"
if [ "$#" -eq 0 ]; then
  # Two workers (pytest-xdist), each with its own Azurite: most tests wait on a server or a child process, so
  # the suite takes about half the time on two cores. Work stealing: a worker left idle at the end takes tests the
  # other one still queues (the torch tests, 20-30 s each, gather there); 10:06 against 10:21-10:33 on one VM.
  .venv/bin/pytest -q -n 2 --dist worksteal
else
  .venv/bin/pytest -q "$@"
fi
if [ "$#" -eq 0 ]; then
  # The portable I/O paths (what Windows and macOS use: no pread/pwrite, O_DIRECT, RWF_NOWAIT, TIOCOUTQ) on the
  # data-path tests: upload, download, resume, crash, sync, watch.
  echo "== pytest, portable I/O (BLOBSYNC_PORTABLE_IO=1)"
  BLOBSYNC_PORTABLE_IO=1 .venv/bin/pytest -q -n 2 tests/test_upload.py tests/test_download.py tests/test_resume.py \
    tests/test_restart.py tests/test_sync.py tests/test_watch.py tests/test_portable_io.py
fi
