"""Unit tests: URL parsing, credential resolution, Shared Key signing (cross-checked with the SDK), token header."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass

import pytest
from azure.core.pipeline import PipelineContext, PipelineRequest
from azure.core.rest import HttpRequest
from azure.storage.blob._shared.authentication import SharedKeyCredentialPolicy

from blobsync.backends.azure.auth import (
    EMULATOR_KEY,
    AnonymousCredential,
    Request,
    SasCredential,
    SharedKeyCredential,
    TokenCredential,
    resolve_credential,
)
from blobsync.backends.azure.location import parse_location
from blobsync.errors import UsageError

SAS = "sv=2023-11-03&ss=b&srt=co&sp=rwlc&se=2099-01-01T00:00:00Z&spr=https&sig=abc%2Bdef%3D"


def test_public_cloud_url() -> None:
    loc = parse_location(f"https://myacct.blob.core.windows.net/models/run%201/ckpt?{SAS}")
    assert (loc.account, loc.container, loc.path, loc.path_style) == ("myacct", "models", "run 1/ckpt", False)
    assert loc.sas == SAS
    assert loc.display == "https://myacct.blob.core.windows.net/models/run%201/ckpt"
    assert "sig" not in loc.display
    assert loc.sas_token is not None and loc.sas_token.permissions == "rwlc"


def test_a_sas_given_apart_signs_the_location_it_is_given_to() -> None:
    """jobs resume --sas: the journal's URL parsed, then the SAS read as a SAS (never joined into a URL)."""
    from blobsync.backends.registry import parse_location as any_location

    loc = parse_location("https://myacct.blob.core.windows.net/models/ckpt").with_sas(f" ?{SAS}")
    assert loc.sas == SAS and loc.path == "ckpt" and "sig" not in loc.display
    for bad in ("sp=r&se=2099-01-01", f"{SAS}#frag", SAS.replace("&sp", "\n&sp")):
        with pytest.raises(UsageError, match="not a SAS token"):
            loc.with_sas(bad)
    for other in ("memory://box/a", "s3://bucket/a"):
        with pytest.raises(UsageError, match="SAS"):
            any_location(other).with_sas(SAS)


def test_emulator_url_is_path_style() -> None:
    loc = parse_location("http://127.0.0.1:10000/devstoreaccount1/data/pre/")
    assert (loc.account, loc.container, loc.path, loc.path_style) == ("devstoreaccount1", "data", "pre/", True)
    assert loc.account_url == "http://127.0.0.1:10000/devstoreaccount1"
    assert loc.is_loopback


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ftp://acct.blob.core.windows.net/cont", "malformed URL"),
        ("https://acct.blob.core.windows.net", "names no container"),
        ("https://acct.blob.core.windows.net/", "names no container"),
        ("https://acct.blob.core.windows.net/Bad_Name", "invalid container name"),
        ("https://acct.blob.core.windows.net/cont?restype=container", "not a SAS"),
        ("http://127.0.0.1:10000/", "expected http://127.0.0.1:10000/<account>"),
        ("https://AB.blob.core.windows.net/cont", "not a valid storage account"),
    ],
)
def test_bad_urls_are_usage_errors(url: str, fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment):
        parse_location(url)


def test_bad_url_error_never_shows_the_sas() -> None:
    with pytest.raises(UsageError) as info:
        parse_location(f"https://acct.blob.core.windows.net/Bad_Name?{SAS}")
    assert "sig=" not in str(info.value)


def test_credential_order() -> None:
    loc = parse_location(f"https://acct.blob.core.windows.net/cont?{SAS}")
    assert isinstance(resolve_credential(loc, {"AZURE_STORAGE_KEY": EMULATOR_KEY}), SasCredential)
    plain = parse_location("https://acct.blob.core.windows.net/cont")
    cred = resolve_credential(plain, {"AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_KEY": EMULATOR_KEY})
    assert isinstance(cred, SharedKeyCredential) and cred.account == "acct"
    # A key for another account is not used for this one.
    other = resolve_credential(plain, {"AZURE_STORAGE_ACCOUNT": "other", "AZURE_STORAGE_KEY": EMULATOR_KEY})
    assert not isinstance(other, SharedKeyCredential)


