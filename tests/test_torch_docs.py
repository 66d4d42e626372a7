"""Every example of docs/torch.md runs as printed (issue 40), against Azurite, with only the account URL and a
container SAS swapped in: the DCP one under torchrun with two ranks, the others as scripts. What each wrote is read
back with the SDK."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ContainerHandle, container_sas
from support.azurite import Azurite, free_port
from support.cli import clean_env
from test_readme_examples import _as_run_here

PAGE = Path(__file__).resolve().parents[1] / "docs" / "torch.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


def test_the_page_has_its_examples() -> None:
    assert len(_blocks()) == 6


@pytest.mark.parametrize("index", range(6))
def test_an_example_runs_as_printed(index: int, azurite: Azurite, container: ContainerHandle,
                                    tmp_path: Path) -> None:
    for i in range(6):  # the dataset example's arrays
        buf = io.BytesIO()
        np.save(buf, np.full((3, 4), i, dtype=np.float32))
        container.client.upload_blob(f"run7/shards/{i:02d}.npy", buf.getvalue())
    # A container SAS, as a checkpoint folder's often is: the emulator answers Put Block From URL and Blob Batch
    # requests signed with an account SAS with HTTP 500 (Azure takes them).
    sas = container_sas(azurite.account, azurite.key, container.name)
    code = _as_run_here(_blocks()[index].replace("<SAS>", sas), azurite, container)
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    command = [sys.executable, str(script)]
    if code.startswith("# torchrun --nproc-per-node 2"):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                   str(free_port()), str(script)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
                          env=clean_env({"XDG_STATE_HOME": str(tmp_path / "state"), "OMP_NUM_THREADS": "1"}))
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    names = set(container.blob_names())
    if index == 0:
        assert {"run7/dcp/step-100/.metadata", "run7/dcp/step-100/__1_0.distcp", "run7/dcp/step-101/.metadata"} <= names
    elif index == 1:
        whole = torch.load(io.BytesIO(container.download("run7/export/model.pt")), weights_only=True)
        assert whole["step"] == 200 and set(whole["model"]) == {"weight", "bias"}
    elif index == 2:
        assert json.loads(container.download("run7/ckpt/latest")) == {"step": 400, "format": "torch"}
        assert not any(n.startswith(("run7/ckpt/step-00000100", "run7/ckpt/step-00000200")) for n in names)
        saved = torch.load(io.BytesIO(container.download("run7/ckpt/step-00000400/state.pt")), weights_only=True)
        assert saved["step"] == 400
    elif index == 3:
        assert "step 3: " in done.stdout and "staged by the service from step 2" in done.stdout
        assert {"run7/lora/step-00000003/state.pt", "run7/lora/step-00000003/state.pt.blocks"} <= names
        assert not any(n.startswith("run7/lora/step-00000001") for n in names)
        assert (tmp_path / "ckpt-local" / "step-00000003" / "state.pt").exists()
        saved = torch.load(io.BytesIO(container.download("run7/lora/step-00000003/state.pt")), weights_only=True)
        assert saved["step"] == 3
    elif index == 4:
        assert "torch.Size([4, 3, 4])" in done.stdout and "6 arrays" in done.stdout
    else:
        saved = torch.load(io.BytesIO(container.download("run7/lightning/ckpts/last.ckpt")), weights_only=False)
        assert saved["epoch"] == 2
