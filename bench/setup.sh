#!/usr/bin/env bash
# The benchmark's peers: AzCopy (npm, via scripts/setup.sh, with Debian's libsecret-1-0), rclone (Debian), obstore
# adlfs and azstoragetorch (PyPI). Each is best effort: a peer that cannot be installed is skipped by bench/run.py with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh  # .venv, Azurite, AzCopy into .tools/azcopy
if ! command -v rclone >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "bench/setup: installing rclone"
  apt-get install -y -q rclone >/dev/null 2>&1 || echo "bench/setup: rclone not installed (skipped in runs)" >&2
fi
.venv/bin/python -c "import obstore" 2>/dev/null || .venv/bin/python -m pip install -q obstore || \
  echo "bench/setup: obstore not installed (skipped in runs)" >&2
# adlfs (fsspec over the SDK): a peer of bench/client_latency.py.
.venv/bin/python -c "import adlfs" 2>/dev/null || .venv/bin/python -m pip install -q adlfs || \
  echo "bench/setup: adlfs not installed (skipped in runs)" >&2
# azstoragetorch (Microsoft's BlobIO for torch.save/load): a peer of bench/torch_checkpoint.py (torch itself is
# pinned in the dev set-up).
.venv/bin/python -c "import azstoragetorch" 2>/dev/null || .venv/bin/python -m pip install -q azstoragetorch || \
  echo "bench/setup: azstoragetorch not installed (skipped in runs)" >&2
echo "bench/setup: ok"
