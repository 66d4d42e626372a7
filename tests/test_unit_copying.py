"""cp's arguments read as AzCopy reads them: wildcards, the folder level --as-subdir adds, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from blobsync.cp_arguments import _wildcard_tail, plan_blob_copy, plan_copy
from blobsync.errors import UsageError
from blobsync.filters import Filters

URL = "https://acct.blob.core.windows.net/models"


def test_upload_layout_and_wildcards(tmp_path: Path) -> None:
    (tmp_path / "run1" / "sub").mkdir(parents=True)
    (tmp_path / "run1" / "a.pt").write_bytes(b"x")
    folder = str(tmp_path / "run1")
    assert plan_copy(folder, URL, recursive=True).remote.path == "run1"
    assert plan_copy(folder + "/", URL + "/pre/", recursive=True).remote.path == "pre/run1"
    assert plan_copy(folder, URL + "/pre", recursive=True, as_subdir=False).remote.path == "pre"
    star = plan_copy(folder + "/*.pt", URL, recursive=False)
    assert star.many and star.local == tmp_path / "run1" and star.remote.path == ""
    assert star.filters.matches("a.pt") and not star.filters.matches("b.h5") and not star.filters.matches("x/a.pt")
    with pytest.raises(UsageError, match="pass -r"):
        plan_copy(folder, URL, recursive=False)
    with pytest.raises(UsageError, match="only in the last segment"):
        plan_copy(str(tmp_path / "*" / "a.pt"), URL, recursive=True)


def test_a_local_name_with_a_star_that_exists_is_taken_literally(tmp_path: Path) -> None:
    (tmp_path / "odd*.pt").write_bytes(b"x")
    plan = plan_copy(str(tmp_path / "odd*.pt"), URL, recursive=False)
    assert not plan.many and plan.local == tmp_path / "odd*.pt"


def test_download_layout_wildcards_and_an_encoded_star(tmp_path: Path) -> None:
    dest = str(tmp_path / "dl")
    assert plan_copy(URL + "/run7", dest, recursive=True).local == tmp_path / "dl" / "run7"
    assert plan_copy(URL + "/run7/", dest, recursive=True).local == tmp_path / "dl" / "run7"
    assert plan_copy(URL, dest, recursive=True).local == tmp_path / "dl" / "models"
    star = plan_copy(URL + "/run7/*?sv=1&sig=abc", dest, recursive=True)
    assert star.local == tmp_path / "dl" and star.remote.path == "run7/" and star.remote.sas == "sv=1&sig=abc"
    literal = plan_copy(URL + "/a%2Ab.pt", dest, recursive=False)  # %2A: a star in the blob's name
    assert not literal.many and literal.remote.path == "a*b.pt"
    with pytest.raises(UsageError, match="only in the last segment"):
        plan_copy(URL + "/r*/x.pt", dest, recursive=True)



def test_blob_to_blob_layout_follows_azcopy() -> None:
    other = "https://other.blob.core.windows.net/backup"
    one = plan_blob_copy(URL + "/run7/best.pt", other, recursive=False, as_subdir=True, filters=Filters())
    assert not one.many and one.dest.path == "best.pt"  # a container URL: the blob keeps its name
    assert plan_blob_copy(URL + "/run7/best.pt", other + "/keep/", recursive=False, as_subdir=True,
                          filters=Filters()).dest.path == "keep/best.pt"
    assert plan_blob_copy(URL + "/run7/best.pt", other + "/renamed.pt", recursive=False, as_subdir=True,
                          filters=Filters()).dest.path == "renamed.pt"
    tree = plan_blob_copy(URL + "/run7", other + "/2026", recursive=True, as_subdir=True, filters=Filters())
    assert tree.many and tree.source.path == "run7" and tree.dest.path == "2026/run7/"
    flat = plan_blob_copy(URL + "/run7", other, recursive=True, as_subdir=False, filters=Filters())
    assert flat.dest.path == ""
    whole = plan_blob_copy(URL, other, recursive=True, as_subdir=True, filters=Filters())
    assert whole.dest.path == "models/"  # a container copied becomes a level named after it, as a download does
    star = plan_blob_copy(URL + "/run7/*.pt", other + "/x", recursive=False, as_subdir=True, filters=Filters())
    assert star.many and star.source.path == "run7/" and star.dest.path == "x/" and star.filters.active
    with pytest.raises(UsageError, match="names no blob"):
        plan_blob_copy(URL + "/run7/", other, recursive=False, as_subdir=True, filters=Filters())


def test_windows_separators_split_a_wildcard_too() -> None:
    assert _wildcard_tail("C:\\data\\*.pt", "x", "\\/") == ("C:\\data\\", "*.pt")
    assert _wildcard_tail("C:/data\\ckpt/*", "x", "\\/") == ("C:/data\\ckpt/", "*")
