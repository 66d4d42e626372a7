"""The current-first results table, made from the committed run data (bench/results/*.json, one file per run of
bench/run.py --json): medians per workload and tool, and each tool's wall time against blobsync's.

    python bench/current.py --import /tmp/run.json    # keep a run (bench/run.py --json) as bench/results/...json
    python bench/current.py            # print the table
    python bench/current.py --write    # put it in bench/RESULTS.md and docs/performance.md (between the markers)
    python bench/current.py --check    # exit 1 if either file's table is not the one the data makes
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "bench" / "results"
BEGIN, END = "<!-- current-results:begin -->", "<!-- current-results:end -->"
MiB = 1024 * 1024


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _rate(kind: str, files: int, total: int, wall: float) -> str:
    if kind == "files":
        return f"{files / wall:,.0f} files/s"
    return f"{total / wall / 1e6:,.1f} MB/s"


def rows(data: dict[str, dict[str, object]], meta: dict[str, str]) -> list[str]:
    out: list[str] = []
    for name, wl in data.items():
        runs = [r for r in wl["runs"] if r["valid"] and not r["discarded"]]  # type: ignore[index, union-attr]
        tools: list[str] = list(wl["tools"])  # type: ignore[call-overload]
        walls = {t: _median([r["wall_s"] for r in runs if r["tool"] == t]) for t in tools}
        base = walls.get("blobsync", float("nan"))
        for tool in tools:
            mine = [r for r in runs if r["tool"] == tool]
            if not mine or tool == "blobsync-base":  # an A/B's earlier code: RESULTS.md tells of it, not this table
                continue
            wall = walls[tool]
            cpu = _median([r["cpu_s"] for r in mine])
            kernel = _median([r["extra"].get("kernel_s", float("nan")) for r in mine])
            faults = _median([r["extra"].get("page_faults_k", float("nan")) for r in mine])
            rss = _median([r["rss_mib"] for r in mine])
            rate = _rate(str(wl["kind"]), int(wl["files"]), int(wl["total_bytes"]), wall)  # type: ignore[call-overload]
            ratio = "1.00x" if tool == "blobsync" else f"{wall / base:.2f}x"
            out.append(f"| {name} | {tool} | {len(mine)} | {wall:.2f} s | {rate} | {cpu:.2f} s | {kernel:.2f} s, "
                       f"{faults:,.0f}k | {rss:.0f} MiB | {ratio} |")
    return out


def table() -> str:
    files = sorted(DATA.glob("*.json"))
    if not files:
        return "(no committed results yet)"
    lines = ["| workload | tool | runs | median wall | rate | client CPU | of it kernel, page faults | peak RSS | "
             "wall / blobsync's |", "|---|---|---|---|---|---|---|---|---|"]
    latest: dict[str, tuple[str, dict[str, object]]] = {}  # workload -> (file, its figures); later files win
    metas: dict[str, dict[str, str]] = {}
    for path in files:  # named by date: in order
        doc = json.loads(path.read_text())
        metas[path.name] = doc["meta"]
        for name, wl in doc["workloads"].items():
            latest[name] = (path.name, wl)
    for name, (source, wl) in latest.items():
        lines += rows({name: wl}, metas[source])
    sources = []
    for source in sorted({s for s, _ in latest.values()}):
        meta = metas[source]
        sources.append(f"`bench/results/{source}`: {meta['date']}, `src/` at {meta['src']}, {meta['machine']}; "
                       f"`{meta['command']}`")
    lines.append("")
    lines.append("Wall / blobsync's below 1 means the tool was faster. Data: " + "; ".join(sources) + ".")
    return "\n".join(lines)


def _machine() -> str:
    import os
    import platform

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({model}), {mem:.0f} GiB, Linux {platform.release()}"


def keep(raw_path: Path) -> Path:
    """Store a run's raw figures with what they need to be read later: date, code, machine, command."""
    import time

    raw = json.loads(raw_path.read_text())
    first = next(iter(raw.values()))
    meta = {"date": time.strftime("%Y-%m-%d"), "src": first.get("src", "?"), "command": first.get("command", "?"),
            "machine": _machine()}
    DATA.mkdir(exist_ok=True)
    # Named by date and time: the files sort in the order they ran (a later run of a workload wins).
    out = DATA / f"{meta['date']}T{time.strftime('%H%M')}-{'-'.join(raw)}.json"
    out.write_text(json.dumps({"meta": meta, "workloads": raw}, indent=1) + "\n")
    return out


def _replace(text: str, new: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + new + "\n" + text[end:]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--import", dest="imported", type=Path, help="a bench/run.py --json file to keep")
    p.add_argument("--write", action="store_true")
    p.add_argument("--check", action="store_true")
    a = p.parse_args(argv)
    if a.imported:
        print(keep(a.imported))
        return 0
    made = table()
    targets = [REPO / "bench" / "RESULTS.md", REPO / "docs" / "performance.md"]
    if a.write:
        for path in targets:
            path.write_text(_replace(path.read_text(), made))
        return 0
    if a.check:
        stale = [str(p.relative_to(REPO)) for p in targets if _replace(p.read_text(), made) != p.read_text()]
        if stale:
            print(f"stale results table in {', '.join(stale)}: run python bench/current.py --write", file=sys.stderr)
            return 1
        return 0
    print(made)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
