"""Every hash blobsync computes: per-block MD5s sent with each part, the whole-file MD5, xxh3-128 for deltas."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:
    from blobsync.backends.base import Buffer

    Md5 = hashlib._Hash  # an MD5 being fed, range by range, in file order (a typeshed name only)
EMPTY_MD5 = hashlib.md5().digest()
_FILE_STEP = 8 * 1024 * 1024


def new_md5() -> Md5:
    return hashlib.md5()


def md5_of(data: Buffer) -> bytes:
    return hashlib.md5(data).digest()


def block_digests(data: Buffer, unchanged: bytes | None = None, need_md5: bool = True) -> tuple[bytes | None, bytes]:
    """(MD5, xxh3-128) of one block, in the worker thread that read it.

    The xxh3-128 digest is what a delta upload compares blocks by; it costs ~1/70 of the MD5. When it equals
    `unchanged` (the committed block's), or `need_md5` is False (the store holds the block already), the block
    is not sent, so its MD5 is skipped (None)."""
    digest = xxhash.xxh3_128_digest(data)
    return (None if digest == unchanged or not need_md5 else hashlib.md5(data).digest()), digest


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
