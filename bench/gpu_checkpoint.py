"""A bf16 state on the GPU saved with DCP through BlobStorageWriter and through DCP's FileSystemWriter to local disk,
and loaded back onto the GPU equal (issue 48, point 5: the one check that needs a lent GPU host).

    python bench/gpu_checkpoint.py [--mib 2048] [--rounds 3] [--device cuda] [--tensor-mib 64] [--server-processes N]

The blob side is the null server on the same host (bench/harness/nullserver.py: the client's cost alone). Each
round saves every way (blocks checked by CRC64, as on Azure), taking turns (the order alternates), into the same
folders: wall and this process's CPU (user + system) while the save runs, the GPU synchronised before the clock
starts; `blob` is the writer's default (no whole MD5: the CRC64 composed from the blocks' its whole check),
`blob-md5` commits each blob's Content-MD5 too (put_md5=True).
Then one more blob save to a null server that keeps the bytes (--keep), and each way loads into a state of
zeros on the device, compared with torch.equal. Prints medians and the ratio blob / local disk (the issue's goal:
<= 1). Runs where no GPU is (`--device cpu`), for checking the script itself."""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness.azurite import NullServer  # noqa: E402

# bench/profile.py would stand in for the standard library's `profile` (which torch's DCP imports).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent / "src"))

WAYS = ("local", "blob", "blob-md5")  # blob-md5: put_md5=True, a serial MD5 pass over each blob besides
# Each block with the check it carries on Azure (a Storage CRC64), as bench/large_file.py's `--block-check crc64`:
# on an emulator's address blobsync would send MD5s, which Azurite checks cheaper.
AS_ON_AZURE: Any = None


def state(mib: int, tensor_mib: int, device: str, zeros: bool = False) -> dict[str, Any]:
    """`mib` MiB of bf16 tensors of `tensor_mib` each (random, made on the device itself)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(48)
    rows = tensor_mib * 1024 * 1024 // 2 // 4096
    make = (lambda: torch.zeros(rows, 4096, dtype=torch.bfloat16, device=device)) if zeros else \
        (lambda: torch.randn(rows, 4096, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16))
    return {f"layer{i}.weight": make() for i in range(mib // tensor_mib)}


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def save(way: str, where: str, data: dict[str, Any], device: str) -> tuple[float, float]:
    import torch.distributed.checkpoint as dcp

    from blobsync.torch import BlobStorageWriter

    writer = dcp.FileSystemWriter(where) if way == "local" else \
        BlobStorageWriter(where, config=AS_ON_AZURE, put_md5=way == "blob-md5")
    _sync(device)
    cpu0, started = _cpu(), time.perf_counter()
    dcp.save(data, storage_writer=writer, no_dist=True)
    return time.perf_counter() - started, _cpu() - cpu0


def load(way: str, where: str, mib: int, tensor_mib: int, device: str) -> tuple[float, dict[str, Any]]:
    import torch.distributed.checkpoint as dcp

    from blobsync.torch import BlobStorageReader

    into = state(mib, tensor_mib, device, zeros=True)
    reader = dcp.FileSystemReader(where) if way == "local" else BlobStorageReader(where, config=AS_ON_AZURE)
    _sync(device)
    started = time.perf_counter()
    dcp.load(into, storage_reader=reader, no_dist=True)
    _sync(device)
    return time.perf_counter() - started, into


def main() -> int:
    import warnings

    import torch

    from blobsync import TransferConfig
    from blobsync.config import BlockCheck

    global AS_ON_AZURE
    AS_ON_AZURE = TransferConfig(block_check=BlockCheck.CRC64)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tensor-mib", type=int, default=64)
    p.add_argument("--server-processes", type=int, default=1, help="null server processes for the timed saves")
    a = p.parse_args()
    data = state(a.mib, a.tensor_mib, a.device)
    tmp = Path(tempfile.mkdtemp(prefix="blobsync-gpu-ckpt-"))
    runs: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    try:
        (tmp / "null").mkdir()
        with NullServer(tmp / "null", processes=a.server_processes) as server:  # the timed saves: the client alone
            places = {"local": str(tmp / "local"), **{w: f"{server.blob_endpoint}/bench/{w}?sv=2021-08-06&sig=x"
                                                      for w in WAYS[1:]}}
            for r in range(a.rounds):
                for way in WAYS if r % 2 == 0 else WAYS[::-1]:
                    runs[way].append(save(way, places[way], data, a.device))
                    print(f"round {r + 1} {way}: wall {runs[way][-1][0]:.2f} s, CPU {runs[way][-1][1]:.2f} s",
                          file=sys.stderr, flush=True)
        (tmp / "keep").mkdir()
        with NullServer(tmp / "keep", keep=True) as server:  # one more save, kept, read back
            places["blob"] = f"{server.blob_endpoint}/bench/ckpt?sv=2021-08-06&sig=x"
            save("blob", places["blob"], data, a.device)
            loads = {}
            for way in WAYS[:2]:
                wall, back = load(way, places[way], a.mib, a.tensor_mib, a.device)
                same = all(torch.equal(back[k], v) for k, v in data.items())
                loads[way] = (wall, same)
                del back
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    name = torch.cuda.get_device_name() if a.device.startswith("cuda") else "CPU"
    print(f"DCP save of {a.mib} MiB of bf16 on {a.device} ({name}), {a.mib // a.tensor_mib} tensors, medians of "
          f"{a.rounds}, torch {torch.__version__}:\n")
    print("| way | save wall s | save CPU s | load wall s | loaded back equal |")
    print("|---|---|---|---|---|")
    med = {w: (statistics.median(x for x, _ in runs[w]), statistics.median(c for _, c in runs[w])) for w in WAYS}
    labels = {"local": "DCP FileSystemWriter, local disk", "blob": "BlobStorageWriter, null server",
              "blob-md5": "BlobStorageWriter, null server, put_md5=True"}
    for way in WAYS:
        back = loads.get(way, (float("nan"), "-"))
        print(f"| {labels[way]} | {med[way][0]:.2f} | {med[way][1]:.2f} | {back[0]:.2f} | {back[1]} |")
    for way in WAYS[1:]:
        print(f"\n{way} / local disk, save wall: {med[way][0] / med['local'][0]:.2f}")
    return 0 if all(same for _, same in loads.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
