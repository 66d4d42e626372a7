"""Client CPU per GiB: a DCP save and load through BlobStorageWriter/Reader against `blobsync cp` of the same bytes
(issue 48: the layer adds nothing to the engine), in one long-lived process so that every round reuses memory that
was touched before (fresh memory costs this VM ~8 us a page fault and swamps the figures of one-shot children):

    python bench/torch_cpu.py [--mib 1024] [--rounds 5] [--server azurite|null]

Per round, in turn: `blobsync.copy` of the state's torch.save file up (no whole MD5, as DCP's blobs), `dcp.save`
with BlobStorageWriter (no_dist), `blobsync.copy` of the blob down, `dcp.load` with BlobStorageReader into the same
tensors (every other round DCP first in each direction); each round against a fresh in-memory Azurite
(bench/harness), timed by this process's CPU (all its threads, user + system). Reported: medians and the ratio
DCP / cp."""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness.azurite import Azurite, NullServer  # noqa: E402

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/profile.py is not `profile`


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _steps(url: str, query: str, local: Path, down: Path, state: dict[str, Any], config: Any
           ) -> list[tuple[str, Callable[[], object]]]:
    """One round's four transfers, in turn: cp up, DCP save, cp down, DCP load (into the same tensors)."""
    import torch.distributed.checkpoint as dcp

    import blobsync
    from blobsync.torch import BlobStorageReader, BlobStorageWriter

    # Both with the same whole check: DCP's blobs carry the CRC64 composed from their blocks' and no whole MD5 (the
    # writer's default), so the file goes up with --no-put-md5.
    blob, folder = f"{url}/state.pt{query}", f"{url}/dcp{query}"
    def writer() -> BlobStorageWriter:
        return BlobStorageWriter(folder, config=config)

    def reader() -> BlobStorageReader:
        return BlobStorageReader(folder, config=config)

    return [("cp up", lambda: blobsync.copy(local, blob, config)),
            ("dcp save", lambda: dcp.save(state, storage_writer=writer(), no_dist=True)),
            ("cp down", lambda: blobsync.copy(blob, down, config)),
            ("dcp load", lambda: dcp.load(state, storage_reader=reader(), no_dist=True))]


@contextlib.contextmanager
def _server(kind: str, workdir: Path) -> Iterator[tuple[str, Any]]:
    """A fresh server for one round, its container URL and the config both sides run with: Azurite, or the null
    server keeping the bytes (the client's cost alone; each block with a CRC64, as on Azure)."""
    import blobsync
    from blobsync.config import BlockCheck

    if kind == "null":
        with NullServer(workdir, keep=True) as null:
            yield (f"{null.blob_endpoint}/bench", "?sv=2021-08-06&sig=x"), \
                blobsync.TransferConfig(put_md5=False, block_check=BlockCheck.CRC64)
        return
    with Azurite(workdir) as az:
        container = az.connection_string.split("BlobEndpoint=")[1].split(";")[0] + "/bench"
        with blobsync.Client(container) as client:
            client.make_container()
        yield (container, ""), blobsync.TransferConfig(put_md5=False)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--server", choices=("azurite", "null"), default="azurite",
                   help="null: the null server keeping the bytes, the client's cost alone")
    a = p.parse_args()
    import torch


    torch.manual_seed(7)
    state = {f"layer{i}.weight": torch.randn(16384, 1024) for i in range(a.mib // 64)}
    figures: dict[str, list[float]] = {"cp up": [], "dcp save": [], "cp down": [], "dcp load": []}
    walls: dict[str, list[float]] = {name: [] for name in figures}
    with tempfile.TemporaryDirectory(prefix="blobsync-torch-cpu-") as tmp:
        local = Path(tmp) / "state.pt"
        torch.save(state, local)
        for r in range(a.rounds):
            # A fresh server a round: Azurite's in-memory store frees deleted blobs' extents too late for its cap.
            (Path(tmp) / f"az{r}").mkdir()
            with _server(a.server, Path(tmp) / f"az{r}") as ((container, query), config):
                # The harness forks to start a server (preexec_fn): every page of the state is copy-on-write
                # until written once. Written here, so that the first load of a round does not pay 1 GiB of page
                # faults (~0.35 s) that belong to the harness.
                for tensor in state.values():
                    tensor.add_(0)
                steps = _steps(f"{container}/r{r}", query, local, Path(tmp) / f"down{r}.pt", state, config)
                if r % 2:  # every other round DCP goes first: Azurite slows as it holds more (the second upload
                    steps = [steps[1], steps[0], steps[3], steps[2]]  # into one took up to 2x the first's wall)
                for name, step in steps:
                    cpu, wall = _cpu(), time.perf_counter()
                    step()
                    figures[name].append(_cpu() - cpu)
                    walls[name].append(time.perf_counter() - wall)
                    print(f"round {r + 1}: {name}: {_cpu() - cpu:.2f} s CPU, {time.perf_counter() - wall:.2f} s "
                          "wall", file=sys.stderr, flush=True)
            (Path(tmp) / f"down{r}.pt").unlink()
    gib = a.mib / 1024
    med = {k: statistics.median(v) / gib for k, v in figures.items()}
    print(f"{a.mib} MiB state ({a.mib // 64} float32 tensors), client CPU s/GiB, medians of {a.rounds} rounds:")
    wall = {k: statistics.median(v) for k, v in walls.items()}
    print("| direction | blobsync cp | DCP through blobsync | DCP / cp | wall: cp | wall: DCP |")
    print("|---|---|---|---|---|---|")
    for direction, cp, layer in (("save (up)", "cp up", "dcp save"), ("load (down)", "cp down", "dcp load")):
        print(f"| {direction} | {med[cp]:.2f} | {med[layer]:.2f} | {med[layer] / med[cp]:.2f} | {wall[cp]:.2f} s | "
              f"{wall[layer]:.2f} s |")
    return 0


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    sys.exit(main())
