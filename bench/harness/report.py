"""Markdown (or plain) tables: medians per tool, ratios against the issue's targets, and every run."""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path

from harness.azurite import REPO, azurite_version
from harness.tools import DESCRIPTIONS, Settings, base_tool, tool_version
from harness.workloads import BLOBSYNC_BLOCK_MIB, BLOBSYNC_CONCURRENCY, MB, GiB, Run, Workload

SERVER_NOTE = (
    "Every figure is partly server-bound: Azurite (Node.js, one JavaScript thread plus a little GC/IO help) runs on "
    "the same 2-core machine and uses up to about one core, so client and server compete for CPU; see the Azurite "
    "CPU columns. Other CPU % is everything else on the machine during the run (ideally ~0)."
)
NAN = float("nan")

# Targets from issue 7 (and the upload issue's memory bound).
TARGET_NOMD5 = 1.15
TARGET_MD5 = 0.95
TARGET_CPU_S_GIB = 3.0
TARGET_SMALL_OBSTORE = 1.0
TARGET_SMALL_OTHERS = 2.0
TARGET_DOWNLOAD = 1.0
TARGET_NOOP = 1.0
RSS_OVERHEAD_MIB = 64  # interpreter, libraries, sockets and the journal, beyond blobsync's buffer budget
DEFAULT_MEMORY_MIB = 256  # blobsync's --memory-mb default
TARGET_CAP = 0.10  # --cap-mbps: achieved within 10% of the cap


def fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x != x else f"{x:,.{digits}f}"  # x != x is the NaN test


def derived(run: Run, wl: Workload) -> dict[str, float]:
    w = run.wall_s
    nbytes = wl.bytes_for(run.tool)
    d = {
        "wall_s": w,
        "mb_s": nbytes / w / MB,
        "files_s": wl.files / w,
        "cpu_s": run.cpu_s,
        "cpu_s_gib": run.cpu_s / (nbytes / GiB) if nbytes else NAN,
        "cpu_s_kfiles": run.cpu_s * 1000 / wl.files,
        "client_pct": 100 * run.cpu_s / w,
        "rss_mib": run.rss_mib,
        "az_cpu_s": run.azurite_cpu_s,
        "az_pct": 100 * run.azurite_cpu_s / w,
        "other_pct": 100 * run.other_cpu_s / w,
    }
    d.update(run.extra)
    return d


COMMON_TAIL = [
    ("client_pct", "Client CPU %", 0),
    ("rss_mib", "Client peak RSS MiB", 1),
    ("az_cpu_s", "Azurite CPU s", 2),
    ("az_pct", "Azurite CPU %", 0),
    ("other_pct", "Other CPU %", 0),
    ("server_start_s", "Azurite idle at start s", 2),
    ("server_tail_s", "Azurite idle at end s", 2),
    ("server_busy", "Azurite busy between, cores", 2),
]


def columns(wl: Workload) -> list[tuple[str, str, int]]:
    if wl.name == "resume":
        return [
            ("wall_s", "Resume wall s", 2),
            ("sent_before_kill_mib", "MiB sent before kill", 0),
            ("staged_mib", "MiB staged at kill", 0),
            ("remainder_mib", "Remainder MiB", 0),
            ("resent_mib", "MiB sent by resume", 0),
            ("excess_mib", "Excess MiB", 0),
            ("cpu_s", "Client CPU s", 2),
            *COMMON_TAIL,
        ]
    if wl.name.startswith("slow"):
        rate = [("mbit_s", "Mbit/s", 1)] + ([("files_s", "files/s", 0)] if wl.kind == "files" else [])
        return [("wall_s", "Wall s", 2), *rate, ("link_fraction", "Of the link", 2), ("auto_level", "Auto level", 0),
                ("cap_accuracy", "Achieved / cap", 2), ("cpu_s", "Client CPU s", 2), *COMMON_TAIL]  # fmt: skip
    if wl.kind == "files":
        return [("wall_s", "Wall s", 2), ("files_s", "files/s", 0), ("cpu_s", "Client CPU s", 2),
                ("cpu_s_kfiles", "Client CPU s/1,000 files", 3), *COMMON_TAIL]  # fmt: skip
    return [("wall_s", "Wall s", 2), ("mb_s", "MB/s", 1), ("cpu_s", "Client CPU s", 2),
            ("cpu_s_gib", "Client CPU s/GiB", 2), *COMMON_TAIL]  # fmt: skip


