"""The part checks: the Storage CRC64's value, which check a store gets, and the fallback without awscrt."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blobsync import checksums
from blobsync.backends.base import BlockCheck, PartCheck
from blobsync.backends.registry import open_store
from blobsync.checksums import choose_check, crc64_of, part_check
from blobsync.config import TransferConfig
from blobsync.errors import UsageError

SAS = "sv=2023-11-03&ss=b&srt=co&sp=rwl&se=2030-01-01T00:00:00Z&spr=https&sig=c2lnbmF0dXJl"


def test_storage_crc64_is_crc64_nvme_as_the_header_carries_it() -> None:
    # CRC-64/NVME's check value (the catalogue's, for b"123456789"); Azure's Storage CRC64 is that CRC.
    assert crc64_of(b"123456789") == (0xAE8B14860A799888).to_bytes(8, "little")
    assert crc64_of(b"") == bytes(8)
    # What Azure itself answered for a Put Blob of b"Hello World" (x-ms-content-crc64 in a recorded response of
    # the Azure SDK for JavaScript's test suite): the header is the CRC's 8 bytes, little-endian, in base64.
    assert base64.b64encode(crc64_of(b"Hello World")) == b"YeJLfssylmU="
    data = os.urandom(100_000)
    assert crc64_of(memoryview(bytearray(data))[10:]) == crc64_of(data[10:])  # any buffer, no copy needed
    assert part_check(b"x", BlockCheck.MD5) == PartCheck(BlockCheck.MD5, hashlib.md5(b"x").digest())
    assert part_check(b"x", BlockCheck.CRC64) == PartCheck(BlockCheck.CRC64, crc64_of(b"x"))


def test_azure_gets_crc64_and_the_emulator_md5_unless_asked() -> None:
    config = TransferConfig()
    azure = open_store(f"https://acct.blob.core.windows.net/cont?{SAS}", config, {})
    emulator = open_store(f"http://127.0.0.1:10000/devstoreaccount1/cont?{SAS}", config, {})
    assert choose_check(azure.capabilities.part_checks) is BlockCheck.CRC64
    assert choose_check(emulator.capabilities.part_checks) is BlockCheck.MD5
    assert choose_check(emulator.capabilities.part_checks, BlockCheck.CRC64) is BlockCheck.CRC64
    assert choose_check(azure.capabilities.part_checks, BlockCheck.MD5) is BlockCheck.MD5
    assert choose_check((), BlockCheck.AUTO) is None  # a store that verifies none
    assert choose_check((), BlockCheck.MD5) is None


def test_without_awscrt_auto_falls_back_to_md5_and_crc64_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checksums, "_crc64", lambda: None)
    assert choose_check((BlockCheck.CRC64, BlockCheck.MD5)) is BlockCheck.MD5
    with pytest.raises(UsageError, match="awscrt"):
        choose_check((BlockCheck.CRC64, BlockCheck.MD5), BlockCheck.CRC64)


@pytest.mark.parametrize("how", ["not installed", "installed but broken"])
def test_cli_block_check_crc64_without_awscrt_is_one_line_and_exit_2(tmp_path: Path, how: str) -> None:
    # A real process where awscrt cannot be had: absent (refused before anything starts), or present and failing
    # to load (refused when the first block would be hashed, still before anything is sent).
    fake = tmp_path / "shadow"
    fake.mkdir()
    if how == "not installed":
        (fake / "sitecustomize.py").write_text("import sys\nsys.modules['awscrt'] = None\n")
    else:
        (fake / "awscrt").mkdir()
        (fake / "awscrt" / "__init__.py").write_text("raise ImportError('awscrt is broken here')\n")
    (tmp_path / "f.bin").write_bytes(os.urandom(3 * 1024 * 1024))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), *sys.path]),
           "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = subprocess.run(
        [sys.executable, "-m", "blobsync", "cp", str(tmp_path / "f.bin"),
         f"http://127.0.0.1:9/devstoreaccount1/cont/f.bin?{SAS}", "--block-check", "crc64", "--block-size-mb", "1",
         "--put-blob-size-mb", "1"],
        env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert any("--block-check crc64 needs the awscrt package" in line for line in lines), proc.stderr
    assert "Traceback" not in proc.stderr and "c2lnbmF0dXJl" not in proc.stderr


def test_awscrt_is_loaded_by_the_first_chunked_upload_not_by_small_files(tmp_path: Path) -> None:
    # Its native module costs ~75 ms and ~6 MiB: a job of small files (one Put Blob each) never needs it.
    script = """
import sys
from pathlib import Path
import blobsync
from blobsync.backends import memory
from blobsync.config import TransferConfig
root = Path(sys.argv[1])
(root / "small").mkdir()
for i in range(5):
    (root / "small" / f"{i}.bin").write_bytes(b"x" * 1000)
(root / "big.bin").write_bytes(b"y" * (3 * 1024 * 1024))
memory.container("lazy")
config = TransferConfig.from_mib(journal_path=root / "j.db", block_size_mb=1, put_blob_size_mb=1, recursive=True)
assert blobsync.copy(root / "small", "memory://lazy/s", config).ok
print("after small files:", "awscrt" in sys.modules)
assert blobsync.copy(root / "big.bin", "memory://lazy/big.bin", config).ok
print("after a chunked upload:", "awscrt" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["after small files: False", "after a chunked upload: True"]
