#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: .venv with blobsync[dev], and Azurite pinned in .tools/azurite.
set -euo pipefail
cd "$(dirname "$0")/.."
AZURITE_VERSION="3.37.0"
PY="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.blobsync-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing blobsync[dev] into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  touch "$stamp"
fi

azdir=.tools/azurite
if [ ! -x "$azdir/node_modules/.bin/azurite-blob" ] || \
   ! grep -q "\"version\": \"$AZURITE_VERSION\"" "$azdir/node_modules/azurite/package.json" 2>/dev/null; then
  command -v npm >/dev/null || { echo "setup: npm is required to install Azurite (apt-get install nodejs npm)" >&2; exit 1; }
  echo "setup: installing azurite@$AZURITE_VERSION into $azdir"
  mkdir -p "$azdir"
  [ -f "$azdir/package.json" ] || echo '{"name":"blobsync-tools","private":true}' > "$azdir/package.json"
  npm install --prefix "$azdir" --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION"
fi
echo "setup: ok (.venv, $azdir)"
