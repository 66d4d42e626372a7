"""The part checks a store verifies on arrival (MD5, Storage CRC64), computed alike by the engine and by stores: below
the backends, which import it (and re-export its types from backends/base.py)."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import struct
from collections.abc import Callable
from typing import NamedTuple

from blobsync.arguments import FlagEnum
from blobsync.errors import UsageError

Buffer = bytes | bytearray | memoryview


class BlockCheck(FlagEnum):
    """A checksum a store verifies on a part as it arrives (and refuses the part if the body differs); as
    --block-check, AUTO asks for the store's cheapest (a store's `part_checks` never name AUTO)."""

    AUTO = "auto"
    CRC64 = "crc64"  # Azure's Storage CRC64: the CRC-64/NVME polynomial, ~35x cheaper than MD5 with SIMD
    MD5 = "md5"


class PartCheck(NamedTuple):
    """The check one part is sent with: which checksum, and its value as the store's header carries it."""

    kind: BlockCheck
    value: bytes

_NO_CRC64 = "--block-check crc64 needs the awscrt package (pip install awscrt), which did not load"


@functools.cache
def _crc64() -> Callable[[Buffer, int], int] | None:
    """awscrt's CRC-64/NVME (SIMD, releases the GIL, ~16 GB/s here: bench/checksums.py), imported on first use:
    its native module costs ~75 ms to load, which a job of small files never needs. None where it cannot load."""
    try:
        from awscrt.checksums import crc64nvme
    except ImportError as exc:  # a platform without its wheel: parts then carry MD5s, ~2 s/GiB more CPU
        logging.getLogger("blobsync").debug("no CRC64 (%s): parts are checked by MD5", exc)
        return None
    crc: Callable[[Buffer, int], int] = crc64nvme  # takes any buffer (its own hint says bytes)
    return crc


def require_crc64() -> None:
    """Refuse `--block-check crc64` at once where awscrt is not installed, without loading it yet (a job of small
    files never computes a CRC64; the native module costs ~75 ms)."""
    try:
        found = importlib.util.find_spec("awscrt") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UsageError(_NO_CRC64)


def choose_check(accepted: tuple[BlockCheck, ...], wanted: BlockCheck = BlockCheck.AUTO) -> BlockCheck | None:
    """The part check to send: `wanted` (AUTO: the first of the store's `accepted`, in its order of preference,
    that this machine computes); None if the store verifies none. A CRC64 asked for without awscrt is a
    UsageError."""
    if wanted is not BlockCheck.AUTO:
        if wanted is BlockCheck.CRC64 and _crc64() is None:
            raise UsageError(_NO_CRC64)
        return wanted if wanted in accepted else None
    return next((k for k in accepted if k is not BlockCheck.CRC64 or _crc64() is not None), None)


def crc64_of(data: Buffer) -> bytes:
    """The Storage CRC64 of `data`, as the x-ms-content-crc64 header carries it (8 bytes, little-endian)."""
    crc = _crc64()
    assert crc is not None, "CRC64 is chosen only where awscrt loads (choose_check)"
    return struct.pack("<Q", crc(data, 0))


def part_check(data: Buffer, kind: BlockCheck) -> PartCheck:
    return PartCheck(kind, crc64_of(data) if kind is BlockCheck.CRC64 else hashlib.md5(data).digest())


# CRC-64/NVME, reflected: what awscrt's crc64nvme and Azure's x-ms-content-crc64 compute.
_CRC64_POLY = 0x9A6C9329AC4BC9B5
_X0 = 1 << 63  # the polynomial 1 (x^0), as a reflected register holds it


def _multmodp(a: int, b: int) -> int:
    """a(x) * b(x) modulo the CRC polynomial, both reflected (zlib's multmodp, for 64 bits)."""
    m, p = _X0, 0
    while a:
        if a & m:
            p ^= b
            a ^= m
        m >>= 1
        b = (b >> 1) ^ _CRC64_POLY if b & 1 else b >> 1
    return p


@functools.cache
def _x2n(k: int) -> int:
    """x^(2^k) modulo the polynomial."""
    return _X0 >> 1 if k == 0 else _multmodp(_x2n(k - 1), _x2n(k - 1))


@functools.lru_cache(maxsize=64)
def _shift_of(nbytes: int) -> int:
    """x^(8 * nbytes) modulo the polynomial: what the CRC of a prefix is multiplied by to skip `nbytes` more."""
    p, n, k = _X0, nbytes, 3
    while n:
        if n & 1:
            p = _multmodp(_x2n(k), p)
        n >>= 1
        k += 1
    return p


def crc64_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC64 of A followed by B from the CRC64s of A and B and B's length: the whole blob's check composed from
    its parts' with no second pass over the bytes (each part's is computed as it is sent or arrives)."""
    return _multmodp(_shift_of(len2), crc1) ^ crc2


def crc64_value(data: Buffer, previous: int = 0) -> int | None:
    """The CRC64 of `data` as an integer, continuing `previous` (the CRC64 of the bytes before it); None where
    awscrt cannot load."""
    crc = _crc64()
    return None if crc is None else crc(data, previous)


def crc64_int(data: Buffer, previous: int = 0) -> int:
    """crc64_value where a CRC64 was chosen (awscrt loads)."""
    got = crc64_value(data, previous)
    assert got is not None, "a CRC64 is chosen only where awscrt loads"
    return got


def crc64_available() -> bool:
    return _crc64() is not None


def crc64_compose(parts: list[tuple[int, int]]) -> int:
    """The CRC64 of the concatenation of parts given as (crc, length), in order."""
    whole, first = 0, True
    for crc, length in parts:
        whole = crc if first else crc64_combine(whole, crc, length)
        first = False
    return whole
