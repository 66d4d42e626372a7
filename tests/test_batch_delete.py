"""Bulk deletes: Blob Batch requests of up to 256 where the service takes them, one per blob where it does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blobsync.backends.azure.batch import SubRequest, batch_body, parse_batch
from conftest import ContainerHandle
from support.cli import random_file, run
from support.proxy import FaultProxy, Rule, respond


def _summary(stdout: str) -> dict[str, object]:
    return [json.loads(line) for line in stdout.splitlines() if '"summary"' in line][-1]


def _fill(container: ContainerHandle, prefix: str, count: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: container.client.upload_blob(f"{prefix}{i:04}.bin", b"x"), range(count)))


def test_rm_r_of_600_blobs_takes_three_batch_requests(container: ContainerHandle, proxy: FaultProxy) -> None:
    _fill(container, "r/", 600)
    container.client.upload_blob("keep.bin", b"k")
    done = run(["rm", "-r", f"{proxy.endpoint()}/{container.name}/r", "--output-type", "json", "--quiet"])
    assert done.returncode == 0, done.stderr
    assert _summary(done.stdout)["files_deleted"] == 600
    assert proxy.stats.requests["batch"] == 3 and proxy.stats.requests["delete_blob"] == 0
    assert container.blob_names() == ["keep.bin"]


def test_where_the_service_takes_no_batches_each_blob_is_deleted_alone(container: ContainerHandle,
                                                                       proxy: FaultProxy, tmp_path: Path) -> None:
    _fill(container, "d/", 40)
    random_file(tmp_path / "src" / "only.bin", 5, seed=1)
    proxy.add_rule(Rule("batch", respond(400, "InvalidQueryParameterValue")))
    done = run(["sync", str(tmp_path / "src"), f"{proxy.endpoint()}/{container.name}/d",
                "--delete-destination", "true", "--journal", str(tmp_path / "j.db"), "--output-type", "json",
                "--quiet"])
    assert done.returncode == 0, done.stderr
    assert _summary(done.stdout)["files_deleted"] == 40
    assert proxy.stats.requests["batch"] == 1  # found out once, then one request per blob
    assert proxy.stats.ok("delete_blob") == 40
    assert container.blob_names() == ["d/only.bin"]


def test_a_permission_error_in_a_batch_stops_with_the_auth_error(container: ContainerHandle,
                                                                  proxy: FaultProxy) -> None:
    _fill(container, "a/", 5)
    proxy.add_rule(Rule("batch", respond(403, "AuthorizationPermissionMismatch")))
    done = run(["rm", "-r", f"{proxy.endpoint()}/{container.name}/a", "--quiet"])
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert len(container.blob_names()) == 5


def test_the_batch_body_holds_signed_sub_requests_and_refuses_line_breaks() -> None:
    content_type, body = batch_body([SubRequest("DELETE", "/acct/c/a%20b", {"x-ms-date": "d", "Authorization": "x"})])
    boundary = content_type.split("boundary=")[1]
    text = body.decode()
    assert text.startswith(f"--{boundary}\r\n") and text.endswith(f"--{boundary}--\r\n")
    assert "DELETE /acct/c/a%20b HTTP/1.1\r\nx-ms-date: d\r\nAuthorization: x\r\nContent-Length: 0\r\n" in text
    with pytest.raises(ValueError):
        batch_body([SubRequest("DELETE", "/acct/c/x", {"If-Match": "a\r\nX-Evil: 1"})])


def test_sub_responses_map_by_position_even_without_content_id() -> None:
    b = "batchresponse_1"
    body = (f"--{b}\r\nContent-Type: application/http\r\nContent-ID: 0\r\n\r\nHTTP/1.1 202 Accepted\r\n"
            f"x-ms-request-id: 1\r\n\r\n"
            f"--{b}\r\nContent-Type: application/http\r\n\r\nHTTP/1.1 503 Server Busy\r\n"
            f"x-ms-error-code: ServerBusy\r\nContent-Length: 3\r\n\r\nabc\r\n"
            f"--{b}\r\nContent-Type: application/http\r\n\r\nHTTP/1.1 404 Not Found\r\n"
            f"x-ms-error-code: BlobNotFound\r\n"
            f"--{b}--\r\n").encode()
    answers = parse_batch(f"multipart/mixed; boundary={b}", body, 3)
    assert [a.status for a in answers] == [202, 503, 404]
    assert answers[1].headers["x-ms-error-code"] == "ServerBusy" and answers[1].body == b"abc"
    with pytest.raises(ValueError):
        parse_batch(f"multipart/mixed; boundary={b}", body, 4)
    with pytest.raises(ValueError):
        parse_batch("application/xml", body, 3)
