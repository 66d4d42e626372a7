"""Azurite restarted mid-job (in-memory: the staged blocks are gone): the engine notices and re-sends."""

from __future__ import annotations

from pathlib import Path

from azure.storage.blob import BlobServiceClient

from blobsync.config import MiB
from conftest import ContainerHandle
from support.azurite import Azurite
from support.cli import random_file, start
from support.proxy import FaultProxy


def test_restart_before_commit_resends_instead_of_reporting_success(
    azurite: Azurite, blob_service: BlobServiceClient, container: ContainerHandle, proxy: FaultProxy,
    tmp_path: Path,
) -> None:
    data = random_file(tmp_path / "f.bin", 6 * MiB + 3, seed=9)
    proxy.hold_after("put_block", 7)  # every block staged; Put Block List is held
    proc = start(["cp", str(tmp_path / "f.bin"), f"{proxy.endpoint()}/{container.name}/f.bin",
                  "--journal", str(tmp_path / "j.db"), "--block-size-mb", "1", "--quiet"])
    try:
        proxy.wait_for_held(1, timeout=60)
        azurite.restart()  # in-memory: every staged block and the container are gone
        blob_service.create_container(container.name)
        proxy.release_holds()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, (out, err)
    assert proxy.stats.ok("put_block") >= 7 + 7  # all seven sent again after the restart
    assert container.download("f.bin") == data
