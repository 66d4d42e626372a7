"""The workloads: data they need, how one run of one tool goes, and how each run is checked independently."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness.azurite import Azurite, BenchError, NullServer
from harness.measure import (
    ChildResult,
    ServerWatch,
    group_cpu_seconds,
    run_measured,
    system_busy_seconds,
    tail,
    wait_for_quiet,
)
from harness.netns import SlowLink
from harness.tcpproxy import DelayRelay
from harness.tools import (
    CHILD,
    DOWNLOAD_TOOLS,
    SYNC_TOOLS,
    UPLOAD_TOOLS,
    Settings,
    Target,
    download_cmd,
    env_for,
    resume_cmd,
    sync_cmd,
    upload_cmd,
)

MB = 1_000_000
MiB = 1 << 20
GiB = 1 << 30
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "blobsync-bench-cache"
BLOBSYNC_CONCURRENCY = 16  # blobsync's default --concurrency
BLOBSYNC_BLOCK_MIB = 8  # blobsync's default --block-size-mb


@dataclass
class Run:
    round: int
    tool: str
    wall_s: float = float("nan")
    cpu_s: float = float("nan")
    rss_mib: float = float("nan")
    azurite_cpu_s: float = float("nan")
    azurite_rss_mib: float = float("nan")
    other_cpu_s: float = float("nan")  # everything else on the machine during the run (should be ~0)
    returncode: int | None = None
    valid: bool = False
    discarded: bool = False  # valid but noisy, replaced by a re-run; not in the medians
    error: str = ""
    extra: dict[str, float] = field(default_factory=dict)  # workload-specific figures


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------
def _write_random(path: Path, size: int) -> None:
    # Random so no layer (Azurite, page cache, TCP) can compress or dedupe; numpy's generator where it is there
    # (a host's /dev/urandom can be very slow: the lent GPU host's is).
    try:
        import numpy

        make = numpy.random.default_rng(53).bytes
    except ImportError:
        make = os.urandom
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 16 * MiB)
            f.write(make(n))
            left -= n


def _publish(tmp: Path, final: Path) -> None:
    # Generate into a temp name and rename: an interrupted generation is never mistaken for a finished one.
    if final.exists():
        shutil.rmtree(final) if final.is_dir() else final.unlink()
    tmp.rename(final)


def size_label(mib: int) -> str:
    return f"{mib // 1024}GiB" if mib % 1024 == 0 else f"{mib}MiB"


def large_file(cache: Path, size_mib: int) -> Path:
    label = size_label(size_mib)
    folder = cache / f"large-{label}"
    path = folder / f"large-{label}.bin"
    if not (path.is_file() and path.stat().st_size == size_mib * MiB):
        print(f"bench: generating {path} ({size_mib} MiB of random bytes, once)", file=sys.stderr)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{path.name}.partial"
        _write_random(tmp, size_mib * MiB)
        _publish(tmp, path)
    return path


def sparse_file(cache: Path, size_mib: int) -> Path:
    folder = cache / f"sparse-{size_label(size_mib)}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sparse-{size_label(size_mib)}.bin"
    if not (path.is_file() and path.stat().st_size == size_mib * MiB):
        with path.open("wb") as f:
            f.truncate(size_mib * MiB)  # a hole: no disk used, reads return zeros
    return path


def small_tree(cache: Path, count: int, size: int, *, vary: bool = False) -> Path:
    """`count` files of `size` bytes (or 0..size-1 bytes with `vary`) in 20 nested folders."""
    name = f"small-{count}x{size // 1024}KiB" if not vary else f"tree-{count}x0-{size}B"
    folder = cache / name
    marker = cache / f"{name}.complete"  # outside the folder so it is never uploaded
    if not marker.exists():
        print(f"bench: generating {folder} ({count} files, once)", file=sys.stderr)
        tmp = cache / f".{name}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        for i in range(count):
            sub = tmp / f"dir{i % 4}" / f"sub{(i // 4) % 5}"  # blob names carry real relative paths
            sub.mkdir(parents=True, exist_ok=True)
            _write_random(sub / f"file{i:06d}.bin", (i % size) if vary else size)
        _publish(tmp, folder)
        marker.touch()
    return folder


def tree_stats(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def warm(root: Path) -> None:
    """Read the source once so every tool (the first included) starts with it in the page cache."""
    for p in [root] if root.is_file() else sorted(root.rglob("*")):
        if p.is_file():
            with p.open("rb") as f:
                while f.read(16 * MiB):
                    pass


# --------------------------------------------------------------------------------------------------
# Storage chores (in this process, or through the child inside a namespace)
# --------------------------------------------------------------------------------------------------
def mkcontainer(target: Target, container: str, st: Settings) -> None:
    if target.netns:
        _child(target, st, "mkcontainer", container)
        return
    from azure.storage.blob import BlobServiceClient

    BlobServiceClient.from_connection_string(target.connection_string).create_container(container)


def listing(target: Target, container: str, st: Settings) -> tuple[int, int]:
    """Blob count and total bytes, from an independent SDK listing."""
    if target.netns:
        out = json.loads(_child(target, st, "list", container))
        return int(out["count"]), int(out["bytes"])
    from azure.storage.blob import BlobServiceClient

    client = BlobServiceClient.from_connection_string(target.connection_string).get_container_client(container)
    count = size = 0
    for blob in client.list_blobs():
        count += 1
        size += int(blob.size)
    return count, size


def _child(target: Target, st: Settings, *args: str) -> str:
    cmd = ["ip", "netns", "exec", str(target.netns), str(st.python), str(CHILD), *args]
    env = env_for(target, Path(tempfile.gettempdir()))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {r.stderr.strip()[-2000:]}")
    return r.stdout


# --------------------------------------------------------------------------------------------------
# One measured run
# --------------------------------------------------------------------------------------------------
def measure(
    run: Run,
    cmd: list[str],
    env: dict[str, str],
    tmp: Path,
    azurite: Azurite,
    st: Settings,
    *,
    log_name: str = "child.log",
    kill_when: Callable[[], bool] | None = None,
    quiet_check: bool = True,
    helper_pgid: int | None = None,
) -> ChildResult:
    if quiet_check:
        wait_for_quiet(st.max_background, st.idle_wait)
    helper0 = group_cpu_seconds(helper_pgid) if helper_pgid else 0.0
    az0, sys0, me0 = azurite.cpu_seconds(), system_busy_seconds(), _own_cpu()
    watch = ServerWatch(azurite.pid)
    res = run_measured(cmd, env, tmp, tmp / log_name, st.timeout, kill_when, watch.sample)
    run.azurite_cpu_s = azurite.cpu_seconds() - az0
    # The harness itself (the resume workload's relay thread, the slow link's relay process) is not background noise.
    mine = _own_cpu() - me0 + (group_cpu_seconds(helper_pgid) - helper0 if helper_pgid else 0.0)
    if mine > 0.05:
        run.extra["harness_cpu_s"] = mine
    run.other_cpu_s = max(0.0, system_busy_seconds() - sys0 - run.azurite_cpu_s - res.user_s - res.sys_s - mine)
    run.azurite_rss_mib = azurite.peak_rss_mib()
    run.wall_s = res.wall_s
    run.cpu_s = res.user_s + res.sys_s
    # Where the CPU went: a tool can spend much of it in the kernel (page faults of fresh buffers on this VM).
    run.extra |= {"kernel_s": res.sys_s, "page_faults_k": res.page_faults / 1000,
                  "context_switches_k": res.context_switches / 1000, **watch.summary(res.wall_s)}
    run.rss_mib = res.maxrss_kib / 1024 if res.maxrss_kib else float("nan")
    run.returncode = res.returncode
    return res


def _own_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def exit_problems(res: ChildResult, st: Settings) -> list[str]:
    if res.timed_out:
        return [f"timed out after {st.timeout:g} s and was killed"]
    return [] if res.returncode == 0 else [f"exit code {res.returncode}"]


def finish(run: Run, problems: list[str], tmp: Path, log_name: str = "child.log") -> None:
    if problems:
        output = tail(tmp / log_name)
        run.error = "; ".join(problems) + (f"\n--- {run.tool} output ---\n{output}" if output else "")
    run.valid = not problems


@contextlib.contextmanager
def recorded(run: Run) -> Iterator[None]:
    """A failure of the harness itself (not of the tool) is recorded on the run, which then counts as invalid;
    BenchError (the harness cannot go on at all) propagates."""
    try:
        yield
    except BenchError:
        raise
    except Exception as exc:
        run.error = f"benchmark harness error: {exc!r}"


@contextlib.contextmanager
def run_dir(tool: str, st: Settings) -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix=f"blobsync-bench-{tool}-"))
    try:
        yield tmp
    finally:
        if st.keep_temp:
            print(f"bench: kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------------
class Workload:
    name = ""
    kind = "bytes"  # bytes (MB/s, CPU s/GiB) or files (files/s, CPU s per 1,000 files) or wall
    tools: tuple[str, ...] = ()
    description = ""
    files = 1
    total_bytes = 0

    def prepare(self) -> None:
        """Generate the data (cached) and warm the page cache; not timed."""

    @contextlib.contextmanager
    def session(self, tools: list[str], st: Settings) -> Iterator[None]:
        """State shared by all runs of the workload (most workloads have none: a fresh Azurite per run)."""
        yield

    def one(self, rnd: int, tool: str, st: Settings) -> Run:
        raise NotImplementedError

    def notes(self) -> list[str]:
        return []

    def bytes_for(self, tool: str) -> int:
        return self.total_bytes


class Upload(Workload):
    """One large file, or a folder of many files, uploaded into an empty container of a fresh Azurite."""

    container = "bench"

    def __init__(self, name: str, src_fn: Callable[[], Path], recursive: bool, description: str,
                 tools: tuple[str, ...] = UPLOAD_TOOLS, in_memory: bool = True,
                 server: type[Azurite] = Azurite) -> None:  # fmt: skip
        self.name, self.src_fn, self.recursive, self.description = name, src_fn, recursive, description
        self.server = server  # NullServer: the client's cost alone
        self.kind = "files" if recursive else "bytes"
        self.tools = tools
        self.in_memory = in_memory
        self.src = Path()

    def prepare(self) -> None:
        self.src = self.src_fn()
        self.files, self.total_bytes = tree_stats(self.src) if self.recursive else (1, self.src.stat().st_size)
        if self.in_memory:  # a sparse file reads as zeros from no disk at all: nothing to warm
            warm(self.src)

    def src_for(self, tool: str) -> Path:
        return self.src

    def one(self, rnd: int, tool: str, st: Settings) -> Run:
        run = Run(rnd, tool)
        with run_dir(tool, st) as tmp, recorded(run), self.server(tmp, in_memory=self.in_memory) as azurite:
            target = Target(azurite.blob_endpoint, like_azure=isinstance(azurite, NullServer))
            mkcontainer(target, self.container, st)
            cmd = upload_cmd(tool, self.src_for(tool), self.recursive, self.container, target, tmp, st)
            res = measure(run, cmd, env_for(target, tmp), tmp, azurite, st)
            problems = exit_problems(res, st)
            problems += check_listing(target, self.container, st, self.expect(tool))
            finish(run, problems, tmp)
        return run

    def expect(self, tool: str) -> tuple[int, int]:
        return self.files, self.total_bytes


class Throttled(Upload):
    """One large file up through the fault proxy, which answers a share of Put Blocks 503 ServerBusy with a
    Retry-After: how each tool backs off and what it sends again."""

    def __init__(self, src_fn: Callable[[], Path], pct: float, retry_after: float, label: str) -> None:
        super().__init__("throttled", src_fn, False, f"one {label} file up, {pct:g}% of Put Blocks answered 503 "
                         f"ServerBusy (Retry-After {retry_after:g} s)", tools=UPLOAD_TOOLS)
        self.pct, self.retry_after = pct, retry_after

    def one(self, rnd: int, tool: str, st: Settings) -> Run:
        from support.proxy import FaultProxy, Rule, respond

        run = Run(rnd, tool)
        with run_dir(tool, st) as tmp, recorded(run), self.server(tmp) as azurite, \
                FaultProxy(azurite.base_url) as proxy:
            proxy.add_rule(Rule("put_block", respond(503, "ServerBusy", retry_after=self.retry_after),
                                probability=self.pct / 100, seed=rnd))
            target = Target(proxy.endpoint())
            mkcontainer(target, self.container, st)
            cmd = upload_cmd(tool, self.src, False, self.container, target, tmp, st)
            res = measure(run, cmd, env_for(target, tmp), tmp, azurite, st)
            stats = proxy.stats
            run.extra |= {"faults": float(sum(stats.faults.values())), "put_blocks": float(stats.requests["put_block"]),
                          "requests": float(sum(stats.requests.values())),
                          "resent_mib": max(0, stats.bytes_in["put_block"] - self.total_bytes) / MiB}
            finish(run, exit_problems(res, st) + check_listing(target, self.container, st, self.expect(tool)), tmp)
        return run

    def notes(self) -> list[str]:
        return ["Each run: a fresh Azurite behind the suite's fault proxy (tests/support/proxy.py, in the benchmark "
                "process: its CPU is the harness's), which answers the chosen share of Put Block requests 503 "
                "ServerBusy with a Retry-After, seeded per round so every tool meets the same pattern. `resent_mib`: "
                "Put Block bodies sent beyond the file's size (the refused ones)."]


class Delta(Workload):
    """A large file synced, a few of its blocks changed, synced again (timed): what a tool sends for a small edit."""

    tools = SYNC_TOOLS

    def __init__(self, cache: Path, size_mib: int, changed_blocks: int) -> None:
        self.cache, self.size_mib, self.changed = cache, size_mib, changed_blocks
        self.name = "delta"
        self.description = (f"one {size_label(size_mib)} file re-synced after {changed_blocks} of its "
                            f"{BLOBSYNC_BLOCK_MIB} MiB blocks changed")
        self.src = Path()

    def prepare(self) -> None:
        self.src = large_file(self.cache, self.size_mib)
        self.total_bytes = self.src.stat().st_size
        warm(self.src)

    def one(self, rnd: int, tool: str, st: Settings) -> Run:
        run = Run(rnd, tool)
        with run_dir(tool, st) as tmp, recorded(run), Azurite(tmp) as azurite:
            target = Target(azurite.blob_endpoint)
            tree = tmp / "tree"
            tree.mkdir()
            shutil.copyfile(self.src, tree / self.src.name)
            mkcontainer(target, "delta", st)
            seed = measure(Run(rnd, tool), sync_cmd(tool, tree, "delta", target, tmp, st), env_for(target, tmp), tmp,
                           azurite, st, log_name="seed.log", quiet_check=False)
            problems = exit_problems(seed, st)
            digest = self._edit(tree / self.src.name, rnd)
            res = measure(run, sync_cmd(tool, tree, "delta", target, tmp, st), env_for(target, tmp), tmp, azurite, st)
            problems += exit_problems(res, st) + check_listing(target, "delta", st, (1, self.total_bytes))
            problems += self._check_bytes(target, digest)
            finish(run, problems, tmp)
        return run

    def _edit(self, path: Path, rnd: int) -> str:
        """Overwrite 4 KiB inside `changed` blocks spread over the file (mtime moves on); the new SHA-256."""
        block, count = BLOBSYNC_BLOCK_MIB * MiB, max(1, self.total_bytes // (BLOBSYNC_BLOCK_MIB * MiB))
        with path.open("r+b") as f:
            for i in range(self.changed):
                f.seek(((i * count // self.changed + rnd) % count) * block + 1000)
                f.write(os.urandom(4096))
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 2_000_000_000))  # newer than the seed, whatever the fs
        return _sha256(path)

    def _check_bytes(self, target: Target, digest: str) -> list[str]:
        from azure.storage.blob import BlobServiceClient

        client = BlobServiceClient.from_connection_string(target.connection_string)
        h = hashlib.sha256()
        for chunk in client.get_blob_client("delta", self.src.name).download_blob(max_concurrency=4).chunks():
            h.update(chunk)
        return [] if h.hexdigest() == digest else ["the blob's bytes differ from the edited file's"]

    def notes(self) -> list[str]:
        return ["Each run: a fresh Azurite; the tool syncs a copy of the file (not timed), 4 KiB inside each of "
                "the chosen blocks is overwritten, and the tool syncs again (timed). Checked by an SDK download "
                "whose SHA-256 must equal the edited file's. rclone and AzCopy send the whole file again; blobsync "
                "stages the changed blocks and commits a block list that reuses the others."]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 * MiB):
            h.update(chunk)
    return h.hexdigest()


def check_listing(target: Target, container: str, st: Settings, expect: tuple[int, int]) -> list[str]:
    try:
        got = listing(target, container, st)
    except Exception as exc:  # the check itself failing must not abort the other runs
        return [f"verification listing failed: {exc!r}"]
    if got != expect:
        return [f"listing has {got[0]} blobs / {got[1]} bytes, the source has {expect[0]} / {expect[1]}"]
    return []


class Download(Workload):
    """One large blob (seeded with the SDK, Content-MD5 set) downloaded into a fresh temp dir."""

    container = "bench-download"
    kind = "bytes"
    tools = DOWNLOAD_TOOLS

    def __init__(self, cache: Path, size_mib: int) -> None:
        self.cache, self.size_mib = cache, size_mib
        self.name = "download-large"
        self.description = f"one {size_label(size_mib)} blob of random bytes down to a local file"
        self.src = Path()
        self.md5 = b""
        self.sha256 = ""

    def prepare(self) -> None:
        self.src = large_file(self.cache, self.size_mib)
        self.total_bytes = self.src.stat().st_size
        md5, sha = hashlib.md5(), hashlib.sha256()
        with self.src.open("rb") as f:  # one pass: Content-MD5 to set, SHA-256 to check downloads; warms the cache
            while chunk := f.read(16 * MiB):
                md5.update(chunk)
                sha.update(chunk)
        self.md5, self.sha256 = md5.digest(), sha.hexdigest()

    def seed(self, target: Target) -> None:
        from azure.storage.blob import BlobServiceClient, ContentSettings

        svc = BlobServiceClient.from_connection_string(target.connection_string)
        svc.create_container(self.container)
        blob = svc.get_blob_client(self.container, self.src.name)
        with self.src.open("rb") as f:
            blob.upload_blob(f, length=self.total_bytes, overwrite=True, max_concurrency=8)
        blob.set_http_headers(
            content_settings=ContentSettings(content_type="application/octet-stream", content_md5=bytearray(self.md5))
        )

    def check(self, out: Path) -> str:
        try:
            size = out.stat().st_size
        except OSError as exc:
            return f"no downloaded file: {exc}"
        if size != self.total_bytes:
            return f"downloaded file has {size} bytes, the source has {self.total_bytes}"
        with out.open("rb") as f:
            got = hashlib.file_digest(f, "sha256").hexdigest()
        return "" if got == self.sha256 else f"SHA-256 of the download {got[:16]}... differs from the source's"

    def server(self, tmp: Path) -> Azurite:
        return Azurite(tmp)

    def one(self, rnd: int, tool: str, st: Settings) -> Run:
        run = Run(rnd, tool)
        with run_dir(tool, st) as tmp:
            (tmp / "dl").mkdir()
            out = tmp / "dl" / "out.bin"
            with recorded(run), self.server(tmp) as azurite:
                target = Target(azurite.blob_endpoint, like_azure=isinstance(azurite, NullServer))
                self.seed(target)
                cmd = download_cmd(tool, self.container, self.src.name, out, target, tmp, st)
                res = measure(run, cmd, env_for(target, tmp), tmp, azurite, st)
                problems = exit_problems(res, st)
                if bad := self.check(out):
                    problems.append(bad)
                finish(run, problems, tmp)
        return run

    def notes(self) -> list[str]:
        return [
            "The blob is uploaded into each fresh Azurite with the plain SDK (4 MiB blocks) and its Content-MD5 set "
            "(not timed). Every download is compared with the source by size and SHA-256 after the tool exits.",
            "Who checks what: blobsync checks the whole-file MD5 against Content-MD5 and fsyncs; `sdk-validate` checks "
            "an MD5 per 4 MiB range; rclone (multi-thread) skips its MD5 check in 1.60 (`Src hash empty`); "
            "rclone-1stream checks it; the SDK (default) and obstore check nothing.",
        ]


class NoopSync(Workload):
    """A no-op re-sync: each tool syncs the tree into its own container once (not timed), then again (timed);
    blobsync also over a container rclone filled (a migration from rclone must be as quiet)."""

    kind = "files"
    tools = (*SYNC_TOOLS, "blobsync-rcloneseeded")

    def __init__(self, cache: Path, files: int) -> None:
        self.cache, self.files = cache, files
        self.name = "noop-sync"
        self.description = f"no-op re-sync of {files:,} files (0-63 bytes each) already in the container"
        self.tree = Path()
        self.azurite: Azurite | None = None
        self.tmp = Path()

    def prepare(self) -> None:
        self.tree = small_tree(self.cache, self.files, 64, vary=True)
        self.files, self.total_bytes = tree_stats(self.tree)
        warm(self.tree)

    @contextlib.contextmanager
    def session(self, tools: list[str], st: Settings) -> Iterator[None]:
        # One Azurite for the whole workload: a no-op sync writes nothing, so nothing piles up in memory, and
        # seeding 10,000 blobs per run would cost more than the runs.
        with run_dir("noop", st) as tmp:
            self.tmp = tmp
            azurite = Azurite(tmp)
            self.azurite = azurite
            try:
                azurite.start()
                target = Target(azurite.blob_endpoint, like_azure=isinstance(azurite, NullServer))
                for tool in tools:
                    container = f"noop-{tool}"
                    mkcontainer(target, container, st)
                    seed = Run(0, tool)
                    seeder = "rclone" if tool == "blobsync-rcloneseeded" else tool  # blobsync over rclone's blobs
                    res = measure(seed, sync_cmd(seeder, self.tree, container, target, tmp, st), env_for(target, tmp),
                                  tmp, azurite, st, log_name=f"seed-{tool}.log", quiet_check=False)  # fmt: skip
                    expect = (self.files, self.total_bytes)
                    problems = exit_problems(res, st) + check_listing(target, container, st, expect)
                    if problems:
                        why = f"{problems}\n{tail(tmp / f'seed-{tool}.log')}"
                        raise BenchError(f"seeding {tool}'s container failed: {why}")
                    print(f"bench:   seeded {tool}'s container in {seed.wall_s:.1f} s", file=sys.stderr)
                yield
            finally:
                azurite.stop()
                self.azurite = None

    def one(self, rnd: int, tool: str, st: Settings) -> Run:
        assert self.azurite is not None
        run = Run(rnd, tool)
        target = Target(self.azurite.blob_endpoint)
        container = f"noop-{tool}"
        log = f"{tool}-{rnd}-{os.urandom(3).hex()}.log"
        with recorded(run):
            res = measure(run, sync_cmd(tool, self.tree, container, target, self.tmp, st), env_for(target, self.tmp),
                          self.tmp, self.azurite, st, log_name=log)  # fmt: skip
            problems = exit_problems(res, st) + check_listing(target, container, st, (self.files, self.total_bytes))
            finish(run, problems, self.tmp, log)
        return run

    def notes(self) -> list[str]:
        return [
            "One fresh Azurite for the whole workload (a no-op sync writes nothing); each tool first syncs the tree "
            "into its own container (not timed), then every timed run re-syncs it with nothing to do. Process start "
            "included. Each run is checked by listing the container (count and bytes unchanged).",
        ]


class Resume(Workload):
    """Kill a 1 GiB upload once half the file has gone out, then run the same command again."""

    kind = "bytes"
    tools = ("blobsync", "azcopy", "sdk", "obstore", "rclone")
    container = "bench-resume"

    def __init__(self, cache: Path, size_mib: int, kill_at: float = 0.5) -> None:
        self.cache, self.size_mib, self.kill_at = cache, size_mib, kill_at
        self.name = "resume"
        label = size_label(size_mib)
        self.description = f"upload of one {label} file killed (SIGKILL) at {kill_at:.0%} sent, then resumed"
        self.src = Path()

    def prepare(self) -> None:
        self.src = large_file(self.cache, self.size_mib)
        self.total_bytes = self.src.stat().st_size
        warm(self.src)

    def staged_bytes(self, target: Target) -> tuple[int, int]:
        """Bytes in the blob's uncommitted and committed blocks (what a resume could reuse)."""
        from azure.core.exceptions import ResourceNotFoundError
        from azure.storage.blob import BlobClient

        blob = BlobClient.from_connection_string(target.connection_string, self.container, self.src.name)
        try:
            committed, uncommitted = blob.get_block_list("all")
        except ResourceNotFoundError:
            return 0, 0
        return sum(b.size for b in uncommitted), sum(b.size for b in committed)

    def one(self, rnd: int, tool: str, st: Settings) -> Run:
        run = Run(rnd, tool)
        with run_dir(tool, st) as tmp:
            relay: DelayRelay | None = None
            try:
                with recorded(run), Azurite(tmp) as azurite:
                    relay = DelayRelay("127.0.0.1", 0, "127.0.0.1", azurite.port, 0.0).start_thread()
                    target = Target(f"http://127.0.0.1:{relay.port}/devstoreaccount1")
                    mkcontainer(Target(azurite.blob_endpoint), self.container, st)
                    cmd = upload_cmd(tool, self.src, False, self.container, target, tmp, st)
                    env = env_for(target, tmp)
                    half = self.kill_at * self.total_bytes
                    first = Run(rnd, tool)
                    res1 = measure(first, cmd, env, tmp, azurite, st, log_name="first.log",
                                   kill_when=lambda: relay is not None and relay.bytes_up >= half)  # fmt: skip
                    sent1 = relay.bytes_up
                    # Let what the relay still holds reach Azurite (as bytes in flight on a network would), then ask
                    # the service what it has, until two answers agree.
                    deadline = time.monotonic() + 30
                    while relay.active and time.monotonic() < deadline:
                        time.sleep(0.05)  # polling the relay's open connections
                    staged = self.staged_bytes(Target(azurite.blob_endpoint))
                    while time.monotonic() < deadline:
                        time.sleep(0.5)  # settle interval for requests Azurite is still finishing
                        again = self.staged_bytes(Target(azurite.blob_endpoint))
                        if again == staged:
                            break
                        staged = again
                    uncommitted, committed = staged
                    relay.bytes_up = 0
                    again_cmd = resume_cmd(tool, cmd, target, self.container, env)
                    res = measure(run, again_cmd, env, tmp, azurite, st, quiet_check=False)
                    sent2 = relay.bytes_up
                    remainder = self.total_bytes - uncommitted - committed
                    run.extra |= {
                        "sent_before_kill_mib": sent1 / MiB,
                        "staged_mib": (uncommitted + committed) / MiB,
                        "resent_mib": sent2 / MiB,
                        "remainder_mib": remainder / MiB,
                        "excess_mib": (sent2 - remainder) / MiB,
                        "first_wall_s": first.wall_s,
                    }
                    problems = [] if res1.killed_by_us else ["the first run was not killed mid-transfer"]
                    problems += exit_problems(res, st)
                    problems += check_listing(Target(azurite.blob_endpoint), self.container, st, (1, self.total_bytes))
                    finish(run, problems, tmp)
            finally:
                if relay is not None:
                    relay.stop_thread()
        return run

    def notes(self) -> list[str]:
        return [
            "Each run: a fresh Azurite behind a counting TCP relay (in the benchmark process, no delay); the tool "
            f"uploads the file and is SIGKILLed once {self.kill_at:.0%} of the file's bytes have gone through the "
            "relay; Get Block List then tells what the service holds (staged); the same command runs again (blobsync: "
            "same journal; AzCopy: its own `azcopy jobs resume <job> --destination-sas`) and the relay counts what it "
            "sends. Remainder = file size - staged bytes; excess = "
            "re-sent - remainder (request headers included, ~1 KiB per request). Wall/CPU/RSS columns are the "
            "second (resuming) run; the relay's Python CPU is not in them but shares the 2 cores.",
        ]


