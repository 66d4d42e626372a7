"""Incremental writes: the blocks of an earlier blob (its digests kept beside it in `<blob>.blocks`) that a new
blob's blocks equal, staged by the service from that blob (Put Block From URL, checked against the new block's
CRC64) instead of sent."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from blobsync.backends.base import CopySource
from blobsync.config import MIN_BLOCK_SIZE
from blobsync.engine.context import EngineContext
from blobsync.errors import BlobsyncError

log = logging.getLogger("blobsync")
SUFFIX = ".blocks"  # beside the blob: what a later write compares its blocks with
FORMAT = "blobsync-blocks/1"
RECORD_MAX = 4 << 20  # 50,000 blocks' digests in hex and the rest: a larger record is not ours, and is ignored
DIGEST_HEX = 32  # xxh3-128


@dataclass
class PriorBlocks:
    """An earlier blob whose blocks a write may have the service stage: its version, block size and digests."""

    name: str
    source: CopySource
    block_size: int
    size: int
    digests: tuple[bytes, ...]
    broken: bool = False  # the source went (pruned, overwritten): no more copies are tried from it
    copied: int = field(default=0)  # bytes the service staged from it for this write

    def offset(self, idx: int, length: int, digest: bytes) -> int | None:
        """Where block `idx` of the new blob is in the earlier one, if it holds the same bytes there (same index,
        length and xxh3-128)."""
        if self.broken or idx >= len(self.digests) or self.digests[idx] != digest:
            return None
        start = idx * self.block_size
        return start if min(self.block_size, self.size - start) == length else None


def prior_name(blocks_from: str, rel: str | None) -> str:
    """The earlier blob a write compares with: `blocks_from` itself (one blob), or the blob of the same relative
    name `rel` under it (a folder's upload)."""
    return blocks_from if rel is None else blocks_from.rstrip("/") + "/" + rel.lstrip("/")


def encode(etag: str, size: int, block_size: int, digests: list[bytes]) -> bytes:
    return json.dumps({"format": FORMAT, "etag": etag, "size": size, "block_size": block_size,
                       "xxh3_128": "".join(d.hex() for d in digests)}, separators=(",", ":")).encode()


def decode(data: bytes) -> tuple[str, int, int, tuple[bytes, ...]]:
    """(etag, size, block size, digests) of a record; ValueError for anything else (a record is only a hint: the
    service checks every copied block's CRC64, so a wrong one costs a block sent, never a wrong byte)."""
    try:
        record = json.loads(data)
        if record.get("format") != FORMAT:
            raise ValueError("not a block record")
        etag, size, block_size, text = record["etag"], record["size"], record["block_size"], record["xxh3_128"]
        if not (isinstance(etag, str) and isinstance(size, int) and isinstance(block_size, int) and block_size > 0
                and isinstance(text, str) and len(text) % DIGEST_HEX == 0):
            raise ValueError("malformed block record")
        digests = tuple(bytes.fromhex(text[i:i + DIGEST_HEX]) for i in range(0, len(text), DIGEST_HEX))
    except (AttributeError, KeyError, TypeError, RecursionError, json.JSONDecodeError) as exc:
        raise ValueError("malformed block record") from exc
    if len(digests) != -(-size // block_size):
        raise ValueError("block record does not cover the blob")
    return etag, size, block_size, digests


async def find_prior(ctx: EngineContext, name: str, block_size: int | None) -> tuple[PriorBlocks | None, str]:
    """The earlier blob `name` as a write of `block_size` blocks (None: whatever its were) may copy from, or None
    and why not (said in the write's result: everything is sent)."""
    caps = ctx.store.capabilities
    if not (caps.stage_copy_max and caps.copy_sources):
        return None, "the store cannot stage blocks from another blob"
    try:
        ctx.store.check_name(name)
        buf = bytearray(RECORD_MAX + 1)
        props, n = await ctx.request(lambda: ctx.store.read_first(name + SUFFIX, memoryview(buf)))
        etag, size, recorded, digests = decode(bytes(buf[:n]) if props.size <= RECORD_MAX else b"")
    except (BlobsyncError, ValueError) as exc:
        return None, f"no block digests beside {name!r} ({_why(exc)})"
    if block_size is not None and recorded != block_size:
        return None, f"{name!r} was written in blocks of {recorded} bytes, this write's are {block_size}"
    if not MIN_BLOCK_SIZE <= recorded <= min(caps.max_part_size, caps.stage_copy_max, ctx.memory.limit):
        return None, f"{name!r} was written in blocks of {recorded} bytes, which this write cannot take"
    current = await ctx.request(lambda: ctx.store.stat(name))
    if current is None or current.etag != etag:
        return None, f"{name!r} changed since its block digests were written"
    source = await ctx.store.copy_source(name, etag, ctx.store.location)
    return PriorBlocks(name, source, recorded, size, digests), ""


def _why(exc: Exception) -> str:
    if getattr(exc, "status", None) == 404:
        return "none written"
    return str(exc).split("\n")[0][:200]
