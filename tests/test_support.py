"""Prove the test infrastructure (Azurite wrapper, fault proxy, fixtures) with the plain Azure SDK."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError, ServiceResponseError
from azure.storage.blob import BlobSasPermissions, BlobServiceClient, ContainerClient, generate_blob_sas
from multidict import CIMultiDict

from conftest import ContainerHandle
from support.azurite import Azurite
from support.proxy import (
    FaultProxy,
    Rule,
    classify,
    flip_byte,
    hold,
    reset_after,
    reset_before,
    reset_mid_response,
    respond,
    stall,
)

pytestmark = pytest.mark.timeout(60)

UNICODE_NAME = "dir one/naïve файл.txt"


def sdk_via(azurite: Azurite, proxy: FaultProxy, **kwargs: Any) -> BlobServiceClient:
    # retry_total=0: SDK retries would otherwise silently absorb the injected faults.
    return BlobServiceClient.from_connection_string(
        azurite.connection_string_via(proxy.endpoint()), retry_total=0, **kwargs
    )


def via(azurite: Azurite, proxy: FaultProxy, container: ContainerHandle, **kwargs: Any) -> ContainerClient:
    return sdk_via(azurite, proxy, **kwargs).get_container_client(container.name)


def test_block_upload_is_counted_and_relayed(
    azurite: Azurite, proxy: FaultProxy, container: ContainerHandle
) -> None:
    data = os.urandom(5 * 1024 + 100)
    c = via(azurite, proxy, container, max_single_put_size=1024, max_block_size=1024)
    c.upload_blob("big.bin", data)

    stats = proxy.stats
    assert stats.requests["put_block"] == 6
    assert stats.ok("put_block") == 6
    assert stats.responses["put_block"][201] == 6
    assert stats.bytes_in["put_block"] == len(data)
    assert stats.requests["put_block_list"] == 1
    assert stats.requests["put_blob"] == 0
    assert [e.blob for e in proxy.log] == ["big.bin"] * 7
    assert all(e.query["blockid"] for e in proxy.log if e.op == "put_block")
    assert container.download("big.bin") == data

    # HEAD through the proxy must keep the upstream Content-Length (the blob size), not the empty body's.
    assert c.get_blob_client("big.bin").get_blob_properties().size == len(data)
    assert c.download_blob("big.bin").readall() == data
    stats = proxy.stats
    assert stats.ok("get_properties") == 1
    assert stats.bytes_out["get_blob"] == len(data)

    proxy.reset_stats()
    assert proxy.stats.requests.total() == 0 and proxy.log == []


def test_respond_injects_azure_error(azurite: Azurite, proxy: FaultProxy, container: ContainerHandle) -> None:
    proxy.add_rule(Rule("put_block", respond(503, "ServerBusy", retry_after=1), nth=2))
    c = via(azurite, proxy, container, max_single_put_size=1024, max_block_size=1024)

    with pytest.raises(HttpResponseError) as info:
        c.upload_blob("busy.bin", os.urandom(4096), max_concurrency=1)
    err: Any = info.value  # the SDK's stubs lack error_code / response.headers
    assert err.status_code == 503
    assert err.error_code == "ServerBusy"
    assert err.response.headers["Retry-After"] == "1"
    assert err.response.headers["x-ms-error-code"] == "ServerBusy"

    stats = proxy.stats
    assert stats.responses["put_block"][503] == 1 and stats.faults["put_block"] == 1
    faulted = [e for e in proxy.log if e.fault == "respond"]
    assert len(faulted) == 1 and faulted[0].status == 503 and faulted[0].error_code == "ServerBusy"
    assert container.blob_names() == []  # the block list was never committed


def test_flip_byte_is_rejected_when_content_md5_is_sent(
    azurite: Azurite, proxy: FaultProxy, container: ContainerHandle
) -> None:
    proxy.add_rule(Rule("put_blob", flip_byte(), times=1))
    c = via(azurite, proxy, container)

    # validate_content=True makes the SDK send Content-MD5; Azurite 3.37 then answers
    # 400 with x-ms-error-code "Md5Mismatch" (same for Put Block; a wrong x-ms-content-crc64 gives
    # 400 "Crc64Mismatch"). Without any checksum header Azurite silently stores the corrupted bytes.
    with pytest.raises(HttpResponseError) as info:
        c.upload_blob("flipped.bin", b"x" * 100, validate_content=True)
    err: Any = info.value
    assert err.status_code == 400
    assert err.error_code == "Md5Mismatch"
    assert container.blob_names() == []

    entry = proxy.log[-1]
    assert (entry.op, entry.fault, entry.status, entry.request_bytes) == ("put_blob", "flip_byte", 400, 100)
    assert "content-md5" in entry.headers

    c.upload_blob("flipped.bin", b"x" * 100, validate_content=True)  # times=1: the retry goes through
    assert container.download("flipped.bin") == b"x" * 100


def test_hold_after_wait_for_and_release(
    azurite: Azurite, proxy: FaultProxy, container: ContainerHandle
) -> None:
    data = os.urandom(8 * 1024)
    c = via(azurite, proxy, container, max_single_put_size=1024, max_block_size=1024)
    proxy.hold_after("put_block", 3)

    with ThreadPoolExecutor(1) as pool:
        upload = pool.submit(c.upload_blob, "held.bin", data, max_concurrency=4)
        proxy.wait_for("put_block", 3, timeout=20)
        proxy.wait_for_held(1, timeout=20)
        # Exactly three blocks reached Azurite even though the SDK uploads four at a time.
        blocks = container.client.get_blob_client("held.bin").get_block_list("uncommitted")[1]
        assert len(blocks) == 3
        assert not upload.done()
        stats = proxy.stats
        assert stats.ok("put_block") == 3
        assert stats.requests["put_block"] >= 4  # the fourth concurrent block was throttled, then held

        proxy.release_holds()
        upload.result(timeout=20)
    assert container.download("held.bin") == data
    assert proxy.held == 0


def test_held_request_of_a_killed_client_is_never_forwarded(
    azurite: Azurite, proxy: FaultProxy, container: ContainerHandle
) -> None:
    proxy.add_rule(Rule("put_blob", hold()))
    script = textwrap.dedent(
        f"""
        from azure.storage.blob import BlobServiceClient
        svc = BlobServiceClient.from_connection_string({azurite.connection_string_via(proxy.endpoint())!r})
        svc.get_blob_client({container.name!r}, "ghost.txt").upload_blob(b"boo")
        """
    )
    client = subprocess.Popen([sys.executable, "-c", script])
    try:
        proxy.wait_for_held(1, timeout=30)
    finally:
        client.kill()
        client.wait()
    proxy.clear_rules()
    proxy.release_holds()
    proxy.wait_until(lambda: any(e.op == "put_blob" for e in proxy.log), timeout=10)

    (entry,) = [e for e in proxy.log if e.op == "put_blob"]
    assert entry.status is None and entry.fault in {"hold", "client_gone"}
    assert container.blob_names() == []


def test_unicode_blob_names_keep_a_valid_signature(
    azurite: Azurite, proxy: FaultProxy, container: ContainerHandle
) -> None:
    c = via(azurite, proxy, container)
    c.upload_blob(UNICODE_NAME, b"hello")
    assert c.download_blob(UNICODE_NAME).readall() == b"hello"
    assert [b.name for b in c.list_blobs()] == [UNICODE_NAME]
    assert container.blob_names() == [UNICODE_NAME]
    assert container.download(UNICODE_NAME) == b"hello"
    assert [e.op for e in proxy.log] == ["put_blob", "get_blob", "list_blobs"]
    assert proxy.log[0].blob == UNICODE_NAME and proxy.log[0].container == container.name
    assert all(e.status in (200, 201, 206) for e in proxy.log)


def test_connection_resets(azurite: Azurite, proxy: FaultProxy, container: ContainerHandle) -> None:
    c = via(azurite, proxy, container)
    container.client.upload_blob("f.bin", b"f")

    proxy.add_rule(Rule("get_properties", reset_before, times=1))
    with pytest.raises(ServiceResponseError):
        c.get_blob_client("f.bin").get_blob_properties()
    assert c.get_blob_client("f.bin").get_blob_properties().size == 1  # times=1

    # reset_after: the service applies the request, the client never learns the outcome.
    proxy.add_rule(Rule("put_blob", reset_after(), times=1))
    with pytest.raises(ServiceResponseError):
        c.upload_blob("applied.bin", b"data")
    assert container.download("applied.bin") == b"data"
    assert [(e.fault, e.status) for e in proxy.log if e.fault] == [
        ("reset_before", None),
        ("reset_after", 201),
    ]


def test_reset_mid_response(azurite: Azurite, proxy: FaultProxy, container: ContainerHandle) -> None:
    data = os.urandom(4000)
    container.client.upload_blob("f.bin", data)
    proxy.add_rule(Rule("get_blob", reset_mid_response(1000)))
    # A raw client with a SAS URL: the SDK's downloader retries truncated bodies itself with fixed 1 s
    # sleeps (even with retry_total=0), which would only make this test slow. Also checks that the SAS
    # query string is relayed intact.
    sas = generate_blob_sas(
        azurite.account, container.name, "f.bin", account_key=azurite.key,
        permission=BlobSasPermissions(read=True), expiry=datetime.now(UTC) + timedelta(hours=1),
    )  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("GET", f"/{azurite.account}/{container.name}/f.bin?{sas}")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.headers["Content-Length"] == "4000"
        with pytest.raises(http.client.IncompleteRead) as info:
            resp.read()
    finally:
        conn.close()
    assert info.value.partial == data[:1000]
    (entry,) = proxy.log
    assert (entry.fault, entry.status, entry.response_bytes) == ("reset_mid_response", 200, 1000)
    assert proxy.stats.ok("get_blob") == 0  # truncated responses do not count as delivered


def test_stall_until_release_and_timed_stall(
    azurite: Azurite, proxy: FaultProxy, container: ContainerHandle
) -> None:
    container.client.upload_blob("s.txt", b"s")
    c = via(azurite, proxy, container)
    proxy.add_rule(Rule("get_properties", stall(), times=1))
    proxy.add_rule(Rule("get_blob", stall(0.2), times=1))
    with ThreadPoolExecutor(1) as pool:
        props = pool.submit(lambda: c.get_blob_client("s.txt").get_blob_properties().size)
        proxy.wait_for_held(1, timeout=20)
        assert not props.done()
        proxy.release()
        assert props.result(timeout=20) == 1
    assert c.download_blob("s.txt").readall() == b"s"  # finishes on its own after 0.2 s
    assert [e.fault for e in proxy.log] == ["stall", "stall"]


def test_restart_loses_in_memory_data(azurite: Azurite, container: ContainerHandle) -> None:
    container.client.upload_blob("gone.txt", b"bye")
    port = azurite.port
    azurite.restart()
    assert azurite.port == port and azurite.running
    with pytest.raises(ResourceNotFoundError):
        container.client.get_container_properties()


def test_proxy_drops_connections_while_azurite_is_down(
    azurite: Azurite, proxy: FaultProxy, container: ContainerHandle
) -> None:
    c = via(azurite, proxy, container)
    azurite.kill()
    try:
        with pytest.raises(ServiceResponseError):
            c.get_container_properties()
    finally:
        azurite.start()  # same port again
    assert proxy.log[-1].fault == "upstream_error"
    with pytest.raises(ResourceNotFoundError):
        c.get_container_properties()


def test_rule_selectors() -> None:
    def fired(rule: Rule, n: int, blob: str = "a/b.txt") -> list[int]:
        return [i for i in range(1, n + 1) if rule._decide("put_block", blob) is not None]

    assert fired(Rule("put_block", reset_before, nth={2, 4}), 6) == [2, 4]
    assert fired(Rule("put_block", reset_before, nth=range(3, 5)), 6) == [3, 4]
    assert fired(Rule("put_block", reset_before, every=2, times=2), 10) == [2, 4]
    assert fired(Rule(None, reset_before, times=1), 3) == [1]
    assert fired(Rule("put_blob", reset_before), 3) == []
    assert fired(Rule("put_block", reset_before, blob="zzz"), 3) == []
    seeded = fired(Rule("put_block", reset_before, probability=0.5, seed=7), 40)
    assert seeded == fired(Rule("put_block", reset_before, probability=0.5, seed=7), 40)
    assert 0 < len(seeded) < 40
    with pytest.raises(ValueError, match="unknown op"):
        Rule("put_blocks", reset_before)


@pytest.mark.parametrize(
    ("method", "path", "headers", "op", "blob"),
    [
        ("PUT", "/devstoreaccount1/c/a%20b?comp=block&blockid=QQ%3D%3D", {}, "put_block", "a b"),
        ("PUT", "/devstoreaccount1/c/d/x?comp=blocklist", {}, "put_block_list", "d/x"),
        ("GET", "/devstoreaccount1/c/x?comp=blocklist&blocklisttype=all", {}, "get_block_list", "x"),
        ("PUT", "/devstoreaccount1/c/na%C3%AFve", {"x-ms-blob-type": "BlockBlob"}, "put_blob", "naïve"),
        ("PUT", "/devstoreaccount1/c?restype=container", {}, "create_container", None),
        ("HEAD", "/devstoreaccount1/c/x", {}, "get_properties", "x"),
        ("GET", "/devstoreaccount1/c/x", {}, "get_blob", "x"),
        ("GET", "/devstoreaccount1/c?restype=container&comp=list&prefix=a", {}, "list_blobs", None),
        ("DELETE", "/devstoreaccount1/c/x", {}, "delete_blob", "x"),
        ("PUT", "/devstoreaccount1/c/x?comp=copy", {}, "other", "x"),
        ("GET", "/devstoreaccount1?comp=list", {}, "other", None),
    ],
)
def test_classify(method: str, path: str, headers: dict[str, str], op: str, blob: str | None) -> None:
    req = classify(method, path, CIMultiDict(headers))
    assert (req.op, req.blob) == (op, blob)