class SlowLinkUpload(Upload):
    """Uploads through a rate-limited veth between two namespaces, with per-request latency from a relay."""

    def __init__(self, name: str, src_fn: Callable[[], Path], recursive: bool, description: str,
                 rate_mbit: float, delay_ms: float, server: type[Azurite] = Azurite) -> None:  # fmt: skip
        # --cap-mbps is judged on the large file; many small files never reach the cap (latency-bound).
        tools = ("blobsync", "azcopy", "sdk", "obstore", "rclone") if recursive else (
            "blobsync", "blobsync-cap", "azcopy", "sdk", "obstore", "rclone")
        super().__init__(name, src_fn, recursive, description, tools, server=server)
        self.rate_mbit, self.delay_ms = rate_mbit, delay_ms
        self.link: SlowLink | None = None

    @contextlib.contextmanager
    def session(self, tools: list[str], st: Settings) -> Iterator[None]:
        with run_dir("slowlink", st) as tmp:
            link = SlowLink(self.rate_mbit, self.delay_ms, tmp, str(st.python))
            try:
                link.up(10001)  # Azurite's port inside the server namespace (fresh Azurite per run)
                self.link = link
                yield
            finally:
                self.link = None
                link.down()

    def one(self, rnd: int, tool: str, st: Settings) -> Run:
        assert self.link is not None
        run = Run(rnd, tool)
        with run_dir(tool, st) as tmp, recorded(run), self.server(tmp, netns=self.link.srv) as azurite:
            target = Target(self.link.endpoint, netns=self.link.cli, like_azure=isinstance(azurite, NullServer))
            mkcontainer(target, self.container, st)
            cmd = upload_cmd(tool, self.src, self.recursive, self.container, target, tmp, st)
            relay = self.link.relay.pid if self.link.relay is not None else None
            res = measure(run, cmd, env_for(target, tmp), tmp, azurite, st, helper_pgid=relay)
            problems = exit_problems(res, st) + check_listing(target, self.container, st, self.expect(tool))
            if run.wall_s == run.wall_s:
                run.extra["mbit_s"] = self.total_bytes * 8 / run.wall_s / 1e6
                run.extra["link_fraction"] = run.extra["mbit_s"] / self.rate_mbit
                settled = re.search(r"settled at (\d+) requests in flight", tail(tmp / "child.log"))
                if settled:  # blobsync's summary: where --concurrency auto ended up on this link
                    run.extra["auto_level"] = float(settled.group(1))
                if tool == "blobsync-cap":
                    run.extra["cap_accuracy"] = run.extra["mbit_s"] / st.cap_mbps
            finish(run, problems, tmp)
        return run

    def notes(self) -> list[str]:
        return [
            f"Slow link: the tools run in one network namespace, Azurite in another; between them a veth pair with "
            f"`tc qdisc ... tbf rate {self.rate_mbit:g}mbit burst 64kb latency 50ms` on both ends, and a TCP relay in "
            f"the server namespace that delays every byte by {self.delay_ms / 2:g} ms each way (+{self.delay_ms:g} ms "
            "per request round trip; netem is not in this kernel). Wall time includes process start, so achieved "
            "Mbit/s slightly understates the transfer rate. blobsync-cap is `--cap-mbps` (cap accuracy = achieved / "
            "cap).",
        ]


