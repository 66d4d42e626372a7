"""Block planning: block size per file, block ranges, and the nonce a chunked write derives its part names from."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

from blobsync.backends.base import Capabilities
from blobsync.config import MiB
from blobsync.errors import SourceError

_NONCE_HEX = 16  # 64 random bits per transfer: two uploads of one blob never share part names


def choose_block_size(size: int, requested: int, store: Capabilities) -> int:
    """`requested`, raised to a whole MiB when the file would otherwise need more parts than the store takes in
    one object (Azure: 50,000 blocks of up to 4000 MiB)."""
    if size <= requested * store.max_parts:
        return requested
    needed = -(-size // store.max_parts)
    block = -(-needed // MiB) * MiB
    if block > store.max_part_size:
        raise SourceError(f"file of {size} bytes is larger than one object of this store can hold "
                          f"({store.max_parts} parts of at most {store.max_part_size} bytes)")
    return block


def block_count(size: int, block_size: int) -> int:
    return max(1, -(-size // block_size)) if size else 0


def block_ranges(size: int, block_size: int) -> Iterator[tuple[int, int, int]]:
    """Yield (index, offset, length) for every block of a file."""
    for idx, offset in enumerate(range(0, size, block_size)):
        yield idx, offset, min(block_size, size - offset)


def new_nonce() -> str:
    return secrets.token_hex(_NONCE_HEX // 2)
