#!/usr/bin/env bash
# Demo: start a local Azurite, make a sample folder (~300 MB), upload it with `blobsync cp -r`, stop Azurite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null

work=$(mktemp -d "${TMPDIR:-/tmp}/blobsync-demo.XXXXXX")
port=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
.tools/azurite/node_modules/.bin/azurite-blob --blobHost 127.0.0.1 --blobPort "$port" --inMemoryPersistence \
  --skipApiVersionCheck --loose --silent --disableTelemetry >"$work/azurite.log" 2>&1 &
azurite=$!
cleanup() { kill "$azurite" 2>/dev/null || true; wait "$azurite" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

for _ in $(seq 100); do
  (echo >/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break
  sleep 0.1
done

echo "demo: making a sample folder in $work/models"
.venv/bin/python - "$work/models" <<'PY'
import os, sys
root = sys.argv[1]
os.makedirs(f"{root}/checkpoints", exist_ok=True)
with open(f"{root}/checkpoints/model-epoch3.pt", "wb") as f:  # one large file: many blocks
    for _ in range(160):
        f.write(os.urandom(1 << 20))
for run in range(4):  # nested small files
    d = f"{root}/runs/run {run}/metrics"
    os.makedirs(d, exist_ok=True)
    for i in range(50):
        with open(f"{d}/step-{i:03d}.json", "w") as f:
            f.write('{"loss": %f}\n' % (1.0 / (i + 1)))
with open(f"{root}/dataset.bin", "wb") as f:
    f.write(os.urandom(140 << 20))
PY
du -sh "$work/models"

export AZURE_STORAGE_CONNECTION_STRING="UseDevelopmentStorage=true"
dest="http://127.0.0.1:$port/devstoreaccount1/demo"  # cp -r makes the folder a level: demo/models/...
echo "demo: blobsync cp -r $work/models $dest --create-container"
.venv/bin/blobsync cp -r "$work/models" "$dest" --create-container --journal "$work/journal.db"
echo
echo "demo: the journal keeps every job (an interrupted one resumes when the same command runs again):"
.venv/bin/blobsync jobs list --journal "$work/journal.db"
