"""Blob to blob between two accounts of one Azurite: blobsync against AzCopy, rclone and the SDK, in one run.

    python bench/s2s.py [--large-mib 1024] [--small 2000] [--small-kib 16] [--repeat 3] [--tools ...]

One fresh in-memory Azurite (bench/harness) with two accounts; the source container of the first holds one large
blob and `--small` small ones. Each round copies each set with each tool into a fresh container of the second
account (each side with its own SAS): `blobsync cp -r`, `azcopy copy --from-to BlobBlob --recursive`, `rclone
copy` (two remotes, one per account), and the SDK (`start_copy_from_url` per blob, 16 threads, polled to the
end). Prints the median wall time, the tool's client CPU (its process, children included), Azurite's CPU, and
the requests each tool made by kind (one more run per tool through a counting proxy, not timed). Every copy is
checked: names, sizes and the Content-MD5 of each blob against the source's."""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))
from harness.azurite import DEV_ACCOUNT, DEV_KEY, SECOND_ACCOUNT, SECOND_KEY, Azurite  # noqa: E402

AZCOPY = REPO / ".tools/azcopy/node_modules/@azure-tools/azcopy-linux/dist/bin/azcopy_linux_amd64"
BLOBSYNC = REPO / ".venv/bin/blobsync"
TOOLS = ("blobsync", "azcopy", "rclone", "sdk")


def _sas(account: str, key: str, container: str) -> str:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    return generate_container_sas(account, container, account_key=key, expiry=datetime.now(UTC) + timedelta(hours=4),
                                  permission=ContainerSasPermissions(read=True, write=True, create=True, list=True,
                                                                     delete=True, add=True))


class Sides:
    """The source container (first account) and a fresh destination container per copy (second account)."""

    def __init__(self, base: str) -> None:
        from azure.storage.blob import BlobServiceClient

        self.base = base
        self.src = BlobServiceClient(f"{base}/{DEV_ACCOUNT}", credential={"account_name": DEV_ACCOUNT,
                                                                          "account_key": DEV_KEY})
        self.dst = BlobServiceClient(f"{base}/{SECOND_ACCOUNT}", credential={"account_name": SECOND_ACCOUNT,
                                                                             "account_key": SECOND_KEY})
        self.src.create_container("src")
        self.src_sas = _sas(DEV_ACCOUNT, DEV_KEY, "src")

    def src_url(self, prefix: str, base: str | None = None) -> str:
        return f"{base or self.base}/{DEV_ACCOUNT}/src/{prefix}?{self.src_sas}"

    def fresh_dest(self) -> tuple[str, str]:
        name = f"d{uuid.uuid4().hex[:12]}"
        self.dst.create_container(name)
        return name, _sas(SECOND_ACCOUNT, SECOND_KEY, name)

    def check(self, prefix: str, dest: str) -> None:
        """Every source blob under `prefix` is at the destination under the same name, same size and MD5."""
        want = {b.name: (b.size, bytes(b.content_settings.content_md5 or b""))
                for b in self.src.get_container_client("src").list_blobs(name_starts_with=prefix)}
        got = {b.name: (b.size, bytes(b.content_settings.content_md5 or b""))
               for b in self.dst.get_container_client(dest).list_blobs()}
        if got != want:
            missing = sorted(set(want) - set(got))[:3]
            raise ToolFailed(f"the copy differs from the source (missing {missing}, {len(got)} of {len(want)})")


def seed(sides: Sides, large_mib: int, small: int, small_kib: int) -> None:
    src = sides.src.get_container_client("src")
    block = os.urandom(8 * 1024 * 1024)
    # A 1 GiB blob of distinct blocks (each block salted), staged in parallel with its MD5 stored.
    import hashlib

    blob = src.get_blob_client("large/big.bin")
    md5 = hashlib.md5()
    chunks = [bytes([i % 251]) + block[1:] for i in range(large_mib // 8)]
    for c in chunks:
        md5.update(c)

    def stage(i: int) -> None:
        blob.stage_block(f"{i:08d}", chunks[i])

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(stage, range(len(chunks))))
    ids = [f"{i:08d}" for i in range(len(chunks))]
    from azure.storage.blob import BlobBlock, ContentSettings

    blob.commit_block_list([BlobBlock(i) for i in ids], content_settings=ContentSettings(
        content_type="application/octet-stream", content_md5=bytearray(md5.digest())))
    data = os.urandom(small_kib * 1024)

    def put(i: int) -> None:
        src.upload_blob(f"small/f{i:05d}.bin", data[i % 7:] + data[:i % 7])

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(small)))


def rclone_config(sides: Sides, base: str, dest: str, dest_sas: str, tmp: Path) -> Path:
    """Two remotes, one container each, by SAS URL (rclone's emulator mode knows only the first account)."""
    cfg = tmp / f"rclone-{dest}.conf"
    cfg.write_text(f"[src]\ntype = azureblob\nsas_url = {base}/{DEV_ACCOUNT}/src?{sides.src_sas}\n\n"
                   f"[dst]\ntype = azureblob\nsas_url = {base}/{SECOND_ACCOUNT}/{dest}?{dest_sas}\n")
    return cfg


