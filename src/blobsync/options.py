"""The words a call or a flag chooses among (delete, compare, an answer to a prompt), in one public module."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from blobsync.arguments import FlagEnum
from blobsync.errors import UsageError


class DeleteMode(FlagEnum):
    """--delete-destination / sync(delete=...): whether a sync removes what the source lacks."""

    FALSE = "false"
    TRUE = "true"
    PROMPT = "prompt"

    @classmethod
    def flag(cls) -> str:
        return "--delete-destination"


@dataclass(frozen=True)
class MaxDelete:
    """--max-delete / sync(max_delete=...): at most `count` deletions, or `percent` of the destination's files."""

    text: str  # as given, for the line that refuses a delete
    count: int | None = None
    percent: float | None = None

    @classmethod
    def parse(cls, value: object) -> MaxDelete | None:
        """A count (an int or its text) or a percentage ('5%'), read once where it enters; None: no limit."""
        if value is None or isinstance(value, MaxDelete):
            return value
        text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else ""
        try:
            if text.endswith("%") and 0 <= float(text[:-1]) <= 100:
                return cls(text, percent=float(text[:-1]))
            if text and int(text) >= 0:
                return cls(text, count=int(text))
        except ValueError:
            pass
        raise UsageError(f"invalid --max-delete {value!r}: a count (e.g. 100) or a percentage (e.g. 5%)")


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