class SparseRss(Upload):
    """Peak RSS of blobsync uploading sparse files of growing size (Azurite on disk: the data exceeds memory)."""

    def __init__(self, cache: Path, sizes_mib: list[int]) -> None:
        self.sizes = {f"blobsync@{size_label(s)}": s for s in sizes_mib}
        super().__init__(
            "sparse-rss",
            lambda: sparse_file(cache, sizes_mib[0]),
            False,
            "peak RSS of `blobsync cp` uploading sparse files of " + ", ".join(size_label(s) for s in sizes_mib),
            tuple(self.sizes),
            in_memory=False,
        )
        self.cache = cache
        self.kind = "bytes"

    def prepare(self) -> None:
        self.paths = {tool: sparse_file(self.cache, s) for tool, s in self.sizes.items()}
        self.src = next(iter(self.paths.values()))
        self.files, self.total_bytes = 1, self.src.stat().st_size

    def src_for(self, tool: str) -> Path:
        return self.paths[tool]

    def expect(self, tool: str) -> tuple[int, int]:
        return 1, self.sizes[tool] * MiB

    def bytes_for(self, tool: str) -> int:
        return self.sizes[tool] * MiB

    def notes(self) -> list[str]:
        return [
            "Sparse files (`truncate`: a hole, read as zeros with no disk I/O). Azurite keeps the data on disk "
            "(`--location`, not `--inMemoryPersistence`): its in-memory store is capped at 50% of RAM (12 GiB here), "
            "below 20 GiB. The disk writes make Azurite slower than in the other workloads; only peak RSS "
            "matters here.",
            "Block buffers are pooled: peak RSS is the high-water mark of buffers in use at once, which a longer run "
            "pushes further (a slow request holds its buffer while later blocks are read) up to the `--memory-mb` "
            "budget (256 MiB), and no further. The check is that bound; the ratio of sizes is for information.",
        ]


