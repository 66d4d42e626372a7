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
