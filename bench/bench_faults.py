"""Throttling under load: a 1 GiB upload with 10% of Put Blocks answered 503 ServerBusy, against a clean run."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from harness.azurite import REPO, Azurite
from harness.measure import run_measured, wait_for_quiet
from harness.workloads import DEFAULT_CACHE, large_file

from support.proxy import FaultProxy, Rule, respond  # type: ignore[import-not-found]

BLOBSYNC = REPO / ".venv" / "bin" / "blobsync"


def one_run(faulty: bool, src: Path, pct: float, retry_after: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        az = Azurite(tmp)
        az.start()
        try:
            with FaultProxy(f"http://127.0.0.1:{az.port}") as proxy:
                if faulty:
                    proxy.add_rule(Rule("put_block", respond(503, "ServerBusy", retry_after=retry_after),
                                        probability=pct / 100, seed=1))
                url = f"{proxy.endpoint()}/bench/"
                cmd = [str(BLOBSYNC), "cp", str(src), url, "--create-container", "--quiet",
                       "--journal", str(tmp / "j.db")]
                env = {**os.environ, "AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}
                wait_for_quiet(0.25, 60)
                r = run_measured(cmd, env, tmp, tmp / "out.log", 900)
                out = (tmp / "out.log").read_text()
                if r.returncode != 0:
                    raise SystemExit(f"blobsync failed:\n{out[-2000:]}")
                stats = proxy.stats
                sent = stats.bytes_in["put_block"]
                lowest = float(out.split("down to ")[1].split()[0]) if "down to " in out else float("nan")
                return {"wall": r.wall_s, "faults": float(sum(stats.faults.values())),
                        "resent_mib": (sent - src.stat().st_size) / 2**20,  # bodies of refused requests
                        "blocks": float(stats.requests["put_block"]), "lowest": lowest}
        finally:
            az.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pct", type=float, default=10.0, help="share of Put Blocks answered 503 (default 10)")
    parser.add_argument("--retry-after", type=float, default=1.0, help="Retry-After sent with each 503 (s)")
    args = parser.parse_args()
    src = large_file(DEFAULT_CACHE, 1024)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for rnd in range(args.repeat):
        for with_faults in ((False, True) if rnd % 2 == 0 else (True, False)):
            runs[with_faults].append(one_run(with_faults, src, args.pct, args.retry_after))
            kind = "faulty" if with_faults else "clean"
            print(f"bench: round {rnd + 1} {kind}: {runs[with_faults][-1]}", file=sys.stderr)
    clean = statistics.median(r["wall"] for r in runs[False])
    faulty = statistics.median(r["wall"] for r in runs[True])
    print(f"1 GiB upload through the fault proxy, fresh Azurite per run, {args.repeat} runs each, medians "
          "(partly server-bound: Azurite and the Python proxy share the 2 cores):\n")
    print("| Run | Wall s | 503s injected | Put Block requests | MiB re-sent | Lowest concurrency |\n"
          "|---|---|---|---|---|---|")
    for label, key in (("clean", False), (f"{args.pct:g}% 503 ServerBusy, Retry-After {args.retry_after:g}s", True)):
        keys = ("wall", "faults", "blocks", "resent_mib", "lowest")
        med = {k: statistics.median(r[k] for r in runs[key]) for k in keys}
        print(f"| {label} | {med['wall']:.2f} | {med['faults']:.0f} | {med['blocks']:.0f} | {med['resent_mib']:.0f} | "
              f"{med['lowest']:g} |")
    print(f"\nfaulty / clean wall time: {faulty / clean:.2f}x (target <= 1.5x); every run ended verified (exit 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
