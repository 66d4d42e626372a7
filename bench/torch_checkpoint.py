"""A ~1 GiB PyTorch state dict saved to Blob and loaded back, every way side by side (issue 40):

    python bench/torch_checkpoint.py [--mib 1024] [--rounds 3] [--ways a,b,...]

Ways: cp (`blobsync cp` of the state's torch.save file, made before the clock: the engine alone, the CPU reference),
save-then-cp (torch.save to local disk, then `blobsync cp`; loading: `blobsync cp` down, then torch.load),
client-open (torch.save into blobsync's Client.open("wb"), torch.load from Client.open), dcp-1 and dcp-2 (DCP with
BlobStorageWriter/Reader on 1 and 2 gloo ranks, each holding its half of every tensor), dcp-async (dcp.async_save:
the time training is blocked is until it returns; in a thread), dcp-async-proc (the same in DCP's background
process), dcp-local, dcp-local-async, dcp-local-async-proc (DCP's FileSystemWriter to local disk: the anchor of the
blocked time), blobio (Microsoft's azstoragetorch BlobIO), dcp-adlfs (DCP's fsspec writer and reader over adlfs).
Fine-tuning ways (issue 50) save a state of the same size whose base (15/16 of the bytes) is frozen and whose
adapter (1/16) changes at every step, through `Checkpoints` in one process: step 1 is saved before the clock (it is
not measured), then step 2 is the save measured and `load()` of it the load: ckpt-full (every byte sent again),
ckpt-incremental (`incremental=True`: the service stages the unchanged blocks from step 1), ckpt-tier
(`local_dir=`: blocked is the local write, wall until the upload is complete), ckpt-tier-incremental (both).
Async ways run in a gloo group of one (DCP's process-based async needs a group) with DefaultStager and plan
caching, and pure-Python "training" steps run while they save (their rate against the idle rate: what the save takes
from training beyond the blocked time). Each way runs in a child process of its own against a fresh in-memory
Azurite (bench/harness) behind a byte-counting relay; reported per way and direction: the median wall, the time
training waits (blocked), the child's peak RSS, its CPU while the clock runs (user + system, a `blobsync cp` it
runs included; of async saves, the training steps' too), and the bytes it sent (save) or received (load). Tools take
turns in every round; the state (float32 tensors of 64 MiB from a fixed seed) is made before the clock starts."""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness.azurite import Azurite, NullServer  # noqa: E402
from harness.tcpproxy import DelayRelay  # noqa: E402

# bench/profile.py would stand in for the standard library's `profile` (which torch's DCP imports).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

ROOT = HERE.parent
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
WAYS = ("cp", "save-then-cp", "client-open", "dcp-1", "dcp-2", "dcp-async", "dcp-async-proc", "dcp-local",
        "dcp-local-async", "dcp-local-async-proc", "blobio", "dcp-adlfs", "ckpt-full", "ckpt-incremental", "ckpt-tier",
        "ckpt-tier-incremental")
ADAPTER_SHARE = 16  # a fine-tuning state's adapter: 1/16 of its bytes, the frozen base the rest
ASYNC = {"dcp-async": ("blob", "thread"), "dcp-async-proc": ("blob", "process"),
         "dcp-local-async": ("local", "thread"), "dcp-local-async-proc": ("local", "process")}
TENSOR_MIB = 64


