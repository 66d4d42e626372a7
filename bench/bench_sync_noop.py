"""No-op re-sync of a 10,000-file tree: blobsync sync against rclone sync, each on the destination it wrote."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_upload import AZURITE_BIN, Azurite, run_measured, wait_for_quiet

BLOBSYNC = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "blobsync"


def make_tree(root: Path, files: int) -> None:
    if root.exists() and sum(1 for _ in root.rglob("*.bin")) == files:
        return
    shutil.rmtree(root, ignore_errors=True)
    for i in range(files):
        folder = root / f"d{i % 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:06d}.bin").write_bytes(os.urandom(i % 64))


def rclone_config(path: Path, endpoint: str) -> None:
    # Debian's rclone 1.60 reaches Azurite only with use_emulator AND the endpoint (either alone fails).
    path.write_text(f"[az]\ntype = azureblob\nuse_emulator = true\nendpoint = {endpoint}\n")


def commands(tool: str, tree: Path, az: Azurite, tmp: Path) -> list[str]:
    if tool == "blobsync":
        return [str(BLOBSYNC), "sync", str(tree), f"{az.blob_endpoint}/blobsync-dst", "--quiet", "--create-container",
                "--journal", str(tmp / "j.db")]
    rclone = shutil.which("rclone") or "rclone"
    return [rclone, "--config", str(tmp / "rclone.conf"), "sync", str(tree), "az:rclone-dst", "--transfers", "16",
            "--checkers", "16", "--retries", "1", "--low-level-retries", "1"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5, help="no-op runs per tool (default 5)")
    args = parser.parse_args()
    if not AZURITE_BIN.exists() or shutil.which("rclone") is None:
        print("needs scripts/setup.sh (Azurite) and Debian's rclone (apt-get install rclone)", file=sys.stderr)
        return 2
    tree = Path(tempfile.gettempdir()) / f"blobsync-bench-sync-{args.files}"
    make_tree(tree, args.files)
    results: dict[str, list[tuple[float, float, int]]] = {"blobsync": [], "rclone": []}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        az = Azurite(tmp)
        az.start()
        try:
            rclone_config(tmp / "rclone.conf", az.blob_endpoint)
            env = {**os.environ, "AZURE_STORAGE_CONNECTION_STRING": az.connection_string}
            rclone = shutil.which("rclone") or "rclone"
            subprocess.run([rclone, "--config", str(tmp / "rclone.conf"), "mkdir", "az:rclone-dst"], check=True,
                           env=env)
            for tool in results:  # seed: each tool writes its own destination once
                seeded = run_measured(commands(tool, tree, az, tmp), env, tmp, tmp / f"seed-{tool}.log", 900)
                if seeded.returncode != 0:
                    print(f"{tool} seeding failed:\n{(tmp / f'seed-{tool}.log').read_text()[-2000:]}")
                    return 1
            for rnd in range(args.repeat):
                for tool in (list(results) if rnd % 2 == 0 else list(reversed(results))):
                    wait_for_quiet(0.25, 30)
                    log = tmp / f"{tool}-{rnd}.log"
                    r = run_measured(commands(tool, tree, az, tmp), env, tmp, log, 300)
                    if r.returncode != 0:
                        print(f"{tool} failed:\n{log.read_text()[-2000:]}")
                        return 1
                    results[tool].append((r.wall_s, r.user_s + r.sys_s, r.maxrss_kib))
            written = {tool: log_text for tool, log_text in (
                ("blobsync", (tmp / f"blobsync-{args.repeat - 1}.log").read_text()),
                ("rclone", (tmp / f"rclone-{args.repeat - 1}.log").read_text()))}
        finally:
            az.stop()
    print(f"No-op re-sync of {args.files:,} files, {args.repeat} runs per tool, medians "
          "(process start included; one fresh Azurite for the whole run, which shares the 2 cores):\n")
    print("| Tool | Wall s | Client CPU s | Peak RSS MiB |\n|---|---|---|---|")
    med = {}
    for tool, runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        med[tool] = wall
        print(f"| {tool} | {wall:.2f} | {statistics.median(r[1] for r in runs):.2f} | "
              f"{statistics.median(r[2] for r in runs) / 1024:.0f} |")
    print(f"\nrclone wall / blobsync wall: {med['rclone'] / med['blobsync']:.2f}x (>= 1.0 means blobsync is at "
          "least as fast)")
    print(f"\nLast blobsync output: {written['blobsync'].strip()[-200:]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