def render(headers: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def medians(runs: Sequence[Run], wl: Workload, tool: str) -> dict[str, float] | None:
    ok = [derived(r, wl) for r in runs if r.tool == tool and r.valid and not r.discarded]
    if not ok:
        return None
    keys = set().union(*ok)
    # Each metric's own median (not "the median run"), over valid runs only.
    return {k: statistics.median(d.get(k, NAN) for d in ok) for k in keys}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


Med = dict[str, dict[str, float] | None]


def ratio_row(med: Med, a: str, b: str, key: str, unit: str, target: float | None, label: str = "") -> list[str]:
    if a not in med or b not in med:
        return []  # a tool that was not asked for (or is not installed: the report says so) gets no ratio row
    ma, mb = med.get(a), med.get(b)
    label = label or f"{a} / {b}, {unit}"
    tgt = f">= {target:.2f}x" if target is not None else "(info)"
    if ma is None or mb is None:
        missing = [t for t, m in ((a, ma), (b, mb)) if m is None]
        return [label, "n/a", tgt, "n/a", f"no valid runs of {', '.join(missing)} (not run, skipped or failed)"]
    r = ma[key] / mb[key]
    context = f"{fmt(ma[key], 1)} vs {fmt(mb[key], 1)} {unit}; Azurite CPU {ma['az_pct']:.0f}% vs {mb['az_pct']:.0f}%"
    return [label, f"{r:.2f}x", tgt, verdict(r >= target) if target is not None else "info", context]


def target_rows(wl: Workload, med: Med, runs: Sequence[Run], st: Settings) -> list[list[str]]:
    rows: list[list[str]] = []
    peers = [t for t in med if base_tool(t) != "blobsync"]
    if wl.name == "upload-large":
        rows.append(ratio_row(med, "blobsync-nomd5", "sdk-validate", "mb_s", "MB/s", TARGET_NOMD5))
        rows.append(ratio_row(med, "blobsync", "sdk-validate", "mb_s", "MB/s", TARGET_MD5))
        m = med.get("blobsync")
        if m is not None:
            ok = m["cpu_s_gib"] <= TARGET_CPU_S_GIB
            rows.append(["blobsync (whole-file MD5) client CPU s/GiB", fmt(m["cpu_s_gib"]),
                         f"<= {TARGET_CPU_S_GIB:.1f}", verdict(ok), f"client {m['client_pct']:.0f}% of a core, "
                         f"Azurite {m['az_pct']:.0f}%"])  # fmt: skip
        rows.append(ratio_row(med, "blobsync-nomd5", "minimal", "mb_s", "MB/s", None,
                              "blobsync-nomd5 / minimal (the reference ceiling, same work), MB/s"))  # fmt: skip
        rows += [ratio_row(med, "blobsync", p, "mb_s", "MB/s", None) for p in peers if p != "sdk-validate"]
    elif wl.name == "upload-small":
        rows.append(ratio_row(med, "blobsync", "obstore", "files_s", "files/s", TARGET_SMALL_OBSTORE))
        for p in ("sdk", "sdk-validate", "rclone"):
            rows.append(ratio_row(med, "blobsync", p, "files_s", "files/s", TARGET_SMALL_OTHERS))
    elif wl.name == "download-large":
        have = [(m["mb_s"], p) for p in peers if (m := med.get(p)) is not None]
        if have:
            fastest = max(have)[1]
            rows.append(ratio_row(med, "blobsync", fastest, "mb_s", "MB/s", TARGET_DOWNLOAD,
                                  f"blobsync (checks MD5) / fastest peer ({fastest}), MB/s"))  # fmt: skip
            rows.append(ratio_row(med, "blobsync-nocheck", fastest, "mb_s", "MB/s", None,
                                  f"blobsync --check-md5 NoCheck / fastest peer ({fastest}), MB/s"))  # fmt: skip
        rows += [ratio_row(med, "blobsync", p, "mb_s", "MB/s", None) for p in peers]
    elif wl.name == "noop-sync":
        b, r = med.get("blobsync"), med.get("rclone")
        if b is not None and r is not None:
            ratio = r["wall_s"] / b["wall_s"]
            rows.append(["rclone wall / blobsync wall (process start included)", f"{ratio:.2f}x",
                         f">= {TARGET_NOOP:.2f}x", verdict(ratio >= TARGET_NOOP),
                         f"{fmt(b['wall_s'])} s vs rclone {fmt(r['wall_s'])} s"])  # fmt: skip
    elif wl.name == "resume":
        limit = BLOBSYNC_CONCURRENCY * BLOBSYNC_BLOCK_MIB
        excess = [r.extra["excess_mib"] for r in runs if r.tool == "blobsync" and r.valid and not r.discarded]
        if excess:
            rows.append([f"blobsync excess re-sent MiB (worst of {len(excess)} runs)", fmt(max(excess), 1),
                         f"<= {limit} (concurrency {BLOBSYNC_CONCURRENCY} x {BLOBSYNC_BLOCK_MIB} MiB)",
                         verdict(max(excess) <= limit),
                         "beyond the bytes the service did not hold at the kill"])  # fmt: skip
        for p in peers:
            m = med.get(p)
            if m is not None:
                rows.append([f"{p}: MiB sent by the second run (info)", fmt(m["resent_mib"], 0), "(info)", "info",
                             f"remainder was {fmt(m['remainder_mib'], 0)} MiB"])  # fmt: skip
    elif wl.name.startswith("slow"):
        key, unit = ("files_s", "files/s") if wl.kind == "files" else ("mbit_s", "Mbit/s")
        rows += [ratio_row(med, "blobsync", p, key, unit, None) for p in peers]
        m = med.get("blobsync-cap")
        if m is not None:
            acc = m["cap_accuracy"]
            rows.append([f"blobsync --cap-mbps {st.cap_mbps:g}: achieved / cap", f"{acc:.2f}",
                         f"{1 - TARGET_CAP:.2f}-{1 + TARGET_CAP:.2f}", verdict(abs(acc - 1) <= TARGET_CAP),
                         f"{fmt(m['mbit_s'], 1)} Mbit/s incl. process start"])  # fmt: skip
    elif wl.name == "sparse-rss":
        # Flat in file size means bounded by a constant: the buffer budget plus a fixed overhead. Buffers are
        # pooled, so peak RSS is the high-water mark of buffers in use at once, which a longer run reaches more
        # of (one slow request holds its buffer while others are read) up to the budget; a ratio of a short
        # run to a long one measures that, not growth with size.
        rss = {t: max(r.rss_mib for r in runs if r.tool == t and r.valid) for t in med if med[t] is not None}
        bound = (st.memory_mb or DEFAULT_MEMORY_MIB) + RSS_OVERHEAD_MIB
        for tool, peak in rss.items():
            rows.append([f"peak RSS {tool} (worst run)", f"{fmt(peak, 1)} MiB",
                         f"<= {bound:g} MiB (buffer budget + {RSS_OVERHEAD_MIB})", verdict(peak <= bound),
                         "bounded by --memory-mb, whatever the file size"])  # fmt: skip
        if len(rss) >= 2:
            first, last = next(iter(rss)), list(rss)[-1]
            rows.append([f"peak RSS {last} / {first} (worst runs)", f"{rss[last] / rss[first]:.2f}x", "(info)",
                         "info", f"{fmt(rss[last], 1)} vs {fmt(rss[first], 1)} MiB"])  # fmt: skip
    return [r for r in rows if r]


def _out(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def src_state() -> str:
    """Which blobsync code ran: the last commit that changed src/, plus a digest of uncommitted changes under src/.

    Commits that only touch bench/ or tests/ (made while a long run goes on) do not count as a code change.
    """
    commit = _out(["git", "-C", str(REPO), "log", "-1", "--format=%h", "--", "src"])
    diff = _out(["git", "-C", str(REPO), "diff", "HEAD", "--", "src"])
    untracked = _out(["git", "-C", str(REPO), "ls-files", "--others", "--exclude-standard", "--", "src"])
    if not diff and not untracked:
        return commit
    digest = hashlib.sha1((diff + untracked).encode()).hexdigest()[:8]
    return f"{commit} + uncommitted changes in src/ (digest {digest})"


def machine_lines(st: Settings, tools: Sequence[str], code: tuple[str, str]) -> list[str]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = "unknown"
    with contextlib.suppress(OSError, IndexError, ValueError):
        kib = int(Path("/proc/meminfo").read_text().splitlines()[0].split()[1])
        mem = f"{kib / 1024 / 1024:.1f} GiB"
    py = _out([str(st.python), "-c", "import platform; print(platform.python_version())"])
    code_s = code[0] if code[0] == code[1] else f"{code[0]}, CHANGED during the runs to {code[1]}"
    kinds = sorted({base_tool(t) for t in tools})
    names = {"sdk": "azure-storage-blob ", "obstore": "obstore ", "rclone": ""}  # rclone's version names itself
    versions = ", ".join(f"{names[k]}{tool_version(k, st)}" for k in kinds if k in names)
    return [
        f"- Machine: nproc={len(os.sched_getaffinity(0))}, CPU: {model}, RAM {mem}, Linux {platform.release()}",
        f"- Python {py}; blobsync {tool_version('blobsync', st)}, src/ at commit {code_s} (checkout "
        f"{_out(['git', '-C', str(REPO), 'rev-parse', '--short', 'HEAD'])})" + (f"; {versions}" if versions else ""),
        f"- Azurite {azurite_version()} (fresh per run unless noted), Node.js {_out(['node', '-v'])}",
    ]


def report(wl: Workload, runs: list[Run], tools: Sequence[str], skipped: dict[str, str], st: Settings,
           markdown: bool, code: tuple[str, str], command: str) -> str:  # fmt: skip
    cols = columns(wl)
    parts: list[str] = [f"#### `{wl.name}`: {wl.description}" if markdown else f"== {wl.name}: {wl.description}", ""]
    if markdown:
        parts += ["```", command, "```", ""]
    else:
        parts += [f"Command: {command}", ""]
    parts += machine_lines(st, tools, code)
    for t in dict.fromkeys(base_tool(t) if t not in DESCRIPTIONS else t for t in tools):
        if t in DESCRIPTIONS:
            parts.append(f"- {t}: {DESCRIPTIONS[t]}")
    parts += [f"- {n}" for n in wl.notes()]
    for t, why in skipped.items():
        parts.append(f"- **{t} skipped**: {why}")
    parts += [f"- {SERVER_NOTE}", ""]

    med: Med = {t: medians(runs, wl, t) for t in tools}
    rows = []
    for t in tools:
        m = med[t]
        kept = [r for r in runs if r.tool == t and not r.discarded]
        dropped = sum(r.discarded for r in runs if r.tool == t)
        counts = f"{sum(r.valid for r in kept)}/{len(kept)}" + (f" (+{dropped} noisy re-run)" if dropped else "")
        rows.append([t, counts, *(fmt(m.get(k, NAN), d) if m else "n/a" for k, _, d in cols)])
    parts += ["Medians per tool (each column's own median over the valid runs; partly server-bound, see Azurite CPU):"]
    parts += ["", render(["Tool", "Valid runs", *(h for _, h, _ in cols)], rows, markdown), ""]
    trows = target_rows(wl, med, runs, st)
    if trows:
        parts += ["Against the targets (ratios of the medians):", ""]
        parts += [render(["Check", "Measured", "Target", "Verdict", "Context"], trows, markdown), ""]
    rows = []
    for r in runs:
        d = derived(r, wl)
        valid = "discarded (noisy)" if r.discarded else ("yes" if r.valid else "NO")
        if not r.discarded and d["other_pct"] > st.noisy_pct:
            valid += " (noisy, kept after re-runs)" if st.noisy_retries else " (noisy: no noise guard)"
        rows.append([str(r.round), r.tool, *(fmt(d.get(k, NAN), p) for k, _, p in cols), valid])
    parts += ["All runs, in the order they ran (tool order rotates each round):", ""]
    parts += [render(["Round", "Tool", *(h for _, h, _ in cols), "Valid"], rows, markdown), ""]
    for r in runs:
        if not r.valid:
            parts.append(f"- Run {r.round} {r.tool} INVALID: {r.error.splitlines()[0] if r.error else '?'}")
    return "\n".join(parts).rstrip() + "\n"
