"""Errors a pipeline catches (issue 38, point 6): every type exported and documented, the file-like families, and
messages that say what happened, against Azurite."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.storage.blob import ContainerSasPermissions, generate_container_sas

import blobsync
from blobsync import errors
from conftest import ContainerHandle
from support.azurite import Azurite
from support.cli import clean_env

INTERNAL = {"CredentialRenewed", "BatchUnsupported"}  # they never leave the request path


def test_every_error_a_caller_meets_is_exported_and_documented() -> None:
    raised = {name for name, cls in inspect.getmembers(errors, inspect.isclass)
              if issubclass(cls, errors.BlobsyncError) and cls.__module__ == errors.__name__} - INTERNAL
    assert raised <= set(blobsync.__all__), raised - set(blobsync.__all__)
    manual = (Path(__file__).resolve().parents[1] / "docs" / "library.md").read_text(encoding="utf-8")
    assert all(f"| `{name}` |" in manual for name in raised), [n for n in raised if f"| `{n}` |" not in manual]


def test_missing_blobs_and_containers_are_file_not_found_on_every_call(
        azurite: Azurite, container: ContainerHandle, tmp_path: Path) -> None:
    config = blobsync.TransferConfig(journal_path=tmp_path / "j.db")
    env = {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}
    with blobsync.Client(container.url, config, env=env) as client:
        with pytest.raises(FileNotFoundError):
            client.get("nope.bin")
        with pytest.raises(blobsync.BlobNotFoundError):
            client.stat("nope.bin")
    with blobsync.Client(f"{azurite.blob_endpoint}/no-such-container", config, env=env) as client:
        for call in (lambda: client.get("x"), lambda: client.stat("x"), lambda: client.put(b"x", "x")):
            with pytest.raises(blobsync.ContainerNotFoundError) as caught:
                call()
            assert isinstance(caught.value, FileNotFoundError)


def test_a_credential_sas_that_expired_says_so_and_a_key_given_as_a_sas_is_named(
        azurite: Azurite, container: ContainerHandle, tmp_path: Path) -> None:
    container.client.upload_blob("x.bin", b"x")
    expired = generate_container_sas(azurite.account, container.name, account_key=azurite.key,
                                     permission=ContainerSasPermissions(read=True),
                                     expiry=datetime.now(UTC) - timedelta(hours=1))
    config = blobsync.TransferConfig(journal_path=tmp_path / "j.db", max_retries=0)
    with blobsync.Client(container.url, config, credential=expired, env={}) as client, \
            pytest.raises(blobsync.AuthError, match="expired at"):
        client.get("x.bin")
    with pytest.raises(blobsync.UsageError, match="looks like an account key") as caught:
        blobsync.Client(container.url, config, credential=azurite.key, env={}).get("x.bin")
    assert "AzureNamedKeyCredential" in str(caught.value) and azurite.key not in str(caught.value)


def test_module_calls_and_aborted_writers_print_no_stray_tracebacks(container: ContainerHandle,
                                                                    tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import blobsync, traceback
        config = blobsync.TransferConfig(journal_path={str(tmp_path / 'j.db')!r})
        try:
            blobsync.copy({container.url + '/nope.bin'!r}, {str(tmp_path / 'x')!r}, config, raise_on_error=True)
        except blobsync.BlobsyncError as exc:
            traceback.print_exc()
        with blobsync.Client({container.url!r}, config) as client:
            try:
                with client.open("w.bin", "wb") as f:
                    f.write(b"x" * (9 * 1024 * 1024))
                    raise ValueError("the training step failed")
            except ValueError:
                pass
        print("done")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          env=clean_env({"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}))
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert "no running event loop" not in done.stderr, done.stderr
    assert "CancelledError" not in done.stderr, done.stderr
    assert container.blob_names() == []
