"""One adapter per tool and direction: the command line that uploads, downloads or syncs, and its environment."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness.azurite import REPO, connection_string

VENV_PYTHON = REPO / ".venv/bin/python"
BLOBSYNC_BIN = REPO / ".venv/bin/blobsync"
CHILD = Path(__file__).resolve().parent / "child.py"
PYCACHE = Path(tempfile.gettempdir()) / "blobsync-bench-pycache"  # the children's .pyc files (see env_for)

# Which tools exist for which direction, AzCopy first among the peers. Peers that are not installed are skipped,
# with a note in the report.
UPLOAD_TOOLS = ("blobsync", "blobsync-nomd5", "azcopy", "azcopy-md5", "sdk", "sdk-validate", "obstore", "rclone")
REFERENCE_TOOLS = ("minimal",)  # not peers: run only when named in --tools
DOWNLOAD_TOOLS = ("blobsync", "blobsync-nocheck", "azcopy", "azcopy-nocheck", "sdk", "sdk-validate", "obstore",
                  "rclone", "rclone-1stream")
SYNC_TOOLS = ("blobsync", "azcopy", "rclone")
AZCOPY_BIN = REPO / ".tools/azcopy/node_modules/@azure-tools/azcopy-linux/dist/bin/azcopy_linux_amd64"
# AzCopy's own knobs (AZCOPY_CONCURRENCY_VALUE, AZCOPY_BUFFER_GB, GOGC...): its defaults unless a measured
# setting serves it better on this machine (bench/RESULTS.md, "AzCopy's settings").
AZCOPY_ENV: dict[str, str] = {}

DESCRIPTIONS = {
    "blobsync": "`blobsync cp` / `blobsync sync`, defaults (16 requests in flight, 8 MiB blocks, a Storage CRC64 per "
    "block and the whole-file MD5 on upload, the whole-file MD5 checked on download)",
    "blobsync-nomd5": "`blobsync cp --no-put-md5` (blocks still carry their own check: a Storage CRC64, or an MD5 "
    "without awscrt)",
    "blobsync-nocheck": "`blobsync cp --check-md5 NoCheck`",
    "blobsync-cap": "`blobsync cp --cap-mbps N`",
    "blobsync-rcloneseeded": "`blobsync sync` (no-op workload) into a container rclone filled: rclone's blobs, its "
    "mtime metadata (`mtime`, RFC 3339, which blobsync reads as its own)",
    "blobsync-base": "blobsync, defaults, run from another checkout's `src/` (`--base-src`: A/B of two commits)",
    "blobsync-cluster1": "`blobsync cp --cluster local:1`: a LocalCluster of one worker process started by the command",
    "blobsync-cluster2": "`blobsync cp --cluster local:2`: two worker processes on this machine (the same two cores)",
    "sdk": "azure-storage-blob: one blob `upload_blob`/`download_blob(max_concurrency=8)`; many files: aio "
    "`upload_blob` under a semaphore of 8; `validate_content=False` (the SDK's default)",
    "sdk-validate": "the same with `validate_content=True` (an MD5 per request, checked by the service / client)",
    "obstore": "obstore `put_async(max_concurrency=12)` (5 MiB parts) for one file, 16 files in flight for many; "
    "download: one `get_async` stream",
    "rclone": "Debian rclone, `--transfers 16` (`--checkers 16` for sync; `--multi-thread-streams 8` for a "
    "download), `--retries 1 --low-level-retries 1`, remote `type = azureblob`, `use_emulator = true`, `endpoint`",
    "minimal": "reference, not a peer: a ~60-line aiohttp client (`child.py minimal-upload`): one file read in 8 MiB "
    "blocks, each MD5ed and PUT, 16 in flight, then committed; a tree one Put Blob (with Content-MD5) per file, 16 "
    "in flight; no journal, whole-file MD5, safety checks or retries: the ceiling aiohttp on this Azurite allows a "
    "Python client",
    "rclone-1stream": "rclone download with `--multi-thread-streams 0`: one GET, MD5 checked as it arrives",
    "azcopy": "AzCopy 10.32.2 (npm @azure-tools/azcopy-linux), `--from-to LocalBlob|BlobLocal --block-size-mb 8`, a "
    "container SAS; defaults otherwise (no `--put-md5`; downloads `--check-md5 FailIfDifferent`, its default); "
    "AzCopy's default concurrency and buffers",
    "azcopy-md5": "AzCopy with `--put-md5` (the whole-file MD5 stored as Content-MD5, as blobsync does by default)",
    "azcopy-nocheck": "AzCopy download with `--check-md5 NoCheck`",
}


@dataclass
class Settings:
    python: Path = VENV_PYTHON
    timeout: float = 900.0
    blobsync_args: list[str] = field(default_factory=list)
    memory_mb: float | None = None
    rclone: str = "rclone"
    rclone_streams: int = 8
    cap_mbps: float = 50.0
    max_background: float = 0.25
    noisy_pct: float = 20.0
    noisy_retries: int = 2
    idle_wait: float = 900.0
    keep_temp: bool = False
    base_src: Path | None = None  # blobsync-base runs the blobsync of this src/ (A/B against another commit)


@dataclass(frozen=True)
class Target:
    """Where the tool finds Azurite, as the tool sees it (a namespace's address in the slow-link workload)."""

    blob_endpoint: str  # http://HOST:PORT/devstoreaccount1
    netns: str | None = None  # the namespace the tool runs in
    # The null server stands for Azure, whose side costs nothing here: blobsync sends each block the check its
    # `--block-check auto` picks on Azure (a CRC64), not the emulator's MD5 (the URL is emulator style).
    like_azure: bool = False

    @property
    def base_url(self) -> str:
        return self.blob_endpoint.rsplit("/", 1)[0]

    @property
    def connection_string(self) -> str:
        return connection_string(self.blob_endpoint)

    @property
    def host(self) -> str:
        return self.base_url.split("//", 1)[1].rsplit(":", 1)[0]


def base_tool(tool: str) -> str:
    """blobsync-nomd5 -> blobsync, sdk-validate -> sdk, blobsync@20GiB -> blobsync."""
    return tool.split("@", 1)[0].split("-", 1)[0]


@functools.cache
def available(tool: str, python: Path = VENV_PYTHON, rclone: str = "rclone") -> str:
    """Empty if the tool can run here, else why not (the harness skips it and says so)."""
    kind = base_tool(tool)
    if kind == "blobsync":
        return "" if os.access(BLOBSYNC_BIN, os.X_OK) else f"blobsync CLI not found at {BLOBSYNC_BIN}"
    if kind in ("sdk", "obstore", "minimal"):
        module = {"sdk": "azure.storage.blob", "obstore": "obstore", "minimal": "aiohttp"}[kind]
        ok = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, timeout=120).returncode == 0
        return "" if ok else f"{module} is not importable by {python} (pip install {kind if kind != 'sdk' else ''})"
    if kind == "rclone":
        return "" if shutil.which(rclone) else "rclone not installed (apt-get install -y rclone)"
    if kind == "azcopy":
        if not AZCOPY_BIN.is_file():
            return f"AzCopy not installed at {AZCOPY_BIN} (bash bench/setup.sh)"
        done = subprocess.run([str(AZCOPY_BIN), "--version"], capture_output=True, text=True, timeout=60)
        return "" if done.returncode == 0 else f"AzCopy does not run here (libsecret-1-0?): {done.stderr.strip()[:200]}"
    return f"unknown tool {tool}"


