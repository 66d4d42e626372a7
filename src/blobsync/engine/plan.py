"""Block planning: block size per file, block ranges, and deterministic fixed-length block IDs."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Iterator

from blobsync.config import MAX_BLOCK_SIZE, MAX_BLOCKS, MiB
from blobsync.errors import SourceError

_NONCE_HEX = 16  # 64 random bits per transfer: two uploads of one blob never share block IDs
_INDEX_DIGITS = 6  # up to 999,999 > 50,000 blocks


def choose_block_size(size: int, requested: int) -> int:
    """`requested`, raised to a whole MiB when the file would otherwise need more than 50,000 blocks."""
    if size <= requested * MAX_BLOCKS:
        return requested
    needed = -(-size // MAX_BLOCKS)
    block = -(-needed // MiB) * MiB
    if block > MAX_BLOCK_SIZE:
        raise SourceError(f"file of {size} bytes is larger than a block blob can hold")
    return block


def block_count(size: int, block_size: int) -> int:
    return max(1, -(-size // block_size)) if size else 0


def block_ranges(size: int, block_size: int) -> Iterator[tuple[int, int, int]]:
    """Yield (index, offset, length) for every block of a file."""
    for idx, offset in enumerate(range(0, size, block_size)):
        yield idx, offset, min(block_size, size - offset)


def new_nonce() -> str:
    return secrets.token_hex(_NONCE_HEX // 2)


def block_id(nonce: str, index: int) -> str:
    """Base64 of '<nonce>-<index>': the same length for every block of a transfer, and the same on resume."""
    return base64.b64encode(f"{nonce}-{index:0{_INDEX_DIGITS}d}".encode("ascii")).decode("ascii")


BLOCK_ID_LENGTH = len(block_id("0" * _NONCE_HEX, 0))