def _state(mib: int, zeros: bool = False, rank: int = 0, world: int = 1) -> dict[str, Any]:
    """The state dict: float32 tensors of TENSOR_MIB each (a rank's half of every tensor under 2 ranks)."""
    import torch

    torch.manual_seed(7)
    rows = TENSOR_MIB * 1024 * 1024 // 4 // 1024 // world
    make = torch.zeros if zeros else torch.randn
    return {f"layer{i}.weight": make(rows, 1024) for i in range(mib // TENSOR_MIB)}


def _fine_tuning(mib: int, step: int) -> dict[str, Any]:
    """A fine-tuning state of `mib` MiB: a frozen base (the same at every step) and an adapter of 1/16 of the bytes
    that changes with the step."""
    import torch

    adapter = mib // ADAPTER_SHARE
    return {**_state(mib - adapter), "adapter": torch.full((adapter * 1024 * 1024 // 4 // 1024, 1024), float(step))}


def _ckpt(way: str, op: str, url: str, mib: int, local: str) -> dict[str, float]:
    """A fine-tuning way: step 1 ('first', before the clock), step 2 ('save'), or load() of the latest ('load'),
    the clock around the call alone (the state is made before it); blocked is until save() returns (with a local
    tier, the local write), the wall until the checkpoint is complete on Blob."""
    from blobsync import TransferConfig
    from blobsync.torch import Checkpoints

    tier = local + ".tier" if "tier" in way else None
    state = _fine_tuning(mib, 1 if op == "first" else 2) if op != "load" else None
    cap = float(os.environ.get("BENCH_CAP_MBPS", "0")) or None  # a link of this many Mbit/s at the client
    with Checkpoints(url, keep=2, incremental="incremental" in way, local_dir=tier,
                     config=TransferConfig(cap_mbps=cap)) as checkpoints:
        cpu0, started = _cpu(), time.perf_counter()
        if op == "load":
            checkpoints.load()
            wall = time.perf_counter() - started
            return {"wall": wall, "blocked": wall, "cpu": _cpu() - cpu0}
        assert state is not None
        pending = checkpoints.save(1 if op == "first" else 2, state)
        blocked = time.perf_counter() - started
        saved = pending.result() if hasattr(pending, "result") else pending
        wall, cpu = time.perf_counter() - started, _cpu() - cpu0
    print(json.dumps({"sent_share": saved.bytes_sent / saved.bytes}), file=sys.stderr)
    return {"wall": wall, "blocked": blocked, "cpu": cpu}


def child(way: str, op: str, url: str, mib: int, local: str) -> dict[str, float]:
    """One save or load the given way; wall and blocked seconds (run in a process of its own)."""
    import torch

    if way.startswith("ckpt-"):
        return _ckpt(way, op, url, mib, local)
    state = _state(mib, zeros=op == "load")
    if way == "cp" and op == "save":
        torch.save(state, local)  # before the clock: cp alone is measured
    cpu0 = _cpu()
    started = time.perf_counter()
    blocked = None
    if way == "cp":
        args = [local, url] if op == "save" else [url, local]
        subprocess.run([sys.executable, "-m", "blobsync", "cp", *args], check=True, capture_output=True)
    elif way == "save-then-cp":
        if op == "save":
            torch.save(state, local)
            subprocess.run([sys.executable, "-m", "blobsync", "cp", local, url], check=True, capture_output=True)
        else:
            subprocess.run([sys.executable, "-m", "blobsync", "cp", url, local], check=True, capture_output=True)
            torch.load(local, weights_only=True)
    elif way == "client-open":
        from blobsync import Client

        base, _, sas = url.partition("?")
        folder, name = base.rsplit("/", 1)
        with Client(f"{folder}?{sas}") as client:
            if op == "save":
                with client.open(name, "wb") as out:
                    torch.save(state, out)
            else:
                torch.load(client.open(name), weights_only=True)
    elif way == "blobio":
        from azstoragetorch.io import BlobIO

        if op == "save":
            with BlobIO(url, "wb") as out:
                torch.save(state, out)
        else:
            with BlobIO(url, "rb") as data:
                torch.load(data, weights_only=True)
    else:
        blocked = _dcp(way, op, url, state)
    wall = time.perf_counter() - started
    return {"wall": wall, "blocked": wall if blocked is None else blocked, "cpu": _cpu() - cpu0}


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children (a `blobsync cp`), user and system."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _dcp(way: str, op: str, url: str, state: dict[str, Any]) -> float | None:
    import torch.distributed.checkpoint as dcp

    if way in ASYNC:
        return _async(way, op, url, state)
    if way == "dcp-local":
        if op == "save":
            dcp.save(state, storage_writer=dcp.FileSystemWriter(url), no_dist=True)
        else:
            dcp.load(state, storage_reader=dcp.FileSystemReader(url), no_dist=True)
        return None
    if way == "dcp-adlfs":
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

        opts = {"connection_string": os.environ["BENCH_CONNECTION_STRING"]}
        if op == "save":
            dcp.save(state, storage_writer=FsspecWriter(url, **opts), no_dist=True)
        else:
            dcp.load(state, storage_reader=FsspecReader(url, **opts), no_dist=True)
        return None
    from blobsync.torch import BlobStorageReader, BlobStorageWriter

    if op == "load":
        dcp.load(state, storage_reader=BlobStorageReader(url), no_dist=True)
        return None
    dcp.save(state, storage_writer=BlobStorageWriter(url), no_dist=True)
    return None


def _async(way: str, op: str, url: str, state: dict[str, Any]) -> float | None:
    """async_save as DCP's fastest set-up runs it (its DefaultStager, plan caching; a thread or its background
    process), in a gloo group of one; blocked is until async_save returns. Loads are the plain load."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    from blobsync.torch import BlobStorageReader, BlobStorageWriter

    where, kind = ASYNC[way]
    if op == "load":
        reader = dcp.FileSystemReader(url) if where == "local" else BlobStorageReader(url)
        dcp.load(state, storage_reader=reader, no_dist=True)
        return None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    copied = time.perf_counter()
    del_me = {k: v.clone() for k, v in state.items()}  # the reference: one copy of the state in host memory
    print(json.dumps({"host_copy": time.perf_counter() - copied}), file=sys.stderr)
    del del_me
    writer = dcp.FileSystemWriter(url) if where == "local" else BlobStorageWriter(url)
    stager = DefaultStager(StagingOptions(False, False, False, False))
    idle, steps = time.perf_counter(), 0
    while time.perf_counter() - idle < 1.0:
        steps += _steps()
    idle_rate = steps / (time.perf_counter() - idle)
    started = time.perf_counter()
    response = dcp.async_save(state, storage_writer=writer, planner=DefaultSavePlanner(enable_plan_caching=True),
                              async_checkpointer_type=AsyncCheckpointerType.PROCESS if kind == "process" else
                              AsyncCheckpointerType.THREAD, async_stager=stager)
    blocked = time.perf_counter() - started
    done = getattr(response, "upload_completion", response)
    # "Training" while the save runs: pure-Python steps (the GIL is what a background save takes from them), as a
    # share of the rate with nothing else running.
    steps = 0
    while not done.done():
        steps += _steps()
    during = steps / (time.perf_counter() - started - blocked)
    done.result()
    stager.close()
    print(json.dumps({"train_share": during / idle_rate}), file=sys.stderr)
    return blocked


def _steps(n: int = 2000) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return n


def rank_main(rank: int, world: int, port: int, op: str, url: str, mib: int, out: str) -> None:
    """One of dcp-2's ranks: its half of every tensor as a DTensor shard, saved or loaded through the group."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from blobsync.torch import BlobStorageReader, BlobStorageWriter

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    local = _state(mib, zeros=op == "load", rank=rank, world=world)
    state = {k: DTensor.from_local(v, mesh, [Shard(0)], run_check=False) for k, v in local.items()}
    dist.barrier()
    cpu0 = _cpu()
    started = time.perf_counter()
    if op == "save":
        dcp.save(state, storage_writer=BlobStorageWriter(url))
    else:
        dcp.load(state, storage_reader=BlobStorageReader(url))
    wall = time.perf_counter() - started
    cpu = _cpu() - cpu0
    dist.destroy_process_group()
    Path(f"{out}.{rank}").write_text(json.dumps({"wall": wall, "blocked": wall, "cpu": cpu}))


def _spawn(args: list[str], env: dict[str, str], tmp: Path) -> tuple[subprocess.Popen[bytes], Path]:
    err = tmp / f"stderr-{time.monotonic_ns()}"
    with err.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, __file__, *args], env=env, stdout=subprocess.PIPE, stderr=sink)
    return proc, err


def _said(err: Path) -> dict[str, float]:
    """What the child said on stderr beside its result: the host copy's time, training's share during the save."""
    found: dict[str, float] = {}
    for line in err.read_text(errors="replace").splitlines():
        if line.startswith(('{"host_copy"', '{"train_share"', '{"sent_share"')):
            found.update(json.loads(line))
    return found


def _reap(proc: subprocess.Popen[bytes], err: Path) -> tuple[bytes, float, float]:
    """Wait for a child: what it printed, its own peak RSS (MiB) and its CPU seconds (its waited-for children
    included), from wait4."""
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{proc.args!r} failed: {err.read_text(errors='replace')[-2000:]}")
    return out, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def _run_child(args: list[str], env: dict[str, str], tmp: Path) -> dict[str, float]:
    proc, err = _spawn(args, env, tmp)
    out, rss, _ = _reap(proc, err)
    return {**json.loads(out.decode().strip().splitlines()[-1]), "rss_mib": rss, **_said(err)}


def one(way: str, mib: int, tmp: Path, server: str = "azurite") -> dict[str, dict[str, float]]:
    """Save then load the given way against a fresh Azurite (or the null server: saves only, the client's cost
    alone) behind a counting relay."""
    figures: dict[str, dict[str, float]] = {}
    (tmp / f"az-{way}").mkdir(exist_ok=True)
    with (Azurite if server == "azurite" else NullServer)(tmp / f"az-{way}") as az:
        relay = DelayRelay("127.0.0.1", 0, "127.0.0.1", az.port, 0.0).start_thread()
        try:
            endpoint = f"http://127.0.0.1:{relay.port}/devstoreaccount1"
            url = _prepare(az, endpoint, way) if not way.startswith("dcp-local") else \
                str(tmp / f"local-{way}-{time.monotonic_ns()}")
            env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1",
                   "BENCH_CONNECTION_STRING": f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
                                              f"AccountKey={KEY};BlobEndpoint={endpoint};"}
            if way.startswith("ckpt-"):  # step 1, not measured: what step 2 builds on
                _run_child(["child", way, "first", url, str(mib), str(tmp / f"local-{way}.pt")], env, tmp)
            for op in ("save", "load") if server == "azurite" else ("save",):
                before = (relay.bytes_up, relay.bytes_down)
                result = _dcp2(op, url, mib, tmp, env) if way == "dcp-2" else \
                    _run_child(["child", way, op, url, str(mib), str(tmp / f"local-{way}.pt")], env, tmp)
                result["mb"] = ((relay.bytes_up - before[0]) if op == "save" else (relay.bytes_down - before[1])) / 1e6
                figures[op] = result
        finally:
            relay.stop_thread()
    figures.setdefault("load", {k: float("nan") for k in figures["save"]})  # the null server keeps no bytes
    return figures


def _dcp2(op: str, url: str, mib: int, tmp: Path, env: dict[str, str]) -> dict[str, float]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = str(tmp / f"dcp2-{op}")
    ranks = [_spawn(["rank", str(r), "2", str(port), op, url, str(mib), out], env, tmp) for r in range(2)]
    rss = sum(_reap(*rank)[1] for rank in ranks)  # both ranks' peaks: the machine holds both
    said = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    return {"wall": max(s["wall"] for s in said), "blocked": max(s["wall"] for s in said), "rss_mib": rss,
            "cpu": sum(s["cpu"] for s in said)}


def _prepare(az: Azurite, endpoint: str, way: str) -> str:
    """The container and the URL the way writes to (a blob for the one-file ways, a folder for DCP)."""
    from datetime import UTC, datetime, timedelta

    from azure.storage.blob import BlobServiceClient, ContainerSasPermissions, generate_container_sas

    BlobServiceClient.from_connection_string(az.connection_string).create_container("bench")
    sas = generate_container_sas("devstoreaccount1", "bench", account_key=KEY,
                                 permission=ContainerSasPermissions(read=True, write=True, create=True, list=True,
                                                                    delete=True),
                                 expiry=datetime.now(UTC) + timedelta(hours=2))
    if way == "dcp-adlfs":
        return "abfs://bench/ckpt"
    name = "bench/state.pt" if way in ("cp", "save-then-cp", "client-open", "blobio") else "bench/ckpt"
    return f"{endpoint}/{name}?{sas}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ways", default=",".join(WAYS))
    p.add_argument("--server", choices=("azurite", "null"), default="azurite",
                   help="null: bench/harness/nullserver.py (saves only: the client's cost, no service's)")
    p.add_argument("--cap-mbps", type=float, default=0.0,
                   help="the fine-tuning ways' link: blobsync's own --cap-mbps on their Client (0: none)")
    a = p.parse_args()
    if a.cap_mbps:
        os.environ["BENCH_CAP_MBPS"] = str(a.cap_mbps)
    ways = [w for w in a.ways.split(",") if w]
    runs: dict[str, list[dict[str, dict[str, float]]]] = {w: [] for w in ways}
    with tempfile.TemporaryDirectory(prefix="blobsync-torch-bench-") as tmp:
        for r in range(a.rounds):
            for way in ways[r % len(ways):] + ways[:r % len(ways)]:  # the order rotates each round
                runs[way].append(one(way, a.mib, Path(tmp), a.server))
                print(f"round {r + 1}: {way}: {runs[way][-1]}", file=sys.stderr, flush=True)
    print(f"{a.mib} MiB state dict ({a.mib // TENSOR_MIB} float32 tensors), medians of {a.rounds} rounds, "
          f"{'Azurite' if a.server == 'azurite' else 'the null server'}"
          f"{f', fine-tuning ways capped at {a.cap_mbps:g} Mbit/s' if a.cap_mbps else ''}:")
    print("| way | save wall s | blocked s | save MB/s | CPU s/GiB | peak RSS MiB | MB sent | load wall s | load MB/s "
          "| CPU s/GiB | peak RSS MiB | MB received |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    gib = a.mib / 1024
    size = a.mib * 1024 * 1024 / 1e6
    for way in ways:
        med = {op: {k: statistics.median(run[op][k] for run in runs[way]) for k in runs[way][0][op]}
               for op in ("save", "load")}
        s, lo = med["save"], med["load"]
        print(f"| {way} | {s['wall']:.2f} | {s['blocked']:.2f} | {size / s['wall']:.0f} | {s['cpu'] / gib:.2f} | "
              f"{s['rss_mib']:.0f} | {s['mb']:.0f} | {lo['wall']:.2f} | {size / lo['wall']:.0f} | "
              f"{lo['cpu'] / gib:.2f} | {lo['rss_mib']:.0f} | {lo['mb']:.0f} |")
    for way in ways:
        shares = [run["save"]["train_share"] for run in runs[way] if "train_share" in run["save"]]
        if shares:
            print(f"{way}: pure-Python training steps ran at {statistics.median(shares):.0%} of their idle rate "
                  "while the save ran in the background (median)")
    for way in ways:
        shares = [run["save"]["sent_share"] for run in runs[way] if "sent_share" in run["save"]]
        if shares:
            print(f"{way}: step 2 sent {statistics.median(shares):.1%} of its bytes (median; the rest staged by the "
                  "service from step 1)")
    copies = [run["save"]["host_copy"] for way in ways for run in runs[way] if "host_copy" in run["save"]]
    if copies:
        print(f"\nOne copy of the state in host memory (dcp-async's child, before its save): median "
              f"{statistics.median(copies):.2f} s: the least an async save can block for.")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])))
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], int(sys.argv[7]),
                  sys.argv[8])
        os._exit(0)
    sys.exit(main())
