"""Credentials as objects (issue 27, part 2): a SAS provider asked again when its SAS expires mid-upload (the job
goes on at block level), azure-core's AzureSasCredential and AzureNamedKeyCredential, connection strings, and
refusals; against Azurite, every byte checked with an SDK download."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.storage.blob import ContainerSasPermissions, generate_container_sas

import blobsync
from blobsync import TransferConfig
from blobsync.config import MiB
from conftest import ContainerHandle
from support.azurite import Azurite
from support.proxy import FaultProxy


def _sas(azurite: Azurite, container: str, seconds: float) -> str:
    return generate_container_sas(azurite.account, container, account_key=azurite.key,
                                  permission=ContainerSasPermissions(read=True, write=True, create=True, list=True),
                                  expiry=datetime.now(UTC) + timedelta(seconds=seconds))


def test_a_sas_that_expires_mid_upload_is_renewed_and_nothing_acknowledged_is_sent_again(
        azurite: Azurite, container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    asked: list[str] = []

    def provider() -> str:
        asked.append("short" if not asked else "long")
        return _sas(azurite, container.name, 2 if len(asked) == 1 else 3600)

    data = os.urandom(6 * MiB)  # ~4 s at the cap: the first SAS (1-2 s left, se has whole seconds) runs out
    config = TransferConfig.from_mib(block_size_mb=1, cap_mbps=12, journal_path=tmp_path / "j.db")
    url = f"{proxy.endpoint()}/{container.name}"  # no SAS: the provider's
    with blobsync.Client(url, config, credential=provider) as client:
        result = client.put(data, "big.bin")
    assert asked[:2] == ["short", "long"]
    stats = proxy.stats
    refused = stats.responses["put_block"][403]
    assert refused >= 1  # the first SAS did expire during the upload
    assert stats.ok("put_block") == 6  # each block acknowledged once: nothing acknowledged was sent again
    assert stats.requests["put_block"] == 6 + refused
    assert container.download("big.bin") == data and result.size == len(data)


def test_azure_core_credentials_and_a_connection_string(
        azurite: Azurite, container: ContainerHandle, tmp_path: Path) -> None:
    config = TransferConfig(journal_path=tmp_path / "j.db")
    url = f"{azurite.blob_endpoint}/{container.name}"
    sas = AzureSasCredential(_sas(azurite, container.name, 3600))
    for name, credential in (("named.txt", AzureNamedKeyCredential(azurite.account, azurite.key)),
                             ("sas.txt", sas),
                             ("conn.txt", azurite.connection_string),
                             ("text-sas.txt", "?" + _sas(azurite, container.name, 3600))):
        with blobsync.Client(url, config, credential=credential) as client:
            client.put(name.encode(), name)
            assert client.get(name) == name.encode()
        assert container.download(name) == name.encode()
    # Every call of a Client goes through its session and so its credential: rm, ls and a copy down too.
    full = generate_container_sas(azurite.account, container.name, account_key=azurite.key,
                                  permission=ContainerSasPermissions(read=True, list=True, delete=True),
                                  expiry=datetime.now(UTC) + timedelta(hours=1))
    with blobsync.Client(url, config, credential=AzureSasCredential(full)) as client:
        assert sorted(p.name for p in client.ls()) == ["conn.txt", "named.txt", "sas.txt", "text-sas.txt"]
        assert client.copy(client.url_for("conn.txt"), tmp_path / "down.txt").ok
        report = client.remove(client.url_for("named.txt"))
        assert report.ok and report.files_deleted == 1
    assert (tmp_path / "down.txt").read_bytes() == b"conn.txt"
    assert sorted(container.blob_names()) == ["conn.txt", "sas.txt", "text-sas.txt"]


def test_credentials_that_cannot_be_used_are_refused_before_any_request(tmp_path: Path) -> None:
    class Tokens:  # a synchronous azure-identity-like credential
        def get_token(self, *scopes: str) -> object:
            raise AssertionError("no token may be asked for an unknown host")

    config = TransferConfig(journal_path=tmp_path / "j.db")
    with blobsync.Client("https://192.0.2.77:1/acct/cont", config, credential=Tokens()) as client, \
            pytest.raises(blobsync.UsageError, match="not an Azure Storage host"):
        client.put(b"x", "x")
    with blobsync.Client("http://127.0.0.1:1/devstoreaccount1/cont", config, credential=42) as client, \
            pytest.raises(blobsync.UsageError, match="invalid credential=int"):
        client.put(b"x", "x")
    with blobsync.Client("http://127.0.0.1:1/devstoreaccount1/cont", config, credential="no signature") as client, \
            pytest.raises(blobsync.UsageError, match="neither a SAS"):
        client.put(b"x", "x")
