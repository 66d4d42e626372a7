"""Nothing left open (issue 48): a DCP script that saves and loads through BlobStorageWriter/Reader, consolidates,
keeps Checkpoints and reads a dataset in spawned DataLoader workers leaves no session unclosed (aiohttp says
"Unclosed client session" of each one dropped)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import Side
from support.azurite import Azurite

SCRIPT = """
import sys, warnings
warnings.simplefilter("ignore")
import torch
import torch.distributed.checkpoint as dcp
from torch.utils.data import DataLoader

from blobsync.torch import BlobDataset, BlobStorageReader, BlobStorageWriter, Checkpoints, consolidate


def main():
    base, sas = sys.argv[1].split("?")
    saves(base, sas)
    dataset = BlobDataset(f"{base}/r0?{sas}")
    got = list(DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn"))
    assert len(got) == len(dataset)
    print("done")


def saves(base, sas):
  for step in range(3):
    url = f"{base}/s{step}?{sas}"
    dcp.save({"w": torch.randn(100), "n": {"e": step}}, storage_writer=BlobStorageWriter(url), no_dist=True)
    back = {"w": torch.zeros(100), "n": {"e": 0}}
    dcp.load(back, storage_reader=BlobStorageReader(url), no_dist=True)
    assert back["n"]["e"] == step
    assert consolidate(url)["n"]["e"] == step
  writer = BlobStorageWriter(f"{base}/r0?{sas}")
  for step in range(2):  # one writer, a checkpoint_id per save
    dcp.save({"w": torch.ones(3)}, storage_writer=writer, checkpoint_id=f"{base}/r{step}?{sas}", no_dist=True)
  with Checkpoints(f"{base}/run?{sas}", keep=1) as ckpts:
    ckpts.save(1, {"w": torch.ones(2)})
    ckpts.load()


if __name__ == "__main__":
    main()
"""


def test_a_dcp_script_leaves_no_session_unclosed(source: Side, azurite: Azurite, tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, "-X", "dev", str(script), source.url(azurite.base_url, "closed")],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    assert "Unclosed" not in out.stderr and "unclosed" not in out.stderr, out.stderr
