"""Every Python example of README.md and docs/library.md runs as printed, against Azurite: only the account URL,
the container's name and the credentials are swapped in (issue 38). Each example's writes are read back with the
SDK, the README's background push included."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

from conftest import ContainerHandle
from support.azurite import Azurite
from support.cli import clean_env

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"README": ROOT / "README.md", "library": ROOT / "docs" / "library.md"}


def _blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGES[page].read_text(encoding="utf-8"), re.S)


EXAMPLES = [(page, i) for page in PAGES for i in range(len(_blocks(page)))]


def test_the_pages_have_their_examples() -> None:
    assert len(_blocks("README")) == 1 and len(_blocks("library")) == 4


def _as_run_here(code: str, azurite: Azurite, container: ContainerHandle) -> str:
    sas = generate_account_sas(azurite.account, azurite.key, ResourceTypes(service=True, container=True,
                                                                           object=True),
                               AccountSasPermissions(read=True, write=True, delete=True, list=True, add=True,
                                                     create=True, tag=True),
                               expiry=datetime.now(UTC) + timedelta(hours=1))
    code = code.replace("https://acct.blob.core.windows.net/models", container.url)
    code = code.replace("https://acct.blob.core.windows.net", azurite.blob_endpoint)
    code = code.replace('"models/', f'"{container.name}/').replace("<SAS>", sas)
    code = code.replace('credential="<SAS or a credential object>"', "credential=None")
    return code.replace("DefaultAzureCredential()", "None")  # the emulator's own key on loopback


@pytest.mark.parametrize(("page", "index"), EXAMPLES)
def test_an_example_runs_as_printed(page: str, index: int, azurite: Azurite, container: ContainerHandle,
                                    tmp_path: Path) -> None:
    for folder in ("ckpt", "checkpoints", "models"):
        (tmp_path / folder).mkdir()
    (tmp_path / "ckpt" / "last.pt").write_bytes(os.urandom(1000))
    (tmp_path / "checkpoints" / "best.pt").write_bytes(os.urandom(3000))
    (tmp_path / "models" / "a.pt").write_bytes(os.urandom(2000))
    (tmp_path / "models" / "temp_x.pt").write_bytes(b"scratch")
    code = _as_run_here(_blocks(page)[index], azurite, container)
    # A process of its own, as a script is: the interpreter's exit is part of what is checked.
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env=clean_env({"XDG_STATE_HOME": str(tmp_path / "state")}), check=False)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Unclosed" not in done.stderr, done.stderr
    names = set(container.blob_names())
    ckpt = (tmp_path / "ckpt" / "last.pt").read_bytes()
    if page == "README":
        assert {"run7/state.pkl", "run7/weights.npy", "run7/ep3.pkl"} <= names
        assert container.download("run7/ep3.pkl") == b"..."  # the background push landed
        assert container.download("run7/ckpt/last.pt") == ckpt
    elif index == 0:
        assert pickle.loads(container.download("run7/ep3.pkl"))["epoch"] == 3
        assert container.download("run7/ckpt/last.pt") == ckpt
    elif index == 1:
        assert container.download("run7/metrics.csv") == b"epoch,loss\n3,0.25\n"
        assert container.download("run7/copy/last.pt") == ckpt
    elif index == 2:
        assert container.download("run7/checkpoints/best.pt") == (tmp_path / "checkpoints" / "best.pt").read_bytes()
        assert (tmp_path / "best.pt").read_bytes() == (tmp_path / "checkpoints" / "best.pt").read_bytes()
        assert container.download("synced/a.pt") == (tmp_path / "models" / "a.pt").read_bytes()
        assert pickle.loads(container.download("run7/ckpt/last.pt"))["epoch"] == 3  # the watcher's last round
    else:
        assert pickle.loads(container.download("run7/epoch2.pt"))["epoch"] == 3  # a sync: the folder's contents
