# The whole check on Windows (PowerShell), the same steps as scripts/test.sh: set-up if needed (.venv with
# blobsync[dev], Azurite pinned in .tools\azurite), then ruff, mypy --strict on src/, and the pytest suite.
# CI runs scripts/test.sh on Linux only; tests that need POSIX (pty, signals, fcntl) skip or fail here.
$ErrorActionPreference = "Stop"
Set-Location (Join-Path $PSScriptRoot "..")
$AzuriteVersion = "3.37.0"

if (-not (Test-Path ".venv\Scripts\python.exe")) {
    Write-Host "setup: creating .venv"
    python -m venv .venv
}
$stamp = ".venv\.blobsync-installed"
if (-not (Test-Path $stamp) -or ((Get-Item "pyproject.toml").LastWriteTime -gt (Get-Item $stamp).LastWriteTime)) {
    Write-Host "setup: installing blobsync[dev] into .venv"
    & .venv\Scripts\python -m pip install -q --upgrade pip
    & .venv\Scripts\python -m pip install -q -e ".[dev]"
    New-Item -ItemType File -Force $stamp | Out-Null
}
$azdir = ".tools\azurite"
$pkg = Join-Path $azdir "node_modules\azurite\package.json"
if (-not (Test-Path $pkg) -or -not (Select-String -Quiet -Path $pkg -Pattern "`"version`": `"$AzuriteVersion`"")) {
    if (-not (Get-Command npm -ErrorAction SilentlyContinue)) { throw "setup: npm is required to install Azurite" }
    Write-Host "setup: installing azurite@$AzuriteVersion into $azdir"
    New-Item -ItemType Directory -Force $azdir | Out-Null
    if (-not (Test-Path "$azdir\package.json")) { '{"name":"blobsync-tools","private":true}' | Set-Content "$azdir\package.json" }
    npm install --prefix $azdir --no-audit --no-fund --loglevel=error "azurite@$AzuriteVersion"
    if ($LASTEXITCODE -ne 0) { throw "setup: npm install azurite failed" }
}
Write-Host "== ruff"
& .venv\Scripts\ruff check src tests bench; if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }
Write-Host "== mypy --strict src"
& .venv\Scripts\mypy --strict src; if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }
Write-Host "== pytest"
& .venv\Scripts\pytest -q @args
exit $LASTEXITCODE