def test_connection_strings() -> None:
    emu = parse_location("http://127.0.0.1:10000/devstoreaccount1/cont")
    cred = resolve_credential(emu, {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"})
    assert isinstance(cred, SharedKeyCredential) and cred.key == EMULATOR_KEY
    explicit = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        f"AccountKey={EMULATOR_KEY};BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
    )
    cred = resolve_credential(emu, {"AZURE_STORAGE_CONNECTION_STRING": explicit})
    assert isinstance(cred, SharedKeyCredential) and "CONNECTION_STRING" in cred.description
    # BlobEndpoint alone names the account.
    endpoint_only = f"BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature={SAS}"
    real = parse_location("https://acct.blob.core.windows.net/cont")
    assert isinstance(resolve_credential(real, {"AZURE_STORAGE_CONNECTION_STRING": endpoint_only}), SasCredential)
    with pytest.raises(UsageError, match="malformed"):
        resolve_credential(real, {"AZURE_STORAGE_CONNECTION_STRING": "garbage"})


def test_no_credentials_on_loopback_non_emulator_account_is_anonymous() -> None:
    loc = parse_location("http://127.0.0.1:10000/someacct/cont")
    assert isinstance(resolve_credential(loc, {}), AnonymousCredential)


def _sdk_signature(method: str, url: str, headers: dict[str, str]) -> str:
    request = PipelineRequest(HttpRequest(method, url, headers=dict(headers)), PipelineContext(None))
    SharedKeyCredentialPolicy("devstoreaccount1", EMULATOR_KEY).on_request(request)
    return str(request.http_request.headers["Authorization"])


@pytest.mark.parametrize(
    ("method", "path", "query", "headers"),
    [
        ("PUT", "/devstoreaccount1/c/dir%20one/na%C3%AFve.txt", [],
         {"x-ms-blob-type": "BlockBlob", "Content-Length": "11", "Content-MD5": "abc==",
          "Content-Type": "text/plain", "x-ms-meta-mtime": "2026", "x-ms-meta-a_b": "1", "x-ms-meta-ab": "2"}),
        ("PUT", "/devstoreaccount1/c/big", [("comp", "block"), ("blockid", "YWJj+/==")],
         {"Content-Length": "8388608", "Content-Type": "application/octet-stream"}),
        ("GET", "/devstoreaccount1/c/big", [("comp", "blocklist"), ("blocklisttype", "all")], {}),
        ("HEAD", "/devstoreaccount1/c/x", [], {"If-None-Match": "*"}),
        ("PUT", "/devstoreaccount1/c/empty", [], {"Content-Length": "0", "x-ms-blob-type": "BlockBlob"}),
    ],
)
def test_shared_key_matches_the_sdk(
    method: str, path: str, query: list[tuple[str, str]], headers: dict[str, str]
) -> None:
    from urllib.parse import quote

    headers = {**headers, "x-ms-date": "Mon, 30 Nov 2026 02:00:00 GMT", "x-ms-version": "2023-11-03"}
    req = Request(method, path, list(query), dict(headers))
    asyncio.run(SharedKeyCredential("devstoreaccount1", EMULATOR_KEY).authorize(req))
    qs = "&".join(f"{k}={quote(v, safe='')}" for k, v in query)
    url = f"http://127.0.0.1:10000{path}" + (f"?{qs}" if qs else "")
    assert req.headers["Authorization"] == _sdk_signature(method, url, headers)


@dataclass
class _Token:
    token: str
    expires_on: int


class _FakeIdentity:
    def __init__(self) -> None:
        self.calls = 0
        self.scopes: tuple[str, ...] = ()

    async def get_token(self, *scopes: str) -> _Token:
        self.calls += 1
        self.scopes = scopes
        return _Token(f"tok{self.calls}", 4102444800)


def test_token_credential_sets_bearer_header_and_caches() -> None:
    source = _FakeIdentity()
    cred = TokenCredential(source)
    first = Request("GET", "/cont/x", [], {})
    second = Request("GET", "/cont/y", [], {})
    asyncio.run(cred.authorize(first))
    asyncio.run(cred.authorize(second))
    assert first.headers["Authorization"] == "Bearer tok1"
    assert second.headers["Authorization"] == "Bearer tok1"
    assert source.calls == 1
    assert source.scopes == ("https://storage.azure.com/.default",)


class _SlowIdentity(_FakeIdentity):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self.inflight = 0
        self.most = 0

    async def get_token(self, *scopes: str) -> _Token:
        self.inflight += 1
        self.most = max(self.most, self.inflight)
        await asyncio.sleep(0.05)  # IMDS is not instant: every cold request would ask meanwhile
        self.inflight -= 1
        return await super().get_token(*scopes)

    async def close(self) -> None:
        self.closed = True


def test_many_cold_requests_share_one_token_fetch_and_the_source_is_closed() -> None:
    source = _SlowIdentity()
    cred = TokenCredential(source)

    async def burst() -> list[str]:
        requests = [Request("GET", f"/cont/{i}", [], {}) for i in range(64)]
        await asyncio.gather(*(cred.authorize(r) for r in requests))
        await cred.close()
        return [r.headers["Authorization"] for r in requests]

    assert set(asyncio.run(burst())) == {"Bearer tok1"}
    assert source.calls == 1 and source.most == 1 and source.closed


def test_an_azure_ad_token_is_never_sent_over_plain_http() -> None:
    loc = parse_location("http://acct.blob.core.windows.net/cont/x")
    with pytest.raises(UsageError, match="HTTPS only"):
        resolve_credential(loc, {})


def test_bad_account_key_is_usage_error() -> None:
    with pytest.raises(UsageError, match="not valid base64"):
        SharedKeyCredential("acct", "not base64!!")
    assert base64.b64decode(EMULATOR_KEY)
