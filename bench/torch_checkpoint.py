"""A ~1 GiB PyTorch state dict saved to Blob and loaded back, every way side by side (issue 40):

    python bench/torch_checkpoint.py [--mib 1024] [--rounds 3] [--ways a,b,...]

Ways: save-then-cp (torch.save to local disk, then `blobsync cp`; loading: `blobsync cp` down, then torch.load),
client-open (torch.save into blobsync's Client.open("wb"), torch.load from Client.open), dcp-1 and dcp-2 (DCP with
BlobStorageWriter/Reader on 1 and 2 gloo ranks, each holding its half of every tensor), dcp-async (dcp.async_save:
the time training is blocked is until it returns), blobio (Microsoft's azstoragetorch BlobIO), dcp-adlfs (DCP's
fsspec writer and reader over adlfs). Each way runs in a child process of its own against a fresh in-memory
Azurite (bench/harness) behind a byte-counting relay; reported per way and direction: the median wall, the time
training waits (blocked), the child's peak RSS, and the bytes it sent (save) or received (load). Tools take turns
in every round; the state (float32 tensors of 64 MiB from a fixed seed) is made before the clock starts."""

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
from harness.azurite import Azurite  # noqa: E402
from harness.tcpproxy import DelayRelay  # noqa: E402

# bench/profile.py would stand in for the standard library's `profile` (which torch's DCP imports).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

ROOT = HERE.parent
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
WAYS = ("save-then-cp", "client-open", "dcp-1", "dcp-2", "dcp-async", "blobio", "dcp-adlfs")
TENSOR_MIB = 64


def _state(mib: int, zeros: bool = False, rank: int = 0, world: int = 1) -> dict[str, Any]:
    """The state dict: float32 tensors of TENSOR_MIB each (a rank's half of every tensor under 2 ranks)."""
    import torch

    torch.manual_seed(7)
    rows = TENSOR_MIB * 1024 * 1024 // 4 // 1024 // world
    make = torch.zeros if zeros else torch.randn
    return {f"layer{i}.weight": make(rows, 1024) for i in range(mib // TENSOR_MIB)}


def child(way: str, op: str, url: str, mib: int, local: str) -> dict[str, float]:
    """One save or load the given way; wall and blocked seconds (run in a process of its own)."""
    import torch

    state = _state(mib, zeros=op == "load")
    started = time.perf_counter()
    blocked = None
    if way == "save-then-cp":
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
    return {"wall": wall, "blocked": wall if blocked is None else blocked}


def _dcp(way: str, op: str, url: str, state: dict[str, Any]) -> float | None:
    import torch.distributed.checkpoint as dcp

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
    if way == "dcp-async":
        copied = time.perf_counter()
        del_me = {k: v.clone() for k, v in state.items()}  # the reference: one copy of the state in host memory
        host_copy = time.perf_counter() - copied
        del del_me
        print(json.dumps({"host_copy": host_copy}), file=sys.stderr)
        started = time.perf_counter()
        future = dcp.async_save(state, storage_writer=BlobStorageWriter(url), no_dist=True)
        blocked = time.perf_counter() - started
        future.result()
        return blocked
    dcp.save(state, storage_writer=BlobStorageWriter(url), no_dist=True)
    return None


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
    started = time.perf_counter()
    if op == "save":
        dcp.save(state, storage_writer=BlobStorageWriter(url))
    else:
        dcp.load(state, storage_reader=BlobStorageReader(url))
    wall = time.perf_counter() - started
    dist.destroy_process_group()
    Path(f"{out}.{rank}").write_text(json.dumps({"wall": wall, "blocked": wall}))


def _spawn(args: list[str], env: dict[str, str], tmp: Path) -> tuple[subprocess.Popen[bytes], Path]:
    err = tmp / f"stderr-{time.monotonic_ns()}"
    with err.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, __file__, *args], env=env, stdout=subprocess.PIPE, stderr=sink)
    return proc, err


def _host_copy(err: Path) -> float | None:
    for line in err.read_text(errors="replace").splitlines():
        if line.startswith('{"host_copy"'):
            return float(json.loads(line)["host_copy"])
    return None