class DownloadNoMd5(Download):
    """download-large with the blob stored without a Content-MD5 (as rclone's, AzCopy's and the SDK's chunked
    uploads leave it): nothing for any tool to check the whole file against."""

    def __init__(self, cache: Path, size_mib: int) -> None:
        super().__init__(cache, size_mib)
        self.name = "download-large-nomd5"
        self.description = f"one {size_label(size_mib)} blob of random bytes, stored without a Content-MD5, down"

    def seed(self, target: Target) -> None:
        from azure.storage.blob import BlobServiceClient

        svc = BlobServiceClient.from_connection_string(target.connection_string)
        svc.create_container(self.container)
        with self.src.open("rb") as f:  # blocks and a block list: no Content-MD5 stored
            svc.get_blob_client(self.container, self.src.name).upload_blob(f, length=self.total_bytes,
                                                                            overwrite=True, max_concurrency=8)

    def notes(self) -> list[str]:
        return ["The blob has no Content-MD5 (SDK block upload, none set afterwards): blobsync moves the bytes with "
                "the per-range checks only, as rclone's multi-stream download does; every download is still compared "
                "with the source by size and SHA-256 after the tool exits."]


class NullDownload(Download):
    """download-large against the null server: a zero-filled blob with its true MD5, served from memory."""

    def __init__(self, cache: Path, size_mib: int) -> None:
        super().__init__(cache, size_mib)
        self.name = "null-download-large"
        self.description = f"one {size_label(size_mib)} zero-filled blob down from the null server (client cost only)"

    def prepare(self) -> None:
        self.total_bytes = self.size_mib * MiB
        self.src = Path("zero.bin")
        sha = hashlib.sha256()
        for _ in range(self.size_mib):
            sha.update(bytes(MiB))
        self.sha256 = sha.hexdigest()

    def server(self, tmp: Path) -> Azurite:
        return NullServer(tmp, seeds=(f"{self.container}/{self.src.name}:{self.total_bytes}",))

    def seed(self, target: Target) -> None:
        """Seeded by the server itself."""

    def notes(self) -> list[str]:
        return ["The null server (bench/harness/nullserver.py) answers ranged GETs with zeros from memory and the "
                "blob's true MD5: the client's CPU per GiB is measured with no server cost on the two cores."]
