"""The shape src/ keeps: no function over 60 lines, none of complexity rank D or worse (radon), and an engine
that knows stores only through the seam (backends/base.py and the registry), never a backend's own modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from radon.complexity import cc_rank, cc_visit

SRC = Path(__file__).resolve().parent.parent / "src" / "blobsync"
MAX_LINES = 60


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_function_is_longer_than_60_lines() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_no_function_is_of_complexity_rank_d_or_worse() -> None:
    complex_ = [f"{path.relative_to(SRC)}:{block.lineno} {block.name} ({cc_rank(block.complexity)}, "
                f"{block.complexity})"
                for path in _sources() for block in cc_visit(path.read_text(encoding="utf-8"))
                if cc_rank(block.complexity) not in "ABC"]
    assert not complex_, complex_


def test_the_engine_reaches_stores_only_through_the_seam() -> None:
    """engine/, jobs/ and the planning modules import no backend module but base and registry."""
    allowed = {"blobsync.backends.base", "blobsync.backends.registry"}
    found = []
    for folder in ("engine", "jobs"):
        for path in sorted((SRC / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                    [a.name for a in node.names] if isinstance(node, ast.Import) else []
                found += [f"{path.relative_to(SRC)}: {n}" for n in names
                          if n.startswith("blobsync.backends") and n not in allowed]
    assert not found, found


def test_the_tracked_tree_holds_no_large_file_and_no_stray_archive() -> None:
    """No vendored wheel or tarball: dependencies come from the registries, not the repository."""
    import subprocess
    root = SRC.parent.parent
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    archives = (".whl", ".tar.gz", ".tgz", ".zip", ".tar", ".egg")
    found = []
    for name in filter(None, tracked.decode().split("\0")):
        path = root / name
        if not path.is_file():
            continue  # deleted in the work tree
        if path.stat().st_size > 1024 * 1024:
            found.append(f"{name}: over 1 MB")
        if name.endswith(archives) and not name.startswith(("tests/data/", "bench/data/")):
            found.append(f"{name}: an archive outside tests/data and bench/data")
    assert not found, found


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def test_imports_point_one_way() -> None:
    """cli -> api -> client -> calls -> cluster -> jobs -> engine -> backends/journal/local, config below them all
    (no backend's rules in it: a store declares its own): nothing below imports what is above it (the cluster's
    executor is handed to a job by its caller)."""
    layers = ["blobsync.cli", "blobsync.api", "blobsync.client", "blobsync.calls", "blobsync.cluster", "blobsync.jobs",
              "blobsync.engine"]
    above = {"cluster": tuple(layers[:4]), "jobs": tuple(layers[:5]), "engine": tuple(layers[:6]),
             "backends": tuple(layers), "journal": tuple(layers),
             "config.py": (*layers, "blobsync.journal", "blobsync.local", "blobsync.backends")}
    found = [f"{path.relative_to(SRC)}: {name}" for folder, banned in above.items()
             for path in sorted((SRC / folder).rglob("*.py") if (SRC / folder).is_dir() else [SRC / folder])
             for name in _imports(path) if name.startswith(banned)]
    assert not found, found


def test_a_files_outcome_has_one_writer() -> None:
    """Per-file code returns a FileResult; the job runner alone records the outcome in the journal."""
    writers = sorted(str(p.relative_to(SRC)) for p in _sources()
                     if "finish_file(" in p.read_text(encoding="utf-8") and p.name != "store.py")
    assert writers == ["jobs/runner.py"], writers


def test_a_call_is_handed_its_session_never_finds_it_in_the_air() -> None:
    """A Client passes its session to the calls it makes, `blobsync run`
    hands its to the commands through click's context object, a module call opens its own; no module keeps a
    session in a ContextVar for the calls below to pick up (issue 39, point 1)."""
    ambient = sorted(str(p.relative_to(SRC)) for p in _sources()
                     if re.search(r"ContextVar\[[^\]]*Session", p.read_text(encoding="utf-8")))
    assert not ambient, ambient


def test_one_session_factory_builds_every_engine() -> None:
    """A job's engine context (its budgets, request path and thread pools) is made by engine/session.Session alone:
    the CLI, the library, the Client and a cluster worker all open a Session (issue 39, point 1)."""
    builders = sorted(f"{p.relative_to(SRC)}: {m.group(0)}" for p in _sources()
                      for m in re.finditer(r"\b(EngineContext|RequestLimiter|MemoryBudget)\(",
                                           p.read_text(encoding="utf-8")))
    assert all(b.startswith("engine/session.py") for b in builders), builders


def test_one_put_and_one_ranged_read_outside_the_backends() -> None:
    """A whole-blob Put goes through engine/upload.put_once (a file's, a stream's end, a Client's bytes), and every
    ranged read through engine/fetching.read_checked (a download's ranges, a Client's get and reader, a blob read as
    a copy's source), whose parallel loop is fetching.RangeFetch (issue 39, point 2)."""
    calls = {"put": [], "read_into": [], "read_span": [], "RangeFetch loop": []}
    for path in _sources():
        rel = str(path.relative_to(SRC))
        if rel.startswith("backends/"):
            continue
        text = path.read_text(encoding="utf-8")
        calls["put"] += [rel] * len(re.findall(r"store\.put\(", text))
        calls["read_into"] += [rel] * len(re.findall(r"store\.read_into\(", text))
        calls["read_span"] += [rel] * len(re.findall(r"store\.read_span\(", text))
        calls["RangeFetch loop"] += [rel] * len(re.findall(r"^class \w*Fetch\w*\b", text, re.M))
    assert calls == {"put": ["engine/upload.py"], "read_into": ["engine/fetching.py"],
                     "read_span": ["engine/fetching.py"], "RangeFetch loop": ["engine/fetching.py"]}, calls


def _modules_naming(pattern: str) -> list[str]:
    return sorted(str(path.relative_to(SRC)) for path in _sources()
                  if re.search(pattern, path.read_text(encoding="utf-8")))


def test_what_a_whole_read_checks_is_decided_in_one_place() -> None:
    """--check-md5's modes are read in engine/digest.py alone (whole_check, verify_whole); every read asks it."""
    assert _modules_naming(r"CheckMd5\.(NO_CHECK|LOG_ONLY|FAIL_IF)") == ["config.py", "engine/digest.py"]
    assert _modules_naming(r"\bwhole_check\(") == ["client.py", "cluster/client.py", "cluster/split.py",
                                                   "engine/digest.py", "engine/download.py"]


def test_every_read_of_a_blob_is_a_checked_get() -> None:
    """read_checked (one ranged GET with its transit check) is what every read of blob bytes runs: in RangeFetch
    (several ranges), the single-GET download, a Client's one-request read and a copy's source read through this
    machine; a module outside the engine and the backends names neither Store.read_into nor read_span."""
    assert _modules_naming(r"\bread_checked\(") == ["client.py", "engine/download.py", "engine/fetching.py",
                                                     "engine/s2s.py"]
    outside = [m for m in _modules_naming(r"\bstore\.read_(into|span)\(")
               if not m.startswith(("engine/", "backends/"))]
    assert outside == [], outside


def test_the_cluster_ships_one_task_graph() -> None:
    """A split file's tasks are wired in cluster/tasks.split_graph alone: each executor only submits them."""
    assert _modules_naming(r"\btasks\.(STAGE|FETCH|MD5|COMMIT|FINISH)\b") == []
    assert _modules_naming(r"\bsplit_graph\(") == ["cluster/dask_adapter.py", "cluster/processes.py",
                                                    "cluster/tasks.py"]


def test_the_config_cites_modules_that_exist() -> None:
    """A path named in a docstring or comment of config.py (cli/x.py, engine/y.py) is a module of src/."""
    text = (SRC / "config.py").read_text(encoding="utf-8")
    cited = set(re.findall(r"\b((?:cli|engine|jobs|cluster|backends|journal|local)/\w+\.py)\b", text))
    assert all((SRC / c).exists() for c in cited), [c for c in cited if not (SRC / c).exists()]


def test_no_cluster_module_reads_or_writes_a_transfers_files_itself() -> None:
    """The cluster cuts, ships and records: the files of a transfer are opened by the engine alone (its chunked
    write over a window, its hash of a file, its partial download file)."""
    assert [m for m in _modules_naming(r"\b(OpenFile|PartFile)\(") if m.startswith("cluster/")] == []


def test_every_chunked_write_of_bytes_runs_one_chunk_loop() -> None:
    """A file's blocks, a stream's and a split file's window all go through engine/chunks.ChunkLoop: the one place
    a part of bytes is staged (`writer.stage(`) and a block's whole-MD5 step is queued (issue 49, point 3). A
    service copy stages no bytes (`stage_from`, engine/s2s.ServiceParts)."""
    assert _modules_naming(r"\bwriter\.stage\(") == ["engine/chunks.py"]
    assert _modules_naming(r"\bclass \w*(ChunkLoop|Chunks?Loop)\b") == ["engine/chunks.py"]
    assert _modules_naming(r"\bHASH_AHEAD\b") == ["engine/chunks.py"]
    assert _modules_naming(r"\bChunkLoop\(") == ["engine/staging.py", "engine/streaming.py"]


def test_a_module_function_opens_a_client_and_calls_it() -> None:
    """`Client.copy(...)` (sync, watch, remove, resume) is the implementation, `calls.*_on(session, ...)` run on the
    Client's session; `blobsync.copy(...)` opens a Client for the one call and calls that method, as httpx's module
    functions do (issue 49, point 3). The module layer imports the Client, never the reverse."""
    from blobsync import aio, calls
    from blobsync.client import AsyncClient

    for name in ("copy", "sync", "watch", "remove", "resume"):
        one = getattr(calls, f"{name}_on")
        assert getattr(AsyncClient, name).__wrapped__ is one, name
        assert getattr(aio, name).__wrapped__ is one, name
        assert "_for_call" in getattr(aio, name).__code__.co_names, name
    assert not [n for n in _imports(SRC / "client.py") if n.startswith("blobsync.api")]
    assert not [n for n in _imports(SRC / "calls.py") if n.startswith(("blobsync.api", "blobsync.client"))]
