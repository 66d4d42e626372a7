"""What each checksum costs on this CPU, one thread and two: the figures behind blobsync's choice of part check.

    python bench/checksums.py [--mib 512]

For each implementation that imports here: GB/s and seconds of CPU per GiB on one thread (8 MiB buffers, as
blobsync's blocks), and whether two threads hashing at once go faster than one (an implementation that holds
the GIL makes the second thread wait, and stalls the event loop while it runs).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable

BLOCK = 8 * 1024 * 1024
CHECK = b"123456789"


def implementations() -> dict[str, Callable[[memoryview], object]]:
    impls: dict[str, Callable[[memoryview], object]] = {"MD5 (hashlib, OpenSSL)": lambda b: hashlib.md5(b).digest()}
    try:
        from awscrt.checksums import crc64nvme

        assert crc64nvme(CHECK) == 0xAE8B14860A799888  # CRC-64/NVME's check value: the Storage CRC64
        impls["Storage CRC64 (awscrt crc64nvme; blobsync's)"] = lambda b: struct.pack("<Q", crc64nvme(b))
    except ImportError:
        pass
    try:
        from azure.storage.extensions.checksums import crc64  # type: ignore[import-not-found]

        assert crc64.compute(CHECK, 0) == 0xAE8B14860A799888
        impls["Storage CRC64 (azure-storage-extensions; bytes only)"] = lambda b: crc64.compute(bytes(b), 0)
    except ImportError:
        pass
    impls["CRC32 (zlib)"] = lambda b: zlib.crc32(b)
    try:
        import xxhash

        impls["xxh3-128 (xxhash; delta digests)"] = lambda b: xxhash.xxh3_128_digest(b)
    except ImportError:
        pass
    return impls


def one_thread(fn: Callable[[memoryview], object], data: memoryview, total: int) -> float:
    fn(data)
    start, done = time.perf_counter(), 0
    while done < total:
        fn(data)
        done += len(data)
    return (time.perf_counter() - start) / (done / 2**30)


def two_threads(fn: Callable[[memoryview], object], data: memoryview, total: int) -> float:
    def work() -> None:
        for _ in range(total // len(data) // 2):
            fn(data)

    threads = [threading.Thread(target=work) for _ in range(2)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (time.perf_counter() - start) / (total / 2**30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=512, help="bytes hashed per measurement (default 512 MiB)")
    a = p.parse_args()
    data = memoryview(bytearray(os.urandom(BLOCK)))
    total = a.mib * 1024 * 1024
    print("| checksum | GB/s, one thread | s/GiB, one thread | wall s/GiB, two threads at once |")
    print("|---|---|---|---|")
    for name, fn in implementations().items():
        s1 = one_thread(fn, data, total)
        s2 = two_threads(fn, data, total)
        how = "parallel" if s2 < 0.75 * s1 else "serial"
        print(f"| {name} | {2**30 / s1 / 1e9:.2f} | {s1:.3f} | {s2:.3f} ({how}) |")


if __name__ == "__main__":
    main()
