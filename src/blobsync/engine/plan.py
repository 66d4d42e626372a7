"""Block planning: block size per file, block ranges, and the nonce a chunked write derives its part names from."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

from blobsync.config import MAX_BLOCK_SIZE, MAX_BLOCKS, MiB
from blobsync.errors import SourceError

_NONCE_HEX = 16  # 64 random bits per transfer: two uploads of one blob never share part names


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
