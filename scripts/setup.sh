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
# AzCopy, the peer the compatibility tests (and benchmarks) compare with: best effort; without it those tests
# are skipped with the reason. Linux x86-64 only (the npm package carries that binary).
AZCOPY_VERSION="10.32.2"
azcdir=.tools/azcopy
azcbin="$azcdir/node_modules/@azure-tools/azcopy-linux/dist/bin/azcopy_linux_amd64"
if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] && command -v npm >/dev/null && \
   ! grep -q "\"version\": \"$AZCOPY_VERSION\"" "$azcdir/node_modules/@azure-tools/azcopy-linux/package.json" 2>/dev/null; then
  echo "setup: installing @azure-tools/azcopy-linux@$AZCOPY_VERSION into $azcdir"
  mkdir -p "$azcdir"
  [ -f "$azcdir/package.json" ] || echo '{"name":"blobsync-peers","private":true}' > "$azcdir/package.json"
  npm install --prefix "$azcdir" --no-audit --no-fund --loglevel=error "@azure-tools/azcopy-linux@$AZCOPY_VERSION" || \
    echo "setup: AzCopy not installed; the tests that compare with it will be skipped" >&2
fi
if [ -f "$azcbin" ]; then
  chmod +x "$azcbin"  # the package ships it without the executable bit
  # AzCopy links libsecret (Debian's libsecret-1-0) even when it never uses a keyring.
  if ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libsecret-1\.so\.0' && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing libsecret-1-0 for AzCopy"
    apt-get install -y -q libsecret-1-0 >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && \
      apt-get install -y -q libsecret-1-0 >/dev/null 2>&1; } || \
      echo "setup: libsecret-1-0 not installed; the tests that compare with AzCopy will be skipped" >&2
  fi
fi
echo "setup: ok (.venv, $azdir$([ -f "$azcbin" ] && echo ", $azcdir"))"