def _reap(proc: subprocess.Popen[bytes], err: Path) -> tuple[bytes, float]:
    """Wait for a child: what it printed, and its own peak RSS (MiB, from wait4)."""
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{proc.args!r} failed: {err.read_text(errors='replace')[-2000:]}")
    return out, usage.ru_maxrss / 1024


def _run_child(args: list[str], env: dict[str, str], tmp: Path) -> dict[str, float]:
    proc, err = _spawn(args, env, tmp)
    out, rss = _reap(proc, err)
    copy = _host_copy(err)
    return {**json.loads(out.decode().strip().splitlines()[-1]), "rss_mib": rss,
            **({"host_copy": copy} if copy is not None else {})}


def one(way: str, mib: int, tmp: Path) -> dict[str, dict[str, float]]:
    """Save then load the given way against a fresh Azurite behind a counting relay."""
    figures: dict[str, dict[str, float]] = {}
    (tmp / f"az-{way}").mkdir(exist_ok=True)
    with Azurite(tmp / f"az-{way}") as az:
        relay = DelayRelay("127.0.0.1", 0, "127.0.0.1", az.port, 0.0).start_thread()
        try:
            endpoint = f"http://127.0.0.1:{relay.port}/devstoreaccount1"
            url = _prepare(az, endpoint, way)
            env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1",
                   "BENCH_CONNECTION_STRING": f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
                                              f"AccountKey={KEY};BlobEndpoint={endpoint};"}
            for op in ("save", "load"):
                before = (relay.bytes_up, relay.bytes_down)
                result = _dcp2(op, url, mib, tmp, env) if way == "dcp-2" else \
                    _run_child(["child", way, op, url, str(mib), str(tmp / "local.pt")], env, tmp)
                result["mb"] = ((relay.bytes_up - before[0]) if op == "save" else (relay.bytes_down - before[1])) / 1e6
                figures[op] = result
        finally:
            relay.stop_thread()
    return figures


def _dcp2(op: str, url: str, mib: int, tmp: Path, env: dict[str, str]) -> dict[str, float]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = str(tmp / f"dcp2-{op}")
    ranks = [_spawn(["rank", str(r), "2", str(port), op, url, str(mib), out], env, tmp) for r in range(2)]
    rss = sum(_reap(*rank)[1] for rank in ranks)  # both ranks' peaks: the machine holds both
    walls = [json.loads(Path(f"{out}.{r}").read_text())["wall"] for r in range(2)]
    return {"wall": max(walls), "blocked": max(walls), "rss_mib": rss}


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
    name = "bench/state.pt" if way in ("save-then-cp", "client-open", "blobio") else "bench/ckpt"
    return f"{endpoint}/{name}?{sas}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ways", default=",".join(WAYS))
    a = p.parse_args()
    ways = [w for w in a.ways.split(",") if w]
    runs: dict[str, list[dict[str, dict[str, float]]]] = {w: [] for w in ways}
    with tempfile.TemporaryDirectory(prefix="blobsync-torch-bench-") as tmp:
        for r in range(a.rounds):
            for way in ways[r % len(ways):] + ways[:r % len(ways)]:  # the order rotates each round
                runs[way].append(one(way, a.mib, Path(tmp)))
                print(f"round {r + 1}: {way}: {runs[way][-1]}", file=sys.stderr, flush=True)
    print(f"{a.mib} MiB state dict ({a.mib // TENSOR_MIB} float32 tensors), medians of {a.rounds} rounds:")
    print("| way | save wall s | blocked s | save MB/s | peak RSS MiB | MB sent | load wall s | load MB/s | "
          "peak RSS MiB | MB received |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    size = a.mib * 1024 * 1024 / 1e6
    for way in ways:
        med = {op: {k: statistics.median(run[op][k] for run in runs[way]) for k in runs[way][0][op]}
               for op in ("save", "load")}
        s, lo = med["save"], med["load"]
        print(f"| {way} | {s['wall']:.2f} | {s['blocked']:.2f} | {size / s['wall']:.0f} | {s['rss_mib']:.0f} | "
              f"{s['mb']:.0f} | {lo['wall']:.2f} | {size / lo['wall']:.0f} | {lo['rss_mib']:.0f} | {lo['mb']:.0f} |")
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