def command(tool: str, sides: Sides, prefix: str, dest: str, dest_sas: str, base: str, tmp: Path) -> list[str]:
    src_url = sides.src_url(prefix, base)
    dst_url = f"{base}/{SECOND_ACCOUNT}/{dest}?{dest_sas}"
    if tool == "blobsync":
        return [str(BLOBSYNC), "cp", "-r", src_url, dst_url, "--quiet", "--journal", str(tmp / f"{dest}.db")]
    if tool == "azcopy":
        # Azurite has no Put Blob From URL, which AzCopy uses for a blob up to --put-blob-size-mb: a tiny threshold
        # makes every blob a Put Block From URL and a commit, which it has.
        return [str(AZCOPY), "copy", src_url, dst_url, "--recursive", "--from-to", "BlobBlob", "--log-level", "ERROR",
                "--output-level", "essential", "--s2s-preserve-access-tier=false", "--put-blob-size-mb", "0.0009765625"]
    if tool == "rclone":
        return ["rclone", "--config", str(rclone_config(sides, base, dest, dest_sas, tmp)), "copy", f"src:src/{prefix}",
                f"dst:{dest}/{prefix}", "--transfers", "16", "--retries", "1"]
    return [sys.executable, __file__, "--sdk-child", prefix, dest, base]


def sdk_child(prefix: str, dest: str, base: str) -> None:
    """The SDK's server-side copy: start_copy_from_url per blob from 16 threads, each polled until it is done."""
    from azure.storage.blob import BlobServiceClient

    src = BlobServiceClient(f"{base}/{DEV_ACCOUNT}", credential={"account_name": DEV_ACCOUNT, "account_key": DEV_KEY})
    dst = BlobServiceClient(f"{base}/{SECOND_ACCOUNT}", credential={"account_name": SECOND_ACCOUNT,
                                                                     "account_key": SECOND_KEY})
    sas = _sas(DEV_ACCOUNT, DEV_KEY, "src")
    names = [b.name for b in src.get_container_client("src").list_blobs(name_starts_with=prefix)]
    box = dst.get_container_client(dest)

    def copy(name: str) -> None:
        target = box.get_blob_client(name)
        target.start_copy_from_url(f"{base}/{DEV_ACCOUNT}/src/{name}?{sas}")
        while target.get_blob_properties().copy.status == "pending":
            time.sleep(0.05)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(copy, names))


class ToolFailed(Exception):
    """The tool could not do this workload here (exit code and its last words)."""


def run_one(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [""]
        raise ToolFailed(f"exit {done.returncode}: {last[0][:160]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def count_requests(tool: str, sides: Sides, prefix: str, az: Azurite, env: dict[str, str], tmp: Path) -> str:
    """The requests one copy makes, by kind, through the tests' counting proxy (a run of its own, not timed)."""
    from support.proxy import FaultProxy

    with FaultProxy(f"http://127.0.0.1:{az.port}") as proxy:
        dest, sas = sides.fresh_dest()
        run_one(command(tool, sides, prefix, dest, sas, proxy.url, tmp), env)
        sides.check(prefix, dest)
        counts = proxy.stats.requests
    shown = {op: n for op, n in sorted(counts.items()) if n}
    return ", ".join(f"{op} {n}" for op, n in shown.items())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--large-mib", type=int, default=1024)
    p.add_argument("--small", type=int, default=2000)
    p.add_argument("--small-kib", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--sdk-child", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.sdk_child:
        sdk_child(*a.sdk_child)
        return 0
    tools = [t for t in a.tools.split(",") if t]
    env = {**os.environ, "AZCOPY_AUTO_LOGIN_TYPE": "", "AZCOPY_DISABLE_SYSLOG": "true"}
    with tempfile.TemporaryDirectory(prefix="bench-s2s-") as tmpdir, Azurite(Path(tmpdir)) as az:
        tmp = Path(tmpdir)
        env["AZCOPY_LOG_LOCATION"] = env["AZCOPY_JOB_PLAN_LOCATION"] = str(tmp / "azcopy")
        base = f"http://127.0.0.1:{az.port}"
        sides = Sides(base)
        started = time.perf_counter()
        seed(sides, a.large_mib, a.small, a.small_kib)
        print(f"seeded {a.large_mib} MiB + {a.small} x {a.small_kib} KiB in {time.perf_counter() - started:.1f} s")
        results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        failed: dict[tuple[str, str], str] = {}
        for _ in range(a.repeat):
            for prefix in ("large", "small"):
                for tool in tools:
                    if (prefix, tool) in failed:
                        continue
                    dest, sas = sides.fresh_dest()
                    service = az.cpu_seconds()
                    try:
                        wall, cpu = run_one(command(tool, sides, prefix, dest, sas, base, tmp), env)
                        sides.check(prefix, dest)
                    except ToolFailed as exc:
                        failed[prefix, tool] = str(exc)
                        continue
                    finally:
                        sides.dst.delete_container(dest)
                    results.setdefault((prefix, tool), []).append((wall, cpu, az.cpu_seconds() - service))
        report(results, failed, a)
        for prefix in ("large", "small"):
            for tool in tools:
                if (prefix, tool) not in failed:
                    print(f"requests, {prefix}, {tool}: {count_requests(tool, sides, prefix, az, env, tmp)}")
    return 0


def report(results: dict[tuple[str, str], list[tuple[float, float, float]]], failed: dict[tuple[str, str], str],
           a: argparse.Namespace) -> None:
    labels = {"large": f"1 x {a.large_mib} MiB", "small": f"{a.small} x {a.small_kib} KiB"}
    print(f"\n| workload | tool | wall s (median of {a.repeat}) | vs blobsync | client CPU s | Azurite CPU s |")
    print("|---|---|---|---|---|---|")
    for (prefix, tool), runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        mine = statistics.median(r[0] for r in results.get((prefix, "blobsync"), runs))
        print(f"| {labels[prefix]} | {tool} | {wall:.2f} | {wall / mine:.2f}x | "
              f"{statistics.median(r[1] for r in runs):.2f} | {statistics.median(r[2] for r in runs):.2f} |")
    for (prefix, tool), why in failed.items():
        print(f"| {labels[prefix]} | {tool} | fails here ({why}) | | | |")


if __name__ == "__main__":
    sys.exit(main())
