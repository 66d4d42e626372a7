"""Shared fixtures: one in-memory Azurite per session, fresh containers and fault proxies per test."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import BlobServiceClient, ContainerClient, ContainerSasPermissions, generate_container_sas

# tests/ has no __init__.py and pyproject sets no pythonpath, so make `import support...` work under
# any pytest import mode.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

# A split of one large file over --processes workers, with its whole-file MD5, is made only where the machine has a
# core beyond the two one process keeps busy (cluster/client._split_pays); CI has two. The tests run that path as a
# larger machine makes it; test_processes checks the rule itself.
os.environ.setdefault("BLOBSYNC_SPLIT_CORES", "16")

from support.azurite import SECOND_ACCOUNT, SECOND_KEY, Azurite  # noqa: E402
from support.processes import kill_tree, leftover_children  # noqa: E402
from support.proxy import FaultProxy  # noqa: E402


@dataclass
class ContainerHandle:
    """A test container plus an SDK client that talks to Azurite directly (never through a proxy)."""

    name: str
    url: str  # http://127.0.0.1:PORT/devstoreaccount1/<name>
    client: ContainerClient

    def download(self, blob_name: str) -> bytes:
        """Independent read-back of a blob, bypassing the code under test."""
        return self.client.download_blob(blob_name).readall()

    def blob_names(self) -> list[str]:
        return sorted(b.name for b in self.client.list_blobs())


@pytest.fixture(autouse=True)
def no_child_left_behind() -> Iterator[None]:
    """A test that leaves a child process running fails, and the child (with its process group) is killed, so
    pytest never waits on it at exit."""
    yield
    left = leftover_children()
    for pid, _ in left:
        kill_tree(pid)
    if left:
        pytest.fail("left child processes running (killed now): " + "; ".join(f"{pid} {cmd}" for pid, cmd in left))


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """One Azurite for the whole session. Tests may restart() it (same port) but must leave it running."""
    with Azurite() as instance:
        yield instance


@pytest.fixture(scope="session")
def blob_service(azurite: Azurite) -> BlobServiceClient:
    """SDK client talking to Azurite directly."""
    return BlobServiceClient.from_connection_string(azurite.connection_string)


def _container_name(test_name: str) -> str:
    # Container names: 3-63 chars of [a-z0-9-], starting with a letter/digit, no "--". Keep a readable
    # slice of the test name for debugging and a random suffix for uniqueness.
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{slug}-{uuid.uuid4().hex[:12]}" if slug else f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def container(
    request: pytest.FixtureRequest, azurite: Azurite, blob_service: BlobServiceClient
) -> Iterator[ContainerHandle]:
    name = _container_name(request.node.name)
    client = blob_service.create_container(name)
    yield ContainerHandle(name=name, url=f"{azurite.blob_endpoint}/{name}", client=client)
    # Not found: the test restarted Azurite (in-memory data gone) or deleted the container itself.
    if azurite.running:
        with contextlib.suppress(ResourceNotFoundError):
            client.delete_container()


@pytest.fixture
def proxy(azurite: Azurite) -> Iterator[FaultProxy]:
    """A started FaultProxy forwarding to the session Azurite; use ``proxy.endpoint()`` as blob endpoint."""
    with FaultProxy(azurite.base_url) as p:
        yield p


@pytest.fixture
def azurite_env(monkeypatch: pytest.MonkeyPatch, azurite: Azurite) -> str:
    """Point AZURE_STORAGE_CONNECTION_STRING (inherited by subprocesses) straight at Azurite."""
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    return azurite.connection_string


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch, azurite: Azurite, proxy: FaultProxy) -> str:
    """Like ``azurite_env`` but with the blob endpoint going through the ``proxy`` fixture."""
    conn = azurite.connection_string_via(proxy.endpoint())
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
    return conn


@dataclass
class Side:
    """A container of one account, its SAS, and an SDK client straight to Azurite (the independent check)."""

    account: str
    name: str
    sas: str
    client: ContainerClient

    def url(self, endpoint: str, path: str = "") -> str:
        return f"{endpoint}/{self.account}/{self.name}{'/' + path if path else ''}?{self.sas}"

    def download(self, blob: str) -> bytes:
        return self.client.download_blob(blob).readall()


def container_sas(account: str, key: str, container: str) -> str:
    return generate_container_sas(account, container, account_key=key, expiry=datetime.now(UTC) + timedelta(hours=2),
                                  permission=ContainerSasPermissions(read=True, write=True, create=True, list=True,
                                                                     delete=True, tag=True))


@pytest.fixture
def source(container: ContainerHandle, azurite: Azurite) -> Side:
    """The test container (first account) as a copy's source side."""
    sas = container_sas(azurite.account, azurite.key, container.name)
    return Side(azurite.account, container.name, sas, container.client)


@pytest.fixture
def dest(azurite: Azurite) -> Iterator[Side]:
    """A container of the instance's second account: a copy's destination side."""
    service = BlobServiceClient.from_connection_string(azurite.second_connection_string)
    name = f"dst-{uuid.uuid4().hex[:12]}"
    client = service.create_container(name)
    yield Side(SECOND_ACCOUNT, name, container_sas(SECOND_ACCOUNT, SECOND_KEY, name), client)
    if azurite.running:
        with contextlib.suppress(Exception):
            client.delete_container()
