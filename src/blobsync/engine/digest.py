"""The hashes the engine computes (the check sent with each part, the whole-file MD5, xxh3-128 for deltas) and the
one check of a download's MD5."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from blobsync.backends.base import BlockCheck, PartCheck
from blobsync.checksums import part_check
from blobsync.config import CheckMd5
from blobsync.errors import ChecksumMismatchError, IntegrityError

if TYPE_CHECKING:
    from blobsync.backends.base import Buffer

    Md5 = hashlib._Hash  # an MD5 being fed, range by range, in file order (a typeshed name only)

log = logging.getLogger("blobsync")
EMPTY_MD5 = hashlib.md5().digest()
_FILE_STEP = 8 * 1024 * 1024


def new_md5() -> Md5:
    return hashlib.md5()


def md5_of(data: Buffer) -> bytes:
    return hashlib.md5(data).digest()


def block_digests(data: Buffer, unchanged: bytes | None = None, check: BlockCheck | None = BlockCheck.MD5
                  ) -> tuple[PartCheck | None, bytes]:
    """(the part's check, xxh3-128) of one block, in the worker thread that read it.

    The xxh3-128 digest is what a delta upload compares blocks by. When it equals `unchanged` (the committed
    block's), or `check` is None (the store holds the block already, or verifies nothing), the block is not
    sent or not checked, so its check is skipped (None)."""
    digest = xxhash.xxh3_128_digest(data)
    return (None if digest == unchanged or check is None else part_check(data, check)), digest


def feed(hasher: Md5, chunks: Iterable[Buffer]) -> None:
    """Feed bytes to an in-order hash (ranges already on disk, read back in order)."""
    for chunk in chunks:
        hasher.update(chunk)


def md5_of_file(path: Path) -> bytes:
    """The MD5 of a whole local file (a sync by MD5), read in 8 MiB steps."""
    digest = hashlib.md5()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_FILE_STEP):
            digest.update(chunk)
    return digest.digest()


class HashLanes:
    """The threads whole-file MD5s run on: every update of one file goes to the one lane it took (a file's MD5 is
    serial, in order), and files hashing at once take different lanes, as many as there are cores (hashlib lets go
    of the GIL). A lane is one thread; it is started when first used."""

    def __init__(self, lanes: int) -> None:
        self._pools = [ThreadPoolExecutor(1, thread_name_prefix=f"bs-md5-{i}") for i in range(max(1, lanes))]
        self._users = [0] * len(self._pools)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._pools)

    def take(self) -> int:
        """A lane for one file's hash (the least used one); give it back with `give_back`."""
        with self._lock:
            lane = min(range(len(self._users)), key=self._users.__getitem__)
            self._users[lane] += 1
        return lane

    def give_back(self, lane: int) -> None:
        with self._lock:
            self._users[lane] -= 1

    def pool(self, lane: int) -> ThreadPoolExecutor:
        return self._pools[lane]

    @contextlib.contextmanager
    def lane(self) -> Iterator[ThreadPoolExecutor]:
        """A lane's thread for the length of a `with` block: one file's whole hash."""
        taken = self.take()
        try:
            yield self._pools[taken]
        finally:
            self.give_back(taken)

    def shutdown(self) -> None:
        for pool in self._pools:
            pool.shutdown(wait=True)


def hash_threads(env: Mapping[str, str]) -> int:
    """How many files may hash at once: the cores this process may use (BLOBSYNC_HASH_THREADS overrides: 1 is the
    one serial thread of before, for comparisons)."""
    given = env.get("BLOBSYNC_HASH_THREADS", "").strip()
    if given.isdigit() and 0 < int(given) <= 1024:
        return int(given)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


WRITTEN_NOWHERE = " (the same bytes on every fetch); nothing was written at the final path"


def check_md5(mode: CheckMd5, blob: str, stored: bytes | None, got: bytes | None, after: str = "") -> None:
    """What --check-md5 makes of the MD5 of the bytes read against the blob's Content-MD5 (raises, logs or passes):
    the one download check, of a file and of bytes read into memory alike; `after` says what a failure left."""
    if mode is CheckMd5.NO_CHECK:
        return
    if stored is None:
        if mode is CheckMd5.FAIL_IF_DIFFERENT_OR_MISSING:
            raise IntegrityError(f"{blob}: the blob has no Content-MD5 (--check-md5 FailIfDifferentOrMissing)")
        if mode is CheckMd5.LOG_ONLY:
            log.warning("%s: the blob has no Content-MD5 to check against", blob)
        return
    if stored != got:
        if mode is CheckMd5.LOG_ONLY:
            log.warning("%s: MD5 of the bytes read differs from the blob's Content-MD5 (--check-md5 LogOnly: kept)",
                        blob)
            return
        raise ChecksumMismatchError(f"{blob}: MD5 of the bytes read differs from the blob's Content-MD5{after}",
                                    digest=got)
