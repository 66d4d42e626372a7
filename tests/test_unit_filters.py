"""Property tests: sync filters against a small reference model of AzCopy's rules (excludes win)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from blobsync.syncing.filters import Filters

SEGMENT = st.text(alphabet="ab.", min_size=1, max_size=4).filter(lambda s: s not in (".", ".."))
PATHS = st.lists(SEGMENT, min_size=1, max_size=3).map("/".join)
GLOBS = st.text(alphabet="ab.*?", min_size=1, max_size=4)
PREFIXES = st.lists(SEGMENT, min_size=1, max_size=2).map("/".join)
REGEXES = st.sampled_from(["a", "^b", r"\.a$", "a/b", "b+", "^a.*b$"])


def glob_match(pattern: str, text: str) -> bool:
    """Reference glob: '*' any run, '?' one character, everything else literal (independent of fnmatch)."""
    if not pattern:
        return not text
    head, rest = pattern[0], pattern[1:]
    if head == "*":
        return any(glob_match(rest, text[i:]) for i in range(len(text) + 1))
    if not text:
        return False
    return (head == "?" or head == text[0]) and glob_match(rest, text[1:])


def under(rel: str, prefix: str) -> bool:
    return rel == prefix or rel.startswith(prefix + "/")


def reference(rel: str, inc_g: list[str], exc_g: list[str], inc_p: list[str], exc_p: list[str],
              inc_r: list[str], exc_r: list[str]) -> bool:
    name = rel.split("/")[-1]
    excluded = (any(glob_match(g, name) for g in exc_g) or any(under(rel, p) for p in exc_p)
                or any(re.search(r, rel) for r in exc_r))
    included = ((not inc_g or any(glob_match(g, name) for g in inc_g))
                and (not inc_p or any(under(rel, p) for p in inc_p))
                and (not inc_r or any(re.search(r, rel) for r in inc_r)))
    return included and not excluded


@settings(max_examples=400, deadline=None)
@given(
    rel=PATHS,
    inc_g=st.lists(GLOBS, max_size=2), exc_g=st.lists(GLOBS, max_size=2),
    inc_p=st.lists(PREFIXES, max_size=2), exc_p=st.lists(PREFIXES, max_size=2),
    inc_r=st.lists(REGEXES, max_size=2), exc_r=st.lists(REGEXES, max_size=2),
)
def test_filters_match_the_reference_model(rel: str, inc_g: list[str], exc_g: list[str], inc_p: list[str],
                                           exc_p: list[str], inc_r: list[str], exc_r: list[str]) -> None:
    filters = Filters.parse(
        include_pattern=";".join(inc_g), exclude_pattern=";".join(exc_g),
        include_path=";".join(inc_p), exclude_path=";".join(exc_p),
        include_regex=";".join(inc_r), exclude_regex=";".join(exc_r),
    )
    assert filters.matches(rel) == reference(rel, inc_g, exc_g, inc_p, exc_p, inc_r, exc_r)


@given(mtime=st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_time_window_is_half_open(mtime: float) -> None:
    filters = Filters.parse(include_after="2020-01-01T00:00:00Z", include_before="2030-01-01")
    assert filters.matches("x", mtime) == (1577836800.0 <= mtime < 1893456000.0)
