"""Decides, for one path, whether a sync transfers it: size and mtime, size only, MD5, or always."""

from __future__ import annotations

from dataclasses import dataclass

from blobsync.journal.index import Entry
from blobsync.options import CompareMode as CompareMode

# A file system may store fewer digits than the nanoseconds we set; a blob's Last-Modified has whole seconds
# and is the upload time. Differences inside these windows are not "newer".
_EXACT_WINDOW_NS = 1_000_000
_COARSE_WINDOW_NS = 1_000_000_000
MTIME_WINDOWS = (_EXACT_WINDOW_NS, _COARSE_WINDOW_NS)  # for SyncIndex.pairs(newer_than=...): the same rule in SQL


@dataclass(frozen=True)
class Decision:
    transfer: bool
    reason: str  # new | size differs | newer | hash differs | no MD5 on destination | mirror | same


def decide(src: Entry, dst: Entry | None, mode: CompareMode, src_md5: bytes | None = None) -> Decision:
    """Whether `src` must be copied over `dst`. For MD5 mode, `src_md5` is the source's MD5 when known."""
    if dst is None:
        return Decision(True, "new")
    if mode is CompareMode.MIRROR:
        return Decision(True, "mirror")
    if src.size != dst.size:
        return Decision(True, "size differs")
    if mode is CompareMode.SIZE_ONLY:
        return Decision(False, "same size")
    if mode is CompareMode.MD5:
        theirs = dst.md5
        if theirs is None:
            return Decision(True, "no MD5 on destination")
        return Decision(src_md5 != theirs, "hash differs" if src_md5 != theirs else "same MD5")
    window = _EXACT_WINDOW_NS if src.exact_mtime and dst.exact_mtime else _COARSE_WINDOW_NS
    if src.mtime_ns > dst.mtime_ns + window:
        return Decision(True, "newer")
    return Decision(False, "same size and not newer")
