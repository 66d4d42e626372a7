"""The peers' clients, run as measured child processes (and, inside a namespace, the harness's SDK chores).

Run as a script with the project's venv Python; it imports nothing from the harness, so its start-up, CPU and
RSS are the client library's own:

    child.py sdk-upload SRC CONTAINER [--recursive] [--validate]
    child.py sdk-download CONTAINER BLOB OUT [--validate]
    child.py obstore-upload SRC CONTAINER [--recursive]
    child.py obstore-download CONTAINER BLOB OUT
    child.py minimal-upload SRC CONTAINER [--recursive]   (a reference ceiling, not a peer: see minimal_upload)
    child.py mkcontainer CONTAINER
    child.py list CONTAINER                  -> {"count": N, "bytes": N} on stdout

The SDK reads AZURE_STORAGE_CONNECTION_STRING; obstore reads AZURITE_BLOB_STORAGE_URL (it ignores an endpoint
argument in emulator mode).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

SDK_CONCURRENCY = 8  # max_concurrency for one blob; files in flight for many (the setting)
OBSTORE_CONCURRENCY = 12  # put_async(max_concurrency=12): parts in flight for one file (the setting)
OBSTORE_FILES = 16  # files in flight for many files (as blobsync's default concurrency and rclone --transfers 16)
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def sources(src: Path, recursive: bool) -> list[tuple[str, Path]]:
    if not recursive:
        return [(src.name, src)]
    return sorted((p.relative_to(src).as_posix(), p) for p in src.rglob("*") if p.is_file())


def conn() -> str:
    return os.environ["AZURE_STORAGE_CONNECTION_STRING"]


def sdk_upload(a: argparse.Namespace) -> None:
    items = sources(a.src, a.recursive)
    if not a.recursive:
        from azure.storage.blob import BlobServiceClient

        name, path = items[0]
        blob = BlobServiceClient.from_connection_string(conn()).get_blob_client(a.container, name)
        with path.open("rb") as f:
            blob.upload_blob(
                f,
                length=path.stat().st_size,
                overwrite=True,
                max_concurrency=SDK_CONCURRENCY,
                validate_content=a.validate,
            )
        return

    from azure.storage.blob.aio import ContainerClient

    async def main() -> None:
        sem = asyncio.Semaphore(SDK_CONCURRENCY)
        async with ContainerClient.from_connection_string(conn(), a.container) as cc:

            async def put(name: str, path: Path) -> None:
                async with sem:
                    await cc.upload_blob(name, path.read_bytes(), overwrite=True, validate_content=a.validate)

            await asyncio.gather(*(put(n, p) for n, p in items))

    asyncio.run(main())


def sdk_download(a: argparse.Namespace) -> None:
    from azure.storage.blob import BlobClient

    client = BlobClient.from_connection_string(conn(), a.container, a.blob)
    with a.out.open("wb") as f:
        client.download_blob(max_concurrency=SDK_CONCURRENCY, validate_content=a.validate).readinto(f)


def obstore_store(container: str):  # type: ignore[no-untyped-def]
    from obstore.store import AzureStore

    return AzureStore(container, use_emulator=True, account_name=DEV_ACCOUNT, access_key=DEV_KEY)


def obstore_upload(a: argparse.Namespace) -> None:
    import obstore

    store = obstore_store(a.container)
    items = sources(a.src, a.recursive)

    async def main() -> None:
        if not a.recursive:
            name, path = items[0]
            await obstore.put_async(store, name, path, max_concurrency=OBSTORE_CONCURRENCY)
            return
        sem = asyncio.Semaphore(OBSTORE_FILES)

        async def put(name: str, path: Path) -> None:
            async with sem:
                await obstore.put_async(store, name, path.read_bytes())

        await asyncio.gather(*(put(n, p) for n, p in items))

    asyncio.run(main())


def obstore_download(a: argparse.Namespace) -> None:
    import obstore

    store = obstore_store(a.container)

    async def main() -> None:
        result = await obstore.get_async(store, a.blob)
        with a.out.open("wb") as f:
            async for chunk in result.stream():
                f.write(chunk)

    asyncio.run(main())


MINIMAL_BLOCK = 8 * 1024 * 1024  # blobsync's default block size
MINIMAL_CONCURRENCY = 16  # blobsync's usual level here (its auto concurrency settles at 16-32)


def minimal_upload(a: argparse.Namespace) -> None:
    """The least work any client can do: one file read block by block (MD5, PUT each, commit the list), or a tree
    one Put Blob per file (read, MD5, PUT), 16 requests at once.

    No journal, no whole-file MD5, no verification, no retries, no pacing, no safety checks: a ceiling for what
    aiohttp on this Azurite allows a Python client (the issue's "minimal aiohttp client"), against which
    blobsync's own overhead shows. Shared Key signing by hand, so that the SDK's import is not part of its cost.
    """
    import base64
    import hashlib
    import hmac
    from email.utils import formatdate
    from urllib.parse import quote, urlsplit

    import aiohttp

    settings = dict(part.split("=", 1) for part in conn().split(";") if part)
    account, key = settings["AccountName"], base64.b64decode(settings["AccountKey"])
    endpoint = settings["BlobEndpoint"].rstrip("/")

    def signed(path: str, length: int, md5: str, query: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
        headers = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": "2023-11-03", **extra}
        canonical_query = "".join(f"\n{k}:{v}" for k, v in sorted(query.items()))
        to_sign = (f"PUT\n\n\n{length or ''}\n{md5}\n\n\n\n\n\n\n\n"
                   + "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
                   + f"/{account}{urlsplit(endpoint).path}/{a.container}/{path}{canonical_query}")
        signature = base64.b64encode(hmac.new(key, to_sign.encode(), hashlib.sha256).digest()).decode()
        return {**headers, "Authorization": f"SharedKey {account}:{signature}",
                **({"Content-MD5": md5} if md5 else {})}

    def md5_of(data: bytes) -> str:
        return base64.b64encode(hashlib.md5(data).digest()).decode()

    async def main() -> None:
        sem = asyncio.Semaphore(MINIMAL_CONCURRENCY)
        connector = aiohttp.TCPConnector(limit=MINIMAL_CONCURRENCY)
        async with aiohttp.ClientSession(connector=connector, skip_auto_headers=("Content-Type",)) as session:

            async def put(name: str, query: dict[str, str], body: bytes, md5: str = "",
                          extra: dict[str, str] | None = None) -> None:
                path = quote(name)
                headers = signed(path, len(body), md5, query, extra or {})
                async with session.put(f"{endpoint}/{a.container}/{path}", params=query, data=body,
                                       headers=headers) as resp:
                    if resp.status != 201:
                        raise SystemExit(f"{resp.status}: {await resp.text()}")

            if a.recursive:
                async def whole(name: str, path: Path) -> None:
                    async with sem:
                        data = path.read_bytes()
                        await put(name, {}, data, md5_of(data), {"x-ms-blob-type": "BlockBlob"})

                await asyncio.gather(*(whole(n, p) for n, p in sources(a.src, True)))
                return
            fd = os.open(a.src, os.O_RDONLY)
            size = os.fstat(fd).st_size
            ids = [base64.b64encode(f"{i:08d}".encode()).decode() for i in range(-(-size // MINIMAL_BLOCK))]

            def read(index: int) -> tuple[bytes, str]:
                data = os.pread(fd, MINIMAL_BLOCK, index * MINIMAL_BLOCK)
                return data, md5_of(data)

            async def block(index: int) -> None:
                async with sem:
                    data, md5 = await asyncio.to_thread(read, index)
                    await put(a.src.name, {"comp": "block", "blockid": ids[index]}, data, md5)

            await asyncio.gather(*(block(i) for i in range(len(ids))))
            latest = "".join(f"<Latest>{i}</Latest>" for i in ids)
            xml = f"<?xml version='1.0' encoding='utf-8'?><BlockList>{latest}</BlockList>"
            await put(a.src.name, {"comp": "blocklist"}, xml.encode())

    asyncio.run(main())


def mkcontainer(a: argparse.Namespace) -> None:
    from azure.storage.blob import BlobServiceClient

    BlobServiceClient.from_connection_string(conn()).create_container(a.container)


def list_container(a: argparse.Namespace) -> None:
    from azure.storage.blob import BlobServiceClient

    count = size = 0
    for blob in BlobServiceClient.from_connection_string(conn()).get_container_client(a.container).list_blobs():
        count += 1
        size += int(blob.size)
    print(json.dumps({"count": count, "bytes": size}))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="child.py")
    sub = p.add_subparsers(dest="mode", required=True)
    for mode in ("sdk-upload", "obstore-upload", "minimal-upload"):
        s = sub.add_parser(mode)
        s.add_argument("src", type=Path)
        s.add_argument("container")
        s.add_argument("--recursive", action="store_true")
        s.add_argument("--validate", action="store_true")
    for mode in ("sdk-download", "obstore-download"):
        s = sub.add_parser(mode)
        s.add_argument("container")
        s.add_argument("blob")
        s.add_argument("out", type=Path)
        s.add_argument("--validate", action="store_true")
    for mode in ("mkcontainer", "list"):
        sub.add_parser(mode).add_argument("container")
    a = p.parse_args(argv)
    {
        "sdk-upload": sdk_upload,
        "sdk-download": sdk_download,
        "obstore-upload": obstore_upload,
        "obstore-download": obstore_download,
        "minimal-upload": minimal_upload,
        "mkcontainer": mkcontainer,
        "list": list_container,
    }[a.mode](a)
    if a.mode.startswith("obstore"):
        # obstore 0.12's Rust runtime sometimes aborts (SIGABRT, no message) while Python finalizes after
        # asyncio.run; the work is done and checked by the harness, so leave without finalizing.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
