"""User regexes (--include-regex/--exclude-regex): RE2 where its wheel loads, Python's re otherwise.

The names they run on are chosen by others (whoever wrote the blobs or the files), so a backtracking engine would
let one name stall a job for hours on a pattern like '(a+)+$'. RE2 runs in time linear in the name, and its
dialect is the one AzCopy's Go regexp speaks (no backreferences, no lookarounds)."""

from __future__ import annotations

import functools
import importlib
import re
from typing import Any, Protocol

from blobsync.errors import UsageError


class Matcher(Protocol):
    """What the filters ask of a compiled regex."""

    def search(self, text: str) -> object: ...


_DEFAULT = object()


@functools.cache
def re2() -> Any:
    """The RE2 module, loaded by the first regex (a job without one never pays for it); None where it is missing."""
    try:
        return importlib.import_module("re2")
    except ImportError:  # no wheel for this platform: Python's re, with the risk docs/cli.md states
        return None


def engine_name() -> str:
    return "RE2" if re2() is not None else "Python re"


def compile_regex(pattern: str, flag: str, *, engine: Any = _DEFAULT) -> Matcher:
    """`pattern` compiled by RE2 (or `re` where RE2 is missing); a pattern it refuses is a UsageError."""
    if engine is _DEFAULT:
        engine = re2()
    if engine is None:
        try:
            return re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"invalid {flag} {pattern!r}: {exc}") from None
    options = engine.Options()
    options.log_errors = False  # RE2 would print its own complaint to stderr
    try:
        return engine.compile(pattern, options=options)  # type: ignore[no-any-return]
    except engine.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        raise UsageError(f"invalid {flag} {pattern!r}: {reason} (regexes are RE2, as in AzCopy: no "
                         "backreferences or lookarounds)") from None
