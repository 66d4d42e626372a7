"""User text that becomes a header or a URL is checked before any request: no smuggling, no silent truncation."""

from __future__ import annotations

from pathlib import Path

import pytest

import blobsync
from blobsync.config import TransferConfig
from blobsync.errors import UsageError
from conftest import ContainerHandle
from support.cli import random_file, run
from support.proxy import FaultProxy

_SMUGGLED = ("text/plain\r\nContent-Length: 0\r\n\r\nDELETE /devstoreaccount1/{c}/victim.txt HTTP/1.1\r\n"
             "Host: x\r\nX-J: x")


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_smuggled_request_in_content_type_is_refused_and_the_victim_survives(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    container.client.upload_blob("victim.txt", b"keep me")
    random_file(tmp_path / "a.txt", 10)
    done = run(["cp", str(tmp_path / "a.txt"), f"{proxy.endpoint()}/{container.name}/b.txt", "--journal",
                str(tmp_path / "j.db"), "--content-type", _SMUGGLED.format(c=container.name)])
    assert done.returncode == 2
    assert "--content-type" in _one_line(done.stderr)
    assert container.blob_names() == ["victim.txt"] and container.download("victim.txt") == b"keep me"
    assert sum(proxy.stats.requests.values()) == 0  # refused before any request


@pytest.mark.parametrize(("flag", "value", "named"), [
    ("--metadata", "k=v\r\nx-ms-meta-injected: yes", "--metadata"),
    ("--metadata", "k=v\nx", "--metadata"),
    ("--metadata", "k=caf\u00e9", "--metadata"),
    ("--metadata", "1k=v", "--metadata"),
    ("--content-type", "text/plain\n", "--content-type"),
    ("--content-type", "text/\u2603", "--content-type"),
])
def test_header_flags_with_line_breaks_or_non_latin1_text_are_usage_errors(
    flag: str, value: str, named: str, container: ContainerHandle, tmp_path: Path
) -> None:
    random_file(tmp_path / "a.txt", 10)
    done = run(["cp", str(tmp_path / "a.txt"), f"{container.url}/a.txt", "--journal", str(tmp_path / "j.db"),
                flag, value])
    assert done.returncode == 2, done.stderr
    assert named in _one_line(done.stderr)
    assert container.blob_names() == []


@pytest.mark.parametrize("fields", [
    {"metadata": {"run": "a\r\nx-ms-meta-injected: yes"}},
    {"metadata": {"bad name": "v"}},
    {"content_type": "a\rb"},
])
def test_library_header_values_are_checked_too(fields: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        TransferConfig(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "named"), [
    ({"metadata": {"bad-name": "v"}}, "--metadata name 'bad-name'"),
    ({"blob_tags": {f"k{i}": "v" for i in range(11)}}, "at most 10"),
    ({"blob_tags": {"k": "a!b"}}, "--blob-tags item k=a!b"),
])
def test_the_destination_store_s_own_rules_refuse_a_write_on_every_path_before_any_request(
    fields: dict[str, object], named: str, container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    """Metadata names and tags are the store's to rule on (Azure: a C# identifier; at most 10 tags of its
    characters): a job, a Client's one-request put and its stream writer all ask it first."""
    random_file(tmp_path / "a.txt", 10)
    config = TransferConfig(journal_path=tmp_path / "j.db", **fields)  # type: ignore[arg-type]
    url = f"{proxy.endpoint()}/{container.name}"
    with pytest.raises(UsageError, match=named):
        blobsync.copy(tmp_path / "a.txt", f"{url}/a.txt", config)
    with blobsync.Client(url, config) as client:
        with pytest.raises(UsageError, match=named):
            client.put(b"small", "b.txt")
        with pytest.raises(UsageError, match=named):
            client.open("c.txt", "wb")
    assert sum(proxy.stats.requests.values()) == 0
    assert container.blob_names() == []


def test_a_hash_in_a_url_is_refused_with_the_way_to_write_it(container: ContainerHandle, tmp_path: Path) -> None:
    random_file(tmp_path / "a.txt", 10)
    done = run(["cp", str(tmp_path / "a.txt"), f"{container.url}/run#1.pt", "--journal", str(tmp_path / "j.db")])
    assert done.returncode == 2
    assert "%23" in _one_line(done.stderr)
    assert container.blob_names() == []
    ok = run(["cp", str(tmp_path / "a.txt"), f"{container.url}/run%231.pt", "--journal", str(tmp_path / "j.db")])
    assert ok.returncode == 0, ok.stderr
    assert container.blob_names() == ["run#1.pt"]


def test_a_path_segment_ending_in_a_dot_is_refused(container: ContainerHandle, tmp_path: Path) -> None:
    random_file(tmp_path / "src" / "v1." / "a.txt", 10)
    random_file(tmp_path / "src" / "ok.txt", 10)
    report = blobsync.copy(tmp_path / "src", container.url, TransferConfig(recursive=True,
                                                                           journal_path=tmp_path / "j.db"),
                           as_subdir=False)
    assert report.files_failed == 1 and "ending in '.'" in report.failures[0].reason
    assert container.blob_names() == ["ok.txt"]
