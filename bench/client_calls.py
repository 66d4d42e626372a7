"""Per-call overhead of the library: N small puts on one reused client, blobsync against its peers.

    python bench/client_calls.py [--calls 30] [--size-kib 16] [--repeat 5]

Against one fresh in-memory Azurite (bench/harness), in one process, the peers in the same run: blobsync's
`Client.put` and `aio.Client.put` (one session), `blobsync.copy` of a file per call (a short-lived session each,
what the module functions cost), the SDK's reused `ContainerClient.upload_blob`, and obstore's `put` where
installed. Prints the median wall time per call over `--repeat` rounds, each tool's ratio to the SDK, and what the
first call of a fresh process costs (import included), measured in a child process per tool."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.azurite import Azurite

KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _tools(az: Azurite, container: str, data: bytes, tmp: Path
           ) -> tuple[dict[str, Callable[[int], None]], Callable[[], None]]:
    from azure.storage.blob import BlobServiceClient

    import blobsync

    url = f"{az.blob_endpoint}/{container}"
    config = blobsync.TransferConfig(journal_path=tmp / "j.db")
    client = blobsync.Client(url, config)
    sdk = BlobServiceClient.from_connection_string(az.connection_string).get_container_client(container)
    aio_loop = asyncio.new_event_loop()
    aio_client = blobsync.aio.Client(url, config)
    files = tmp / "f.bin"
    files.write_bytes(data)
    tools: dict[str, Callable[[int], None]] = {
        "blobsync Client.put": lambda i: client.put(data, f"c/{i}"),
        "blobsync aio.Client.put": lambda i: aio_loop.run_until_complete(aio_client.put(data, f"a/{i}")),
        "blobsync.copy (a session per call)": lambda i: blobsync.copy(files, f"{url}/m/{i}", config),
        "SDK upload_blob (reused)": lambda i: sdk.upload_blob(f"s/{i}", data, overwrite=True),
    }
    try:
        import obstore
        from obstore.store import AzureStore

        # obstore ignores an emulator endpoint given in code; it reads AZURITE_BLOB_STORAGE_URL.
        os.environ["AZURITE_BLOB_STORAGE_URL"] = f"http://127.0.0.1:{az.port}"
        store = AzureStore(container, use_emulator=True, account_name="devstoreaccount1", access_key=KEY)

        tools["obstore put"] = lambda i: obstore.put(store, f"o/{i}", data)
    except ImportError:
        pass

    def close() -> None:
        client.close()
        aio_loop.run_until_complete(aio_client.close())
        aio_loop.close()

    return tools, close


def first_call(az: Azurite, container: str, tool: str, tmp: Path) -> float:
    """Seconds from a fresh interpreter's start to its first put done (import and session set-up included)."""
    code = {
        "blobsync Client.put": "import blobsync\nc = blobsync.Client(URL, blobsync.TransferConfig(journal_path=J))\n"
                               "c.put(b'x' * 16384, 'first/b')\nc.close()",
        "SDK upload_blob (reused)": "from azure.storage.blob import ContainerClient\n"
                                    "ContainerClient.from_connection_string(CS, CONT).upload_blob('first/s', "
                                    "b'x' * 16384, overwrite=True)",
    }[tool]
    prelude = (f"URL = {az.blob_endpoint + '/' + container!r}\nJ = {str(tmp / 'first.db')!r}\n"
               f"CS = {az.connection_string!r}\nCONT = {container!r}\n")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", prelude + code], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--size-kib", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    data = os.urandom(args.size_kib * 1024)
    with tempfile.TemporaryDirectory() as tmp_name, Azurite(Path(tmp_name)) as az:
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(az.connection_string).create_container("bench")
        tmp = Path(tmp_name)
        tools, close = _tools(az, "bench", data, tmp)
        for fn in tools.values():
            fn(-1)  # warm: connections open, imports done (the first call is measured apart)
        per_call: dict[str, list[float]] = {name: [] for name in tools}
        for _ in range(args.repeat):
            for name, fn in tools.items():  # interleaved, so a slow patch of the machine hits every tool
                started = time.perf_counter()
                for i in range(args.calls):
                    fn(i)
                per_call[name].append((time.perf_counter() - started) / args.calls)
        close()
        sdk = statistics.median(per_call["SDK upload_blob (reused)"])
        print(f"{args.calls} puts of {args.size_kib} KiB, median of {args.repeat} rounds, one Azurite:")
        print("| tool | ms per call | / SDK |\n|---|---|---|")
        for name, values in per_call.items():
            median = statistics.median(values)
            print(f"| {name} | {median * 1000:.2f} | {median / sdk:.2f}x |")
        print("\nfirst call of a fresh process (import, session, one put), median of 3:")
        for name in ("blobsync Client.put", "SDK upload_blob (reused)"):
            times = [first_call(az, "bench", name, tmp) for _ in range(3)]
            print(f"| {name} | {statistics.median(times) * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
