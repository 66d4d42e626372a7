"""The library examples in docs/library.md run as written, against Azurite (account URLs and credentials swapped in)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import ContainerHandle
from support.azurite import Azurite

README = (Path(__file__).resolve().parents[1] / "docs" / "library.md").read_text()
MARK = "<!-- this block is run by tests/test_readme_examples.py against Azurite -->"


def _blocks() -> list[str]:
    return [m.group(1) for m in re.finditer(re.escape(MARK) + r"\n```python\n(.*?)```", README, re.S)]


def test_the_readme_has_its_examples() -> None:
    assert len(_blocks()) == 2


@pytest.mark.parametrize("index", [0, 1])
def test_a_readme_example_runs(index: int, azurite: Azurite, container: ContainerHandle, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    code = _blocks()[index]
    code = code.replace('"https://acct.blob.core.windows.net/models"', repr(container.url))
    code = code.replace('"https://acct.blob.core.windows.net"', repr(azurite.blob_endpoint))
    code = code.replace('"models/', f'"{container.name}/')
    code = code.replace("DefaultAzureCredential()", "None")  # the emulator's own key on loopback
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "last.pt").write_bytes(os.urandom(1000))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    namespace: dict[str, object] = {}
    exec(compile(code, f"README example {index}", "exec"), namespace)  # our own README
    fs = namespace.get("fs")
    if fs is not None:
        fs.client.close()  # type: ignore[attr-defined]
    names = container.blob_names()
    if index == 0:
        assert {"run7/state.pkl", "run7/weights.npy", "run7/ep3.pkl", "run7/ckpt/last.pt"} <= set(names)
        assert container.download("run7/ckpt/last.pt") == (tmp_path / "ckpt" / "last.pt").read_bytes()
    else:
        assert container.download("run7/metrics.csv") == b"epoch,loss\n3,0.25\n"
        assert container.download("run7/copy/last.pt") == (tmp_path / "ckpt" / "last.pt").read_bytes()
