"""Azure AD in the command: DefaultAzureCredential's token from a managed identity endpoint over HTTPS, trusted
through SSL_CERT_FILE, sent to Azurite under a public storage name that a CONNECT proxy routes to it (the command
reads the CA store late: the token request must still verify with it)."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from azure.storage.blob import BlobServiceClient

from support.azurite import Azurite
from support.cli import clean_env, run
from support.connect_proxy import ConnectProxy
from test_tls import _self_signed


def _b64(obj: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def _token() -> str:
    # Azurite's --oauth basic checks the claims (issuer, audience, lifetime), not the signature.
    now = int(time.time())
    claims = {"aud": "https://storage.azure.com", "iss": "https://sts.windows.net/72f988bf-86f1-41af-91ab-2d7cd011db47/",
              "iat": now - 60, "nbf": now - 60, "exp": now + 3600, "oid": "0c3a5c0b-1d5e-4b3e-9d2e-1a2b3c4d5e6f",
              "tid": "72f988bf-86f1-41af-91ab-2d7cd011db47"}
    return f"{_b64({'alg': 'RS256', 'typ': 'JWT'})}.{_b64(claims)}.c2lnbmF0dXJl"


class _Identity(BaseHTTPRequestHandler):
    """App Service's managed identity endpoint: a token for the resource asked, to holders of the header."""

    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        if self.headers.get("X-IDENTITY-HEADER") != "the-header":
            self.send_response(401)
            self.end_headers()
            return
        self.asked.append(self.path)
        body = json.dumps({"access_token": _token(), "expires_on": str(int(time.time()) + 3600),
                           "resource": "https://storage.azure.com", "token_type": "Bearer"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


HOST = "devstoreaccount1.blob.core.windows.net"  # served by Azurite through the proxy's route: nothing leaves


@dataclass
class Setting:
    identity: str  # the managed identity endpoint
    azurite: Azurite
    proxy: ConnectProxy
    cert: Path

    def env(self, **extra: str) -> dict[str, str]:
        # No key or SAS anywhere: DefaultAzureCredential, whose managed identity step asks `identity`.
        return {"IDENTITY_ENDPOINT": self.identity, "IDENTITY_HEADER": "the-header", "HTTPS_PROXY": self.proxy.url,
                "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1", **extra}


@pytest.fixture(scope="module")
def setting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setting]:
    cert, key = _self_signed(tmp_path_factory.mktemp("aad"), HOST)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Identity)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with Azurite(tls=(cert, key), oauth=True) as azurite, \
                ConnectProxy(routes={f"{HOST}:443": ("127.0.0.1", azurite.port)}) as proxy:
            BlobServiceClient.from_connection_string(azurite.connection_string,
                                                     connection_verify=str(cert)).create_container("aad")
            yield Setting(f"https://127.0.0.1:{server.server_address[1]}/msi/token", azurite, proxy, cert)
    finally:
        server.shutdown()
        server.server_close()


def test_the_command_gets_a_token_over_https_and_uses_it(setting: Setting, tmp_path: Path) -> None:
    src = tmp_path / "weights.pt"
    src.write_bytes(b"w" * 70_000)
    _Identity.asked.clear()
    # The identity endpoint's certificate is trusted only through SSL_CERT_FILE, which the command reads late.
    env = setting.env(SSL_CERT_FILE=str(setting.cert))
    up = run(["cp", str(src), f"https://{HOST}/aad/weights.pt"], env=env)
    assert up.returncode == 0, up.stderr
    assert _Identity.asked and "resource=https" in _Identity.asked[0]
    service = BlobServiceClient.from_connection_string(setting.azurite.connection_string,
                                                       connection_verify=str(setting.cert))
    assert service.get_blob_client("aad", "weights.pt").download_blob().readall() == src.read_bytes()
    listed = run(["ls", f"https://{HOST}/aad"], env=env)
    assert listed.returncode == 0 and "weights.pt" in listed.stdout, listed.stderr


def test_an_identity_endpoint_the_store_does_not_trust_gets_no_request(setting: Setting) -> None:
    _Identity.asked.clear()
    # Storage is trusted (REQUESTS_CA_BUNDLE, for blobsync's own requests); the identity endpoint is not.
    listed = run(["ls", f"https://{HOST}/aad"], env=setting.env(REQUESTS_CA_BUNDLE=str(setting.cert)))
    assert listed.returncode != 0
    assert "could not get an Azure AD token" in listed.stderr and "Traceback" not in listed.stderr
    assert _Identity.asked == []


def test_half_set_azure_ad_variables_are_one_line(setting: Setting) -> None:
    listed = run(["ls", f"https://{HOST}/aad"], env=setting.env(AZURE_CLIENT_ID="", AZURE_TENANT_ID="",
                                                                AZURE_CLIENT_SECRET="s3cr3t-value"))
    assert listed.returncode != 0
    assert "Azure AD credentials from the environment are not usable" in listed.stderr
    assert "Traceback" not in listed.stderr and "s3cr3t-value" not in listed.stderr


def test_aiohttp_reads_no_store_at_import_in_the_command_and_every_store_once_asked() -> None:
    code = """
import json, ssl
from blobsync.backends import trust_store
trust_store.defer()
aiohttp = trust_store.import_aiohttp()
contexts = [v for v in vars(aiohttp.connector).values() if isinstance(v, ssl.SSLContext)]
before = [c.cert_store_stats()["x509_ca"] for c in contexts]
fresh = ssl.create_default_context().cert_store_stats()["x509_ca"]
trust_store.load()
after = [c.cert_store_stats()["x509_ca"] for c in contexts]
print(json.dumps([before, fresh, after]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    before, fresh, after = json.loads(out.stdout)
    assert before and before == [0] * len(before)  # nothing read at import
    assert fresh > 0  # the patch is gone: a context made afterwards reads the store as usual
    assert after == [fresh] * len(before)  # and the deferred ones read it when asked


def test_a_token_after_aiohttp_came_in_deferred_verifies_with_the_store(setting: Setting) -> None:
    # The order a command can take: blobsync's first request loads aiohttp (deferred), then an azure-identity
    # credential asks for a token through aiohttp's default context. Without trust_store.load() that context
    # trusts nothing and the token request fails.
    code = """
import asyncio
from blobsync.backends import trust_store
trust_store.defer()
trust_store.import_aiohttp()
from azure.identity.aio import DefaultAzureCredential
from blobsync.backends.azure.auth import Request, TokenCredential

async def main():
    credential = TokenCredential(DefaultAzureCredential())
    request = Request("GET", "/aad", [], {})
    await credential.authorize(request)
    await credential.source.close()
    print(request.headers["Authorization"][:7])

asyncio.run(main())
"""
    _Identity.asked.clear()
    env = clean_env(setting.env(SSL_CERT_FILE=str(setting.cert)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "Bearer" and len(_Identity.asked) == 1
