"""The hashes the engine computes (the check sent with each part, the whole-file MD5, the whole blob's CRC64
composed from its parts', xxh3-128 for deltas) and the one decision of what a whole read checks."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import struct
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

import xxhash

from blobsync.backends.base import BlockCheck, PartCheck
from blobsync.checksums import crc64_available, crc64_compose, crc64_int, crc64_value, part_check
from blobsync.config import CRC64_METADATA, CheckMd5
from blobsync.errors import ChecksumMismatchError, IntegrityError
from blobsync.local.platform import usable_cores

if TYPE_CHECKING:
    from blobsync.backends.base import BlobProperties, Buffer

    Md5 = hashlib._Hash  # an MD5 being fed, range by range, in file order (a typeshed name only)

log = logging.getLogger("blobsync")
EMPTY_MD5 = hashlib.md5().digest()
_FILE_STEP = 8 * 1024 * 1024


def new_md5() -> Md5:
    return hashlib.md5()


def md5_of(data: Buffer) -> bytes:
    return hashlib.md5(data).digest()


class BlockDigests(NamedTuple):
    """What reading one block for an upload gives: the check it is sent with (None: not sent, or not checked), its
    CRC64 (what the whole blob's check is composed of; None without awscrt) and its xxh3-128 (what a delta
    compares)."""

    check: PartCheck | None
    crc: int | None
    xxh: bytes


def block_digests(data: Buffer, unchanged: bytes | None = None, check: BlockCheck | None = BlockCheck.MD5
                  ) -> BlockDigests:
    """The digests of one block, in the worker thread that read it.

    When the xxh3-128 equals `unchanged` (the committed block's), or `check` is None (the store holds the block
    already, or verifies nothing), the block is not sent or not checked, so its check is skipped (None)."""
    digest = xxhash.xxh3_128_digest(data)
    return BlockDigests(*part_digests(data, None if digest == unchanged else check), digest)


def part_digests(data: Buffer, check: BlockCheck | None) -> tuple[PartCheck | None, int | None]:
    """The check a part is sent with (None: none) and its CRC64 (the one check, where that is a CRC64): what the
    whole blob's CRC64 is composed of."""
    sent = None if check is None else part_check(data, check)
    if sent is not None and sent.kind is BlockCheck.CRC64:
        return sent, struct.unpack("<Q", sent.value)[0]
    return sent, crc64_value(data)


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
    return usable_cores()


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


class Digest(NamedTuple):
    """A whole blob's check, as computed over the bytes read: MD5 (16 bytes, as Content-MD5) or CRC64 (8 bytes,
    little-endian, as x-ms-content-crc64 carries one)."""

    kind: Literal["md5", "crc64"]
    value: bytes


WholeKind = Literal["md5", "crc64"] | None


def crc64_digest(parts: Sequence[tuple[int, int]]) -> Digest:
    """The CRC64 digest of parts given in order as (crc, length)."""
    return Digest("crc64", struct.pack("<Q", crc64_compose(list(parts))))


def crc64_metadata(parts: Sequence[tuple[int | None, int]], md5: bytes | None) -> dict[str, str]:
    """The metadata that stores a blob's CRC64 with it, composed from every part's (none if one is unknown), bound
    to the Content-MD5 it is committed with (see stored_crc64)."""
    if any(crc is None for crc, _ in parts):
        return {}
    known = [(crc, length) for crc, length in parts if crc is not None]
    return {CRC64_METADATA: crc64_text(crc64_digest(known).value, md5)}


def crc64_text(crc: bytes, md5: bytes | None) -> str:
    """The stored form: the CRC64's 16 hex digits, then the Content-MD5's 32 where the blob has one."""
    return crc.hex() + (md5.hex() if md5 else "")


def stored_crc64(metadata: Mapping[str, str], content_md5: bytes | None) -> bytes | None:
    """The CRC64 blobsync stored with a blob it wrote in blocks, if there is a well-formed one and the blob's
    Content-MD5 is still the one it was stored with: a Content-MD5 changed (or added) since is checked as such."""
    text = next((v for k, v in metadata.items() if k.lower() == CRC64_METADATA), None)
    if text is None or len(text) not in (16, 48):
        return None
    try:
        crc, md5 = bytes.fromhex(text[:16]), bytes.fromhex(text[16:]) or None
    except ValueError:
        return None
    return crc if md5 == content_md5 else None


def may_hash_whole(mode: CheckMd5) -> bool:
    """Whether a download in this mode may take a whole MD5 of what it reads (one serial pass: whole_check decides
    per blob, once its properties are known)."""
    return mode is not CheckMd5.NO_CHECK


def whole_check(mode: CheckMd5, blob: str, props: BlobProperties) -> WholeKind:
    """The one decision of what a whole read of a blob computes (a download, a get, a split file's finish): the
    CRC64 blobsync stored with the blob where there is one (composed from the ranges as they arrive, in parallel,
    no second pass), else the MD5 where there is a Content-MD5, else nothing. FailIfDifferentOrMissing without a
    Content-MD5 fails here, before a byte is read."""
    if mode is CheckMd5.NO_CHECK:
        return None
    if props.content_md5 is None and mode is CheckMd5.FAIL_IF_DIFFERENT_OR_MISSING:
        check_md5(mode, blob, None, None)
    if stored_crc64(props.metadata, props.content_md5) is not None and crc64_available():
        return "crc64"
    return "md5" if props.content_md5 is not None else None


def verify_whole(mode: CheckMd5, blob: str, props: BlobProperties, got: Digest | None, after: str = "") -> None:
    """What --check-md5 makes of the digest of the bytes read against the blob's stored one of that kind."""
    if got is None or got.kind == "md5":
        check_md5(mode, blob, props.content_md5, got.value if got is not None else None, after)
        return
    if mode is CheckMd5.NO_CHECK or got.value == stored_crc64(props.metadata, props.content_md5):
        return
    if mode is CheckMd5.LOG_ONLY:
        log.warning("%s: CRC64 of the bytes read differs from the one stored with the blob (--check-md5 LogOnly: "
                    "kept)", blob)
        return
    raise ChecksumMismatchError(f"{blob}: CRC64 of the bytes read differs from the one stored with the blob{after}",
                                digest=got.value)


def digest_of(kind: Literal["md5", "crc64"], data: Buffer) -> Digest:
    """The digest `kind` names of bytes held whole."""
    return Digest("md5", md5_of(data)) if kind == "md5" else crc64_digest([(crc64_int(data), len(data))])


async def verify_read(mode: CheckMd5, blob: str, props: BlobProperties, got: Digest | None,
                      md5_again: Callable[[], Awaitable[bytes]], after: str = "") -> Digest | None:
    """verify_whole, where a CRC64 that differs on a blob with a Content-MD5 too is settled by the MD5 of the bytes
    (`md5_again`): another tool may have rewritten the blob and kept blobsync's metadata. The digest that held."""
    try:
        verify_whole(mode, blob, props, got, after)
        return got
    except ChecksumMismatchError:
        if got is None or got.kind != "crc64" or props.content_md5 is None:
            raise
    md5 = await md5_again()
    check_md5(mode, blob, props.content_md5, md5, after)
    log.warning("%s: the CRC64 stored with the blob is not the bytes' (the blob was rewritten by another tool?); "
                "its Content-MD5 matches them", blob)
    return Digest("md5", md5)
