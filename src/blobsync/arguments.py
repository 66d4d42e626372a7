"""The library's boundary: every argument a Python caller passes is checked here before any request is made."""

from __future__ import annotations

import asyncio
import math
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Self, TypeVar

from blobsync.errors import UsageError

E = TypeVar("E", bound=Enum)
T = TypeVar("T")



def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def choice(value: object, enum: type[E], name: str) -> E:
    """An enum member from a member, its word (case-insensitive, as the CLI takes it) or, for enums with TRUE and
    FALSE members, a bool: `False` means FALSE, never "truthy, so on"."""
    if isinstance(value, enum):
        return value
    members = enum.__members__
    if isinstance(value, bool) and "TRUE" in members and "FALSE" in members:
        return members["TRUE" if value else "FALSE"]
    if isinstance(value, str):
        for member in enum:
            if str(member.value).lower() == value.strip().lower():
                return member
    words = ", ".join(repr(str(m.value)) for m in enum)
    extra = ", True, False" if "TRUE" in members and "FALSE" in members else ""
    raise UsageError(f"invalid {name}={_shown(value)}: use one of {words}{extra} or a {enum.__name__} member")


def boolean(value: object, name: str) -> bool:
    """A real bool: a string such as "false" would be truthy and do the opposite of what it says."""
    if isinstance(value, bool):
        return value
    raise UsageError(f"invalid {name}={_shown(value)}: use True or False")


def _plain(x: float) -> str:
    """A number as a person writes it: 1000000, not 1e+06."""
    return f"{x:,.0f}" if x == int(x) else f"{x:g}"


def range_text(lo: float, hi: float, unit: str = "") -> str:
    """'0.1 to 86,400 seconds (1 day)', '0.001 to 1,000,000 Mbit/s'."""
    days = f" ({_plain(hi / 86400)} days)" if unit == " seconds" and hi >= 86400 * 2 else \
        " (1 day)" if unit == " seconds" and hi == 86400 else ""
    return f"{_plain(lo)} to {_plain(hi)}{unit}{days}"


def number(value: object, name: str, lo: float, hi: float, unit: str = "", *, integer: bool = False) -> float:
    """A finite number within [lo, hi]; bools and text are refused (True is not 1 request)."""
    ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
    if not ok_type or isinstance(value, bool) or not math.isfinite(float(value)):  # type: ignore[arg-type]
        kind = "a whole number" if integer else "a finite number"
        raise UsageError(f"invalid {name}={_shown(value)}: use {kind} from {range_text(lo, hi, unit)}")
    if not lo <= float(value) <= hi:  # type: ignore[arg-type]
        raise UsageError(f"{name}={_shown(value)} is out of range: {range_text(lo, hi, unit)}")
    return float(value)  # type: ignore[arg-type]


def optional(value: T | None, name: str, kind: type | tuple[type, ...], what: str) -> T | None:
    """None, or an instance of `kind`."""
    if value is None or isinstance(value, kind):
        return value
    raise UsageError(f"invalid {name}={_shown(value)}: expected {what} or None")


def callback(value: object, name: str) -> Callable[..., Any] | None:
    if value is None or callable(value):
        return value
    raise UsageError(f"invalid {name}={_shown(value)}: expected a function or None")


def path_or_url(value: object, name: str) -> str:
    """A local path (str or os.PathLike) or a URL, as text."""
    if isinstance(value, str | os.PathLike):
        text = os.fspath(value)
        if isinstance(text, str) and text:
            return text
    raise UsageError(f"invalid {name}={_shown(value)}: expected a path or URL (str or os.PathLike)")


def url(value: object, name: str) -> str:
    if isinstance(value, str) and value:
        return value
    raise UsageError(f"invalid {name}={_shown(value)}: expected a URL (str)")


def optional_path(value: object, name: str) -> Path | None:
    if value is None:
        return None
    if isinstance(value, str | os.PathLike):
        return Path(value)
    raise UsageError(f"invalid {name}={_shown(value)}: expected a path (str or os.PathLike) or None")


def env(value: object) -> Mapping[str, str]:
    if value is None:
        return os.environ
    if isinstance(value, Mapping):
        return value
    raise UsageError(f"invalid env={_shown(value)}: expected a mapping of environment variables or None")


def subscribers(value: object) -> tuple[Any, ...]:
    """A sequence of objects with on_queued/on_progress/on_done (a single function is refused, not iterated)."""
    from blobsync.events import Subscriber

    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise UsageError(f"invalid subscribers={_shown(value)}: expected a list of Subscriber objects "
                         "(subclass blobsync.BaseSubscriber)")
    for item in value:
        if not isinstance(item, Subscriber):
            raise UsageError(f"invalid subscriber {_shown(item)}: it needs on_queued, on_progress and on_done "
                             "(subclass blobsync.BaseSubscriber)")
    return tuple(value)


def stop_signal(value: object) -> object:
    if value is None or callable(value) or isinstance(value, threading.Event | asyncio.Event):
        return value
    raise UsageError(f"invalid stop={_shown(value)}: expected a threading.Event, asyncio.Event, function or None")


# Control characters, CR and LF above all, would end a header line early: what follows would be read as more
# headers, or as a second request on the same connection. HTAB is the one control character a header may hold.
HEADER_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def check_header_text(value: str, what: str, *, ascii_only: bool = False) -> None:
    """Refuse text that cannot be one HTTP header value (UsageError naming `what`), before any request."""
    if HEADER_CONTROL.search(value):
        raise UsageError(f"invalid {what} {value[:60]!r}: line breaks and other control characters cannot be part "
                         "of an HTTP header")
    try:
        value.encode("ascii" if ascii_only else "latin-1")
    except UnicodeEncodeError as exc:
        allowed = "ASCII" if ascii_only else "Latin-1"
        raise UsageError(f"invalid {what} {value[:60]!r}: an HTTP header holds {allowed} text only") from exc


class FlagEnum(Enum):
    """An enum whose values are a flag's accepted words, matched case-insensitively."""

    @classmethod
    def flag(cls) -> str:
        return "--" + re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()

    @classmethod
    def parse(cls, text: str) -> Self:
        for member in cls:
            if str(member.value).lower() == text.lower():
                return member
        words = ", ".join(str(m.value) for m in cls)
        raise UsageError(f"invalid {cls.flag()} {text!r}: use one of {words}")
