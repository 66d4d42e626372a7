"""The words a call or a flag chooses among (delete, compare, an answer to a prompt), in one public module."""

from __future__ import annotations

from enum import Enum

from blobsync.arguments import FlagEnum


class DeleteMode(FlagEnum):
    """--delete-destination / sync(delete=...): whether a sync removes what the source lacks."""

    FALSE = "false"
    TRUE = "true"
    PROMPT = "prompt"

    @classmethod
    def flag(cls) -> str:
        return "--delete-destination"


class CompareMode(Enum):
    """sync(compare=...): what makes a file differ (size and mtime, size only, MD5, or always: mirror)."""

    SIZE_AND_MTIME = "size+mtime"
    SIZE_ONLY = "size-only"
    MD5 = "md5"
    MIRROR = "mirror"


class Answer(Enum):
    """An answer to --overwrite prompt (confirm_overwrite=...)."""

    YES = "yes"
    NO = "no"
    ALL = "all"  # yes, and for every file after it
    NONE = "none"  # no, and for every file after it
