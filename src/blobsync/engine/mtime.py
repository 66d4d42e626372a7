"""A file's mtime as blob metadata: the key and RFC 3339 text rclone also uses, so either tool reads the other's."""

from __future__ import annotations

import calendar
import functools
import re
import time

from blobsync.backends.base import BlobProperties
from blobsync.local.files import clamp_ns

MTIME_KEY = "mtime"
NS_MIN, NS_MAX = -(2**63), 2**63 - 1

_SECONDS: dict[str, int] = {}  # "YYYY-MM-DDTHH:MM:SS" -> seconds since the epoch
_HEAD = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}", re.ASCII)


def format_mtime(mtime_ns: int) -> str:
    seconds, nanos = divmod(mtime_ns, 1_000_000_000)
    return f"{_second_text(seconds)}.{nanos:09d}Z"


@functools.lru_cache(maxsize=4096)
def _second_text(seconds: int) -> str:
    # One upload formats one per file, and files written together share their second.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def parse_mtime(text: str) -> int | None:
    """Nanoseconds since the epoch from an RFC 3339 UTC time (as written by blobsync or rclone)."""
    # Parsed by hand: a sync compares one per blob, and strptime costs ~20 µs each. Files written together share
    # their second, so the calendar arithmetic is done once per distinct second.
    head, _, frac = text.rstrip("Z").partition(".")
    # ASCII digits only: str.isdigit() and int() also take '²' or Arabic-Indic digits (the first then fails).
    if frac and not (frac.isascii() and frac.isdigit()):
        return None
    seconds = _SECONDS.get(head)
    if seconds is None:
        if _HEAD.fullmatch(head) is None:
            return None
        fields = (int(head[0:4]), int(head[5:7]), int(head[8:10]), int(head[11:13]), int(head[14:16]),
                  int(head[17:19]))
        if not (1 <= fields[1] <= 12 and fields[3] <= 23 and fields[4] <= 59 and fields[5] <= 60
                and 1 <= fields[2] <= calendar.monthrange(max(fields[0], 1), fields[1])[1]):
            return None  # 2024-02-30 is no day (timegm would take it for 2024-03-01)
        seconds = calendar.timegm((*fields, 0, 0, 0))
        if len(_SECONDS) >= 4096:  # bounded: a tree written over years must not grow it forever
            _SECONDS.clear()
        _SECONDS[head] = seconds
    ns = seconds * 1_000_000_000 + (int((frac + "000000000")[:9]) if frac else 0)
    # Out of what a signed 64-bit count of nanoseconds holds (before 1677, after 2262: what the journal, SQLite
    # and every OS's file times keep): not a time this blob can be compared or stamped by; its Last-Modified is.
    return ns if NS_MIN <= ns <= NS_MAX else None


def destination_mtime_ns(props: BlobProperties) -> int:
    stored = props.metadata.get(MTIME_KEY)
    parsed = parse_mtime(stored) if stored else None
    return parsed if parsed is not None else clamp_ns(int(props.last_modified.timestamp() * 1e9))
