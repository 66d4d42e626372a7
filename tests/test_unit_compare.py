"""The index's SQL pre-filter leaves out exactly the pairs decide() would not transfer."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from blobsync.jobs.compare import MTIME_WINDOWS, CompareMode, decide
from blobsync.journal.index import Entry, SyncIndex

BASE = 1_700_000_000 * 10**9
# Offsets around both windows (1 ms for exact times, 1 s for coarse ones) and their edges.
OFFSETS = st.sampled_from([0, 1, -1, 999_999, 1_000_000, 1_000_001, 999_999_999, 10**9, 10**9 + 1, -(10**9) - 1,
                           5 * 10**9, -(5 * 10**9)])
SIDE = st.tuples(st.sampled_from([0, 1, 2]), OFFSETS, st.booleans())  # size, mtime offset, exact mtime


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), SIDE, SIDE), min_size=1, max_size=12))
def test_sql_skip_matches_decide(rows: list[tuple[bool, tuple[int, int, bool], tuple[int, int, bool]]]) -> None:
    index = SyncIndex()
    try:
        srcs, dsts = [], []
        for i, (has_dst, (s_size, s_off, s_exact), (d_size, d_off, d_exact)) in enumerate(rows):
            rel = f"f{i:03d}"
            srcs.append(Entry(rel, s_size, BASE + s_off, s_exact))
            if has_dst:
                dsts.append(Entry(rel, d_size, BASE + d_off, d_exact, b"m" * 16, "etag", rel))
        index.add("src", srcs)
        index.add("dst", dsts)
        every = list(index.pairs())
        assert [s.rel for s, _ in every] == sorted(e.rel for e in srcs)
        for mode, kwargs in ((CompareMode.SIZE_ONLY, {}), (CompareMode.SIZE_AND_MTIME, {"newer_than": MTIME_WINDOWS})):
            expected = [(s, d) for s, d in every if decide(s, d, mode).transfer]
            assert list(index.pairs(skip_same_size=True, **kwargs)) == expected
    finally:
        index.close()
