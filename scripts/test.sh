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
.venv/bin/pytest -q "$@"
