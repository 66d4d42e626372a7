"""What a slower server costs a client's CPU with nothing of blobsync in between: N small PUTs from a bare aiohttp
session (16 at once, a Content-MD5 each), against Azurite and against the null server, in this process.

    python bench/wakeups.py [--puts 2000] [--size-kib 16] [--repeat 2]

Prints the client's CPU per PUT and its voluntary context switches: against a server that answers before the
client has gone to sleep (the null server), answers arrive in batches and the event loop never waits; against
one that answers one at a time (Azurite, one JavaScript thread), every answer is a wake-up of its own."""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import os
import resource
import statistics
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.azurite import DEV_ACCOUNT, DEV_KEY, Azurite, NullServer


async def _puts(url: str, sas: str, data: bytes, count: int) -> None:
    import aiohttp

    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    headers = {"x-ms-blob-type": "BlockBlob", "Content-MD5": md5, "x-ms-version": "2021-08-06"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=20)) as session:
        slots = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with slots, session.put(f"{url}/f{i}?{sas}", data=data, headers=headers) as answer:
                await answer.read()
                if answer.status != 201:
                    raise RuntimeError(f"PUT answered {answer.status}")

        await asyncio.gather(*(one(i) for i in range(count)))


def one_run(kind: str, count: int, data: bytes) -> tuple[float, float, int]:
    from azure.storage.blob import BlobServiceClient, ContainerSasPermissions, generate_container_sas

    with tempfile.TemporaryDirectory(prefix="blobsync-wakeups-") as tmp:
        server = Azurite(Path(tmp)) if kind == "azurite" else NullServer(Path(tmp))
        with server:
            BlobServiceClient.from_connection_string(server.connection_string).create_container("wakeups")
            sas = generate_container_sas(DEV_ACCOUNT, "wakeups", account_key=DEV_KEY,
                                         permission=ContainerSasPermissions(write=True, create=True),
                                         expiry=datetime.now(UTC) + timedelta(hours=1))
            before = resource.getrusage(resource.RUSAGE_SELF)
            asyncio.run(_puts(f"{server.blob_endpoint}/wakeups", sas, data, count))
            after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return cpu / count * 1000, cpu, after.ru_nvcsw - before.ru_nvcsw


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--puts", type=int, default=2000)
    p.add_argument("--size-kib", type=int, default=16)
    p.add_argument("--repeat", type=int, default=2)
    a = p.parse_args()
    data = os.urandom(a.size_kib * 1024)
    runs: dict[str, list[tuple[float, float, int]]] = {"azurite": [], "null": []}
    for _ in range(a.repeat):
        for kind in runs:
            runs[kind].append(one_run(kind, a.puts, data))
    print(f"`python bench/wakeups.py --puts {a.puts} --size-kib {a.size_kib} --repeat {a.repeat}`, medians:\n")
    print("| Server | Client CPU ms per PUT | Client CPU s | Voluntary context switches |\n|---|---|---|---|")
    for kind, rows in runs.items():
        print(f"| {kind} | {statistics.median(r[0] for r in rows):.3f} | {statistics.median(r[1] for r in rows):.2f} | "
              f"{statistics.median(r[2] for r in rows):,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
