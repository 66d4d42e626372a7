"""Property tests: sync filters against a small reference model of AzCopy's rules (excludes win)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from blobsync.errors import UsageError
from blobsync.filters import Filters

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
    # An exclude path is a string prefix (AzCopy 10.32 excludes 'sub.pt' and 'subway/' for 'sub'); an include
    # path is a whole path or folder (AzCopy takes only 'sub/...' for 'sub').
    excluded = (any(glob_match(g, name) for g in exc_g) or any(rel.startswith(p) for p in exc_p)
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
def test_time_window_includes_both_ends_as_azcopy(mtime: float) -> None:
    filters = Filters.parse(include_after="2020-01-01T00:00:00Z", include_before="2030-01-01")
    assert filters.matches("x", mtime) == (1577836800.0 <= mtime <= 1893456000.0)


WILDCARDS = st.text(alphabet="ab.*", min_size=1, max_size=4).filter(lambda s: "*" in s)


@settings(max_examples=300, deadline=None)
@given(rel=PATHS, top=st.none() | WILDCARDS, recursive=st.booleans(), exc_p=st.lists(PREFIXES, max_size=2),
       inc_p=st.lists(PREFIXES, max_size=2), trailing=st.booleans())
def test_source_wildcard_top_level_and_pruning(rel: str, top: str | None, recursive: bool, exc_p: list[str],
                                               inc_p: list[str], trailing: bool) -> None:
    filters = Filters.parse(source_wildcard=top, recursive=recursive, include_path=";".join(inc_p),
                            exclude_path=";".join(p + "/" if trailing else p for p in exc_p))
    first = rel.split("/")[0]
    expected = ((recursive or "/" not in rel) and (top is None or glob_match(top, first))
                and not any(rel.startswith(p + "/" if trailing else p) for p in exc_p)
                and (not inc_p or any(under(rel, p) for p in inc_p)))
    assert filters.matches(rel) == expected
    # A pruned walk takes exactly what a full one would: a folder not entered holds nothing that matches.
    parts = rel.split("/")
    for depth in range(1, len(parts)):
        if not filters.enters("/".join(parts[:depth])):
            assert not filters.matches(rel)


def test_wildcard_star_only_and_literal_otherwise() -> None:
    filters = Filters.parse(source_wildcard="ckpt-[1]?.*")
    assert filters.matches("ckpt-[1]?.pt") and not filters.matches("ckpt-1a.pt")


def test_regexes_run_under_re2_in_linear_time_and_refuse_what_re2_cannot_do() -> None:
    from blobsync.regex import engine_name

    assert engine_name() == "RE2"  # the wheel installs on this machine
    catastrophic = Filters.parse(include_regex="(a+)+$")  # Python's re: 2^60 steps on the name below
    assert not catastrophic.matches("a" * 60 + "b")
    assert catastrophic.matches("x/" + "a" * 60)
    with pytest.raises(UsageError, match="RE2, as in AzCopy"):
        Filters.parse(include_regex=r"(?=lookahead)")
    with pytest.raises(UsageError, match="--exclude-regex"):
        Filters.parse(exclude_regex=r"(a)\1")


def test_without_re2_python_re_is_the_fallback() -> None:
    from blobsync.errors import UsageError
    from blobsync.regex import compile_regex

    assert compile_regex(r"(?<=a)b", "--include-regex", engine=None).search("ab")
    with pytest.raises(UsageError, match="--include-regex"):
        compile_regex("(", "--include-regex", engine=None)


def test_narrowing_filters_reads_nothing_again(tmp_path: Path) -> None:
    """A source wildcard or recursion set on parsed filters keeps what they hold; a --list-of-files is read once
    (issue 39, point 4)."""
    listing = tmp_path / "list.txt"
    listing.write_text("a/b.pt\nc\n", encoding="utf-8")
    parsed = Filters.parse(include_pattern="*.pt", list_of_files=str(listing))
    listing.unlink()  # read once: narrowing must not need it
    narrowed = parsed.narrowed(source_wildcard="run*", recursive=False)
    assert narrowed.text == {"include_pattern": "*.pt", "list_of_files": str(listing), "source_wildcard": "run*",
                             "recursive": False}
    assert narrowed.listed == parsed.listed and narrowed.include_paths == parsed.include_paths
    assert not narrowed.recursive and narrowed.top is not None and narrowed.top.fullmatch("run7")
    assert narrowed.narrowed(recursive=True).recursive and "recursive" not in narrowed.narrowed(recursive=True).text
    same = Filters.parse(include_pattern="*.pt").narrowed(source_wildcard="run*")
    again = Filters.parse(include_pattern="*.pt", source_wildcard="run*")
    assert (same.top.pattern, same.text) == (again.top.pattern, again.text)  # type: ignore[union-attr]


def test_a_list_of_files_joins_parsed_filters_without_parsing_them_again(tmp_path: Path) -> None:
    """The library's copy(list_of_files=...) beside filters: the list read once onto the parsed filters (their
    text is not parsed again), kept in the text a resume reads; a second list is refused."""
    listing = tmp_path / "list.txt"
    listing.write_text("a/b.pt\nc\n", encoding="utf-8")
    parsed = Filters.parse(include_pattern="*.pt", include_path="d")
    joined = parsed.narrowed(list_of_files=str(listing))
    assert joined.include_patterns == parsed.include_patterns  # the very compiled patterns, not made again
    assert joined.listed == ("a/b.pt", "c") and joined.include_paths == ("d", "a/b.pt", "c")
    assert joined.text == {**parsed.text, "list_of_files": str(listing)}
    assert Filters.from_journal(joined.text).include_paths == joined.include_paths
    with pytest.raises(UsageError, match="one list of files at a time"):
        joined.narrowed(list_of_files=str(listing))
