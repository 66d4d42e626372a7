"""The hashes the engine computes: the check sent with each part, the whole-file MD5, xxh3-128 for deltas."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from blobsync.backends.base import BlockCheck, PartCheck
from blobsync.checksums import part_check

if TYPE_CHECKING:
    from blobsync.backends.base import Buffer

    Md5 = hashlib._Hash  # an MD5 being fed, range by range, in file order (a typeshed name only)

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
