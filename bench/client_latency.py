"""Latency of small calls on one reused client: p50, p90 and p99 of put and get, blobsync against its peers.

    python bench/client_latency.py [--calls 300] [--sizes 512,1024,2048,4096] [--rounds 3]

Against one fresh in-memory Azurite (bench/harness), in one process, the peers in the same run: blobsync's
`Client.get`/`put`, blobsync's fsspec `cat_file`/`pipe_file`, the SDK's reused `ContainerClient`
(`download_blob().readall()`, `upload_blob`), obstore's `get`/`put` and adlfs's `cat_file`/`pipe_file` where
installed. Calls of all tools are interleaved call by call (a slow patch of the machine hits every tool alike);
each tool's percentiles are over every call of every round, with its ratio to the SDK's."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.azurite import Azurite

KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
Call = Callable[[str, bytes], object]


def _peers(az: Azurite, container: str, tmp: Path) -> tuple[dict[str, tuple[Call, Call]], Callable[[], None]]:
    """name -> (get(name, data), put(name, data)) for each tool that is installed, and how to close them."""
    from azure.storage.blob import BlobServiceClient

    import blobsync
    from blobsync.fsspec import BlobsyncFileSystem

    url = f"{az.blob_endpoint}/{container}"
    client = blobsync.Client(url, blobsync.TransferConfig(journal_path=tmp / "j.db"))
    fs = BlobsyncFileSystem(az.blob_endpoint, config=blobsync.TransferConfig(journal_path=tmp / "f.db"),
                            skip_instance_cache=True)
    sdk = BlobServiceClient.from_connection_string(az.connection_string).get_container_client(container)
    peers: dict[str, tuple[Call, Call]] = {
        "blobsync Client": (lambda n, d: client.get(n), lambda n, d: client.put(d, n)),
        "blobsync fsspec": (lambda n, d: fs.cat_file(f"{container}/{n}"),
                            lambda n, d: fs.pipe_file(f"{container}/{n}", d)),
        "SDK ContainerClient": (lambda n, d: sdk.download_blob(n).readall(),
                                lambda n, d: sdk.upload_blob(n, d, overwrite=True)),
    }
    try:
        import obstore
        from obstore.store import AzureStore

        os.environ["AZURITE_BLOB_STORAGE_URL"] = f"http://127.0.0.1:{az.port}"  # obstore reads the emulator here
        store = AzureStore(container, use_emulator=True, account_name="devstoreaccount1", access_key=KEY)
        peers["obstore"] = (lambda n, d: obstore.get(store, n).bytes(), lambda n, d: obstore.put(store, n, d))
    except ImportError:
        print("obstore not installed: left out", file=sys.stderr)
    try:
        import adlfs

        afs = adlfs.AzureBlobFileSystem(connection_string=az.connection_string, skip_instance_cache=True)
        peers["adlfs"] = (lambda n, d: afs.cat_file(f"{container}/{n}"),
                          lambda n, d: afs.pipe_file(f"{container}/{n}", d))
    except ImportError:
        print("adlfs not installed: left out", file=sys.stderr)

    def close() -> None:
        client.close()
        fs.client.close()

    return peers, close


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    return (statistics.median(ordered), ordered[int(len(ordered) * 0.9)], ordered[int(len(ordered) * 0.99)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--sizes", default="512,1024,2048,4096")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp_name, Azurite(Path(tmp_name)) as az:
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(az.connection_string).create_container("bench")
        peers, close = _peers(az, "bench", Path(tmp_name))
        blobs = {f"b{size}": os.urandom(size) for size in sizes}
        for name, data in blobs.items():  # every tool reads the same blobs (made by the SDK: a Content-MD5 each)
            BlobServiceClient.from_connection_string(az.connection_string).get_container_client(
                "bench").upload_blob(name, data, overwrite=True)
        times = {(tool, op): [] for tool in peers for op in ("get", "put")}
        for tool, (get, put) in peers.items():  # warm: connections open, imports done
            for name, data in blobs.items():
                get(name, data)
                put(f"{tool[:3]}-{name}", data)
        for _ in range(args.rounds):
            for i in range(args.calls):
                name = f"b{sizes[i % len(sizes)]}"
                for tool, (get, put) in peers.items():
                    for op, fn, target in (("get", get, name), ("put", put, f"{tool[:3]}-{name}")):
                        started = time.perf_counter()
                        fn(target, blobs[name])
                        times[(tool, op)].append(time.perf_counter() - started)
        close()
        print(f"{args.calls} calls x {args.rounds} rounds per tool and op, blobs of {args.sizes} bytes in turn, "
              "one Azurite, calls interleaved:")
        print("| op | tool | p50 ms | p90 ms | p99 ms | p50 / SDK | p99 / SDK |\n|---|---|---|---|---|---|---|")
        for op in ("get", "put"):
            sdk = _percentiles(times[("SDK ContainerClient", op)])
            for tool in peers:
                p50, p90, p99 = _percentiles(times[(tool, op)])
                print(f"| {op} | {tool} | {p50 * 1000:.2f} | {p90 * 1000:.2f} | {p99 * 1000:.2f} | "
                      f"{p50 / sdk[0]:.2f}x | {p99 / sdk[2]:.2f}x |")


if __name__ == "__main__":
    main()
