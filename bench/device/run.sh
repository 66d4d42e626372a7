#!/usr/bin/env bash
# On the lent GPU host (16 cores, one H100/H200), from the repository's root, with .devkit carried (see
# prepare.sh): the checks issues 48 (point 5) and 53 (point 2) leave to such a host, in one call of ~6-8 minutes.
#   1. one 4 GiB file up (with and without the whole MD5) and down (unchecked) to the null server: blobsync in one
#      process and with --processes 4, 8 and 16, AzCopy and rclone, in the same run (bench/large_file.py);
#   2. a 2 GiB bf16 state on the GPU saved with DCP through BlobStorageWriter and through FileSystemWriter to local
#      disk, three rounds each, then loaded back onto the GPU and compared (bench/gpu_checkpoint.py).
# Everything it prints also lands in $OUT (the device tool brings it back). To try it on this machine first (no
# wheels installed, nothing of .venv or .tools replaced, smaller sizes):
#     PY=.venv/bin/python SKIP_WHEELS=1 MIB=256 GPU_MIB=256 OUT=/tmp/devout bash bench/device/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/blobsync-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=$(realpath -s "$(command -v "${PY:-python3}")")
if [ -z "${SKIP_WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .devkit/wheels/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
# bench/harness runs the CLI as .venv/bin/blobsync and AzCopy from .tools: made here where they are not there.
mkdir -p /tmp/bin
if [ ! -e .venv/bin/blobsync ]; then
    mkdir -p .venv/bin
    printf '#!/bin/sh\nexec %s -m blobsync "$@"\n' "$PY" > .venv/bin/blobsync
    chmod +x .venv/bin/blobsync
fi
AZDIR=.tools/azcopy/node_modules/@azure-tools/azcopy-linux/dist/bin
if [ ! -e "$AZDIR/azcopy_linux_amd64" ]; then
    mkdir -p "$AZDIR"
    xz -dc .devkit/bin/azcopy.xz > /tmp/bin/azcopy-real
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec /tmp/bin/azcopy-real "$@"\n' "$ROOT/.devkit/lib" \
        > "$AZDIR/azcopy_linux_amd64"
    chmod +x /tmp/bin/azcopy-real "$AZDIR/azcopy_linux_amd64"
fi
command -v rclone >/dev/null || { xz -dc .devkit/bin/rclone.xz > /tmp/bin/rclone; chmod +x /tmp/bin/rclone; }
export PATH=/tmp/bin:$PATH
{
    echo "cores: $(nproc)"; nvidia-smi -L; "$PY" --version
    "$PY" -c "import torch, aiohttp, blobsync; print('torch', torch.__version__, 'aiohttp', aiohttp.__version__)"
    "$AZDIR/azcopy_linux_amd64" --version; rclone version | head -1
} 2>&1 | tee "$OUT/host.txt"
cd bench
# Four null server processes: one drains ~3-4 GiB/s on a core like the bench VM's, less than 16 workers may send.
timeout 330 "$PY" large_file.py --mib "${MIB:-4096}" --rounds 1 --ways up,up-md5,down --server-processes 4 \
    --tools blobsync,blobsync-p4,blobsync-p8,blobsync-p16,azcopy,rclone --cache-dir /tmp/bench-cache 2>&1 | tee "$OUT/large_file.txt"
timeout 200 "$PY" gpu_checkpoint.py --mib "${GPU_MIB:-2048}" --rounds 3 --server-processes 2 2>&1 | tee "$OUT/gpu_checkpoint.txt"