def tool_version(tool: str, st: Settings) -> str:
    kind = base_tool(tool)
    try:
        if kind == "rclone":
            out = subprocess.run([st.rclone, "version"], capture_output=True, text=True, timeout=60).stdout
            return out.splitlines()[0] if out else "unknown"
        if kind == "azcopy":
            out = subprocess.run([str(AZCOPY_BIN), "--version"], capture_output=True, text=True, timeout=60).stdout
            return out.strip() or "unknown"
        dist = {"blobsync": "blobsync", "sdk": "azure-storage-blob", "obstore": "obstore", "minimal": "aiohttp"}[kind]
        code = f"import importlib.metadata as m; print(m.version({dist!r}))"
        return subprocess.run([str(st.python), "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError, KeyError):
        return "unknown"


def env_for(target: Target, tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    src = str(REPO / "src")  # the worktree's blobsync wins over whatever the venv has installed
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # Bytecode as an installed blobsync has it (pip compiles at install; site-packages here has its .pyc files),
    # kept outside the checkout. Without this, a caller's PYTHONDONTWRITEBYTECODE=1 (set on the machine these
    # figures come from) made every run compile all of src/ again: ~50 ms of CPU per blobsync start, paid by no
    # other tool, as every library the peers load was compiled once at install time.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    env.update(
        AZURE_STORAGE_CONNECTION_STRING=target.connection_string,
        AZURITE_BLOB_STORAGE_URL=target.base_url,  # obstore's emulator address
        XDG_STATE_HOME=str(tmp / "state"),  # nothing lands in the user's real state dir
        NO_PROXY=target.host,  # a proxy from the environment must never sit between client and Azurite
        no_proxy=target.host,
        # AzCopy's job plans and logs stay in the run's temp dir, and it never looks for a newer version.
        AZCOPY_JOB_PLAN_LOCATION=str(tmp / "azcopy-plans"),
        AZCOPY_LOG_LOCATION=str(tmp / "azcopy-logs"),
        **AZCOPY_ENV,
    )
    return env


def sas_url(target: Target, container: str, blob: str = "") -> str:
    """A URL with a container SAS (AzCopy takes no Shared Key), signed with the emulator's public dev key."""
    import datetime

    try:
        from azure.storage.blob import ContainerSasPermissions, generate_container_sas
    except ImportError:  # a host without the SDK (the lent GPU host): only the null server, which checks no auth
        sas = "sv=2021-08-06&sr=c&sp=racwdl&se=2099-01-01T00%3A00%3A00Z&sig=unsigned"
        return f"{target.blob_endpoint}/{container}{'/' + blob if blob else ''}?{sas}"

    from harness.azurite import DEV_ACCOUNT, DEV_KEY

    sas = generate_container_sas(
        DEV_ACCOUNT, container, account_key=DEV_KEY,
        permission=ContainerSasPermissions(read=True, add=True, create=True, write=True, delete=True, list=True),
        expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=6))
    return f"{target.blob_endpoint}/{container}{'/' + blob if blob else ''}?{sas}"


def resume_cmd(tool: str, first: list[str], target: Target, container: str, env: dict[str, str]) -> list[str]:
    """The command that resumes an interrupted upload: the same one again, or for AzCopy its own
    `azcopy jobs resume` of the job it left in the run's plan folder."""
    if base_tool(tool) != "azcopy":
        return first
    listed = subprocess.run([str(AZCOPY_BIN), "jobs", "list"], capture_output=True, text=True, timeout=60, env=env)
    job = next((line.split(":", 1)[1].strip() for line in listed.stdout.splitlines() if line.startswith("JobId:")),
               None)
    if job is None:
        raise ValueError(f"azcopy jobs list shows no job to resume: {listed.stdout[-300:]}")
    sas = sas_url(target, container).split("?", 1)[1]
    return _azcopy("jobs", "resume", job, "--destination-sas", sas)


def _azcopy(*args: str) -> list[str]:
    return [str(AZCOPY_BIN), *args, "--log-level", "ERROR", "--output-level", "essential"]


def in_netns(target: Target, cmd: list[str]) -> list[str]:
    return ["ip", "netns", "exec", target.netns, *cmd] if target.netns else cmd


def rclone_config(target: Target, tmp: Path) -> Path:
    # Both settings are needed: use_emulator alone goes to 127.0.0.1:10000, endpoint alone asks for a key.
    cfg = tmp / "rclone.conf"
    cfg.write_text(f"[az]\ntype = azureblob\nuse_emulator = true\nendpoint = {target.blob_endpoint}\n")
    return cfg


def _rclone(st: Settings, target: Target, tmp: Path, *args: str) -> list[str]:
    cfg = rclone_config(target, tmp)
    return [st.rclone, "--config", str(cfg), "--cache-dir", str(tmp / "rclone-cache"), *args,
            "--retries", "1", "--low-level-retries", "1"]  # fmt: skip


def _blobsync_tail(tool: str, tmp: Path, st: Settings, journal: Path | None = None) -> list[str]:
    extra: list[str] = []
    tool = tool.split("@", 1)[0]
    if tool == "blobsync-nomd5":
        extra.append("--no-put-md5")
    elif tool == "blobsync-nocheck":
        extra += ["--check-md5", "NoCheck"]
    elif tool == "blobsync-cap":
        extra += ["--cap-mbps", f"{st.cap_mbps:g}"]
    elif tool.startswith("blobsync-cluster"):
        extra += ["--cluster", f"local:{tool.removeprefix('blobsync-cluster')}"]
    if st.memory_mb is not None:
        extra += ["--memory-mb", f"{st.memory_mb:g}"]
    # A private journal per run: runs never see each other's jobs (the resume workload reuses one on purpose).
    return [*extra, *st.blobsync_args, "--quiet", "--journal", str(journal or tmp / "journal.db")]


def _blobsync(tool: str, st: Settings) -> list[str]:
    if tool == "blobsync-base":
        if st.base_src is None:
            raise ValueError("blobsync-base needs --base-src")
        # env execs: rusage stays blobsync's. The entry point of the base's own version (cli.entry came later).
        entry = ("import sys\ntry:\n    from blobsync.cli.entry import main\nexcept ImportError:\n"
                 "    from blobsync.cli.main import main\nsys.exit(main())")
        return ["env", f"PYTHONPATH={st.base_src}", str(st.python), "-c", entry]
    return [str(BLOBSYNC_BIN)]


def upload_cmd(
    tool: str, src: Path, recursive: bool, container: str, target: Target, tmp: Path, st: Settings
) -> list[str]:
    kind = base_tool(tool)
    if kind == "blobsync":
        url = f"{target.blob_endpoint}/{container}/"  # trailing slash: the blob keeps the file's name
        cmd = [*_blobsync(tool, st), "cp", str(src), url, *(["-r"] if recursive else []),
               *(["--block-check", "crc64"] if target.like_azure and tool != "blobsync-base" else []),
               *_blobsync_tail(tool, tmp, st)]  # fmt: skip
    elif kind in ("sdk", "obstore", "minimal"):
        cmd = [str(st.python), str(CHILD), f"{kind}-upload", str(src), container]
        cmd += ["--recursive"] if recursive else []
        cmd += ["--validate"] if tool == "sdk-validate" else []
    elif tool == "rclone":
        dest = f"az:{container}" if recursive else f"az:{container}/{src.name}"
        cmd = _rclone(st, target, tmp, "copy" if recursive else "copyto", str(src), dest, "--transfers", "16")
    elif kind == "azcopy":
        cmd = _azcopy("copy", str(src), sas_url(target, container), "--from-to", "LocalBlob", "--block-size-mb", "8",
                      *(["--recursive"] if recursive else []), *(["--put-md5"] if tool == "azcopy-md5" else []))
    else:
        raise ValueError(f"{tool} cannot upload")
    return in_netns(target, cmd)


def download_cmd(tool: str, container: str, blob: str, out: Path, target: Target, tmp: Path, st: Settings) -> list[str]:
    kind = base_tool(tool)
    if kind == "blobsync":
        cmd = [*_blobsync(tool, st), "cp", f"{target.blob_endpoint}/{container}/{blob}", str(out),
               *_blobsync_tail(tool, tmp, st)]  # fmt: skip
    elif kind in ("sdk", "obstore"):
        cmd = [str(st.python), str(CHILD), f"{kind}-download", container, blob, str(out)]
        cmd += ["--validate"] if tool == "sdk-validate" else []
    elif kind == "rclone":
        # rclone 1.60 skips its MD5 check after a multi-thread download ("Src hash empty - aborting Dst hash
        # check"); rclone-1stream turns multi-thread off: one GET, hashed as it arrives and checked.
        streams = 0 if tool == "rclone-1stream" else st.rclone_streams
        cmd = _rclone(st, target, tmp, "copyto", f"az:{container}/{blob}", str(out), "--transfers", "16",
                      "--multi-thread-streams", str(streams))  # fmt: skip
    elif kind == "azcopy":
        check = "NoCheck" if tool == "azcopy-nocheck" else "FailIfDifferent"
        cmd = _azcopy("copy", sas_url(target, container, blob), str(out), "--from-to", "BlobLocal",
                      "--block-size-mb", "8", "--check-md5", check)
    else:
        raise ValueError(f"{tool} cannot download")
    return in_netns(target, cmd)


def sync_cmd(tool: str, tree: Path, container: str, target: Target, tmp: Path, st: Settings) -> list[str]:
    if base_tool(tool) == "blobsync":
        cmd = [*_blobsync(tool, st), "sync", str(tree), f"{target.blob_endpoint}/{container}", "--create-container",
               *_blobsync_tail(tool, tmp, st)]  # fmt: skip
    elif tool == "rclone":
        cmd = _rclone(st, target, tmp, "sync", str(tree), f"az:{container}", "--transfers", "16", "--checkers", "16")
    elif tool == "azcopy":
        cmd = _azcopy("sync", str(tree), sas_url(target, container), "--from-to", "LocalBlob")
    else:
        raise ValueError(f"{tool} cannot sync")
    return in_netns(target, cmd)
