#!/usr/bin/env bash
# Makes .devkit/ (git-ignored), what the lent GPU host lacks for bench/device/run.sh: Python 3.12 wheels of the
# packages blobsync runs (the versions this checkout's .venv has, so figures compare), AzCopy and rclone (xz), and
# the shared libraries AzCopy links (libsecret's chain). Run here, once, before the one device call:
#     bash bench/device/prepare.sh
# then call the device tool with command `bash bench/device/run.sh`, carry [".devkit"], timeout_s 560.
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT=.devkit
AZCOPY=.tools/azcopy/node_modules/@azure-tools/azcopy-linux/dist/bin/azcopy_linux_amd64
[ -x "$AZCOPY" ] || bash bench/setup.sh
rm -rf "$KIT"
mkdir -p "$KIT/wheels" "$KIT/bin" "$KIT/lib"
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
specs=()
for dist in aiohttp multidict yarl propcache frozenlist aiosignal aiohappyeyeballs awscrt xxhash click; do
    specs+=("$dist==$(version "$dist")")
done
platforms=()
for n in 2_17 2_27 2_28 2_31 2_34; do platforms+=(--platform "manylinux_${n}_x86_64"); done
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 "${platforms[@]}" -d "$KIT/wheels" "${specs[@]}"
xz -T2 -6 -c "$AZCOPY" > "$KIT/bin/azcopy.xz"
xz -T2 -6 -c "$(command -v rclone)" > "$KIT/bin/rclone.xz"
# AzCopy links libsecret (and through it glib); the host's image has neither.
ldd "$AZCOPY" | awk '/=> \// {print $3}' | grep -v -E '/(libc|libm|libdl|libpthread)\.so' | xargs -I{} cp -L {} "$KIT/lib/"
du -sh "$KIT" "$KIT"/*
