"""AzCopy users switch without editing their scripts: the same commands, run through blobsync and (where it is
installed) the real AzCopy 10.32.2 on identical trees against one Azurite, give the same names, sizes and exit
status. The expected sets below were recorded from AzCopy itself, so they also hold where AzCopy is absent."""

from __future__ import annotations

import concurrent.futures
import datetime
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient, ContainerSasPermissions, generate_container_sas

from support.azcopy import azcopy_missing, run_azcopy
from support.azurite import Azurite
from support.cli import run

TREE = ("a.pt", "b.h5", "temp_x.pt", "sub/c.pt", "sub.pt", "subway/d.pt", "sub/deep/e.pt")
SEEDED = ("sub/a.pt", "sub/b.h5", "sub/x/c.pt", "subz.pt", "top.pt", "other/o.pt")
LB, BL = ("--from-to", "LocalBlob"), ("--from-to", "BlobLocal")


@dataclass(frozen=True)
class Case:
    """`{url}` is the container URL (the SAS is added to it); `expect` the blob names of an upload or the files
    under dl/ of a download (`{c}`: the container's name), as AzCopy 10.32.2 made them."""

    id: str
    args: tuple[str, ...]
    expect: tuple[str, ...] = ()
    ok: bool = True
    beyond_azcopy: str | None = None  # blobsync does more here (then AzCopy's result is not compared)

    @property
    def download(self) -> bool:
        return "dl" in self.args


def _case(id: str, *args: str, expect: tuple[str, ...] = (), ok: bool = True, beyond: str | None = None) -> Case:
    return Case(id, args, expect, ok, beyond)


ALL_UP = ("a.pt", "b.h5", "sub.pt", "sub/c.pt", "sub/deep/e.pt", "subway/d.pt", "temp_x.pt")
CASES = (
    # 1. The project's own use case, as typed for AzCopy.
    _case("seed-command", "sync", "f6", "{url}", "--recursive", "--include-pattern", "*.pt;*.h5;*.joblib",
          "--exclude-pattern", "temp_*", expect=("a.pt", "b.h5", "sub.pt", "sub/c.pt", "sub/deep/e.pt",
                                                 "subway/d.pt")),
    _case("sync-recursive-true", "sync", "f6", "{url}", "--recursive=true", *LB, expect=ALL_UP),
    _case("sync-recursive-false", "sync", "f6", "{url}", "--recursive=false", *LB,
          expect=("a.pt", "b.h5", "sub.pt", "temp_x.pt")),
    # 2. cp -r layout.
    _case("up-folder", "cp", "f6", "{url}", "--recursive", *LB, expect=tuple(f"f6/{n}" for n in ALL_UP)),
    _case("up-folder-slash", "cp", "f6/", "{url}", "--recursive", *LB, expect=tuple(f"f6/{n}" for n in ALL_UP)),
    _case("up-folder-prefix", "cp", "f6", "{url}/pre", "--recursive", *LB,
          expect=tuple(f"pre/f6/{n}" for n in ALL_UP)),
    _case("up-as-subdir-false", "cp", "f6", "{url}", "--recursive", "--as-subdir=false", *LB, expect=ALL_UP),
    _case("down-prefix", "cp", "{url}/sub", "dl", "--recursive", *BL,
          expect=("sub/a.pt", "sub/b.h5", "sub/x/c.pt")),
    _case("down-prefix-slash", "cp", "{url}/sub/", "dl", "--recursive", *BL,
          expect=("sub/a.pt", "sub/b.h5", "sub/x/c.pt")),
    _case("down-container", "cp", "{url}", "dl", "--recursive", *BL,
          expect=tuple(f"{{c}}/{n}" for n in sorted(SEEDED))),
    _case("down-as-subdir-false", "cp", "{url}/sub", "dl", "--recursive", "--as-subdir=false", *BL,
          expect=("a.pt", "b.h5", "x/c.pt")),
    # 3. cp filters, and 6. --exclude-path as a string prefix.
    _case("up-patterns", "cp", "f6", "{url}", "--recursive", "--include-pattern", "*.pt;*.h5", "--exclude-pattern",
          "temp_*", *LB, expect=tuple(f"f6/{n}" for n in ALL_UP if n != "temp_x.pt")),
    _case("up-exclude-path", "cp", "f6", "{url}", "--recursive", "--exclude-path", "sub", *LB,
          expect=("f6/a.pt", "f6/b.h5", "f6/temp_x.pt")),
    _case("up-include-path", "cp", "f6", "{url}", "--recursive", "--include-path", "sub", *LB,
          expect=("f6/sub/c.pt", "f6/sub/deep/e.pt")),
    _case("up-include-regex", "cp", "f6", "{url}", "--recursive", "--include-regex", "^sub", *LB,
          expect=("f6/sub.pt", "f6/sub/c.pt", "f6/sub/deep/e.pt", "f6/subway/d.pt")),
    _case("sync-exclude-path", "sync", "f6", "{url}", "--exclude-path", "sub", *LB,
          expect=("a.pt", "b.h5", "temp_x.pt")),
    _case("down-exclude-path", "cp", "{url}", "dl", "--recursive", "--exclude-path", "sub", *BL,
          expect=("{c}/other/o.pt", "{c}/top.pt")),
    _case("down-include-path", "cp", "{url}", "dl", "--recursive", "--include-path", "sub", *BL,
          expect=("{c}/sub/a.pt", "{c}/sub/b.h5", "{c}/sub/x/c.pt")),
    # 4. Wildcard sources.
    _case("up-star", "cp", "f6/*", "{url}", "--recursive", *LB, expect=ALL_UP),
    _case("up-star-no-r", "cp", "f6/*", "{url}", *LB, expect=("a.pt", "b.h5", "sub.pt", "temp_x.pt")),
    _case("up-star-pt", "cp", "f6/*.pt", "{url}", "--recursive", *LB, expect=("a.pt", "sub.pt", "temp_x.pt")),
    _case("up-s-star", "cp", "f6/s*", "{url}", "--recursive", *LB,
          expect=("sub.pt", "sub/c.pt", "sub/deep/e.pt", "subway/d.pt")),
    _case("down-star", "cp", "{url}/sub/*", "dl", "--recursive", *BL, expect=("a.pt", "b.h5", "x/c.pt")),
    _case("down-star-no-r", "cp", "{url}/sub/*", "dl", *BL, expect=("a.pt", "b.h5")),
    _case("down-star-pt", "cp", "{url}/*.pt", "dl", "--recursive", *BL, expect=("subz.pt", "top.pt"),
          beyond="AzCopy refuses '*' in a URL except a trailing '/*'"),
    # Refusals both make.
    _case("up-folder-no-r", "cp", "f6", "{url}", *LB, ok=False),
    _case("down-prefix-no-r", "cp", "{url}/sub", "dl", *BL, ok=False),
    _case("down-nothing-there", "cp", "{url}/nothing", "dl", "--recursive", *BL, ok=False),
)


def _sas(azurite: Azurite, container: str) -> str:
    return generate_container_sas(
        azurite.account, container, account_key=azurite.key,
        permission=ContainerSasPermissions(read=True, add=True, create=True, write=True, delete=True, list=True),
        expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The source tree every upload case reads (each file holds its own relative path), once per tool: the two
    run side by side, each in a folder of its own."""
    root = tmp_path_factory.mktemp("azcompat")
    for tool, rel in ((tool, rel) for tool in ("blobsync", "azcopy") for rel in TREE):
        (root / tool / "f6" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / tool / "f6" / rel).write_bytes(rel.encode())
    return root


@dataclass
class Outcome:
    ok: bool
    names: dict[str, int]  # name -> size
    output: str


def _outcome(case: Case, tool: str, world: Path, azurite: Azurite, service: BlobServiceClient, name: str,
             state: Path) -> Outcome:
    client = service.create_container(name)
    try:
        for blob in SEEDED if case.download else ():
            client.upload_blob(blob, blob.encode())
        url = f"{azurite.blob_endpoint}/{name}"
        sas = _sas(azurite, name)
        args = [a.replace("{url}", url) + (f"?{sas}" if a.startswith("{url}") else "") for a in case.args]
        cwd = world / tool
        dl = cwd / "dl"
        shutil.rmtree(dl, ignore_errors=True)
        dl.mkdir()
        if tool == "azcopy":
            if "--from-to" not in args:  # AzCopy cannot tell an emulator URL is Blob Storage without it
                args += ["--from-to", "BlobLocal" if case.download else "LocalBlob"]
            done = run_azcopy(args, cwd=cwd, state=state)
        else:
            done = run(args, cwd=cwd, env={"XDG_STATE_HOME": str(state)})
        if case.download:
            names = {str(p.relative_to(dl)): p.stat().st_size for p in dl.rglob("*") if p.is_file()}
            for path in dl.rglob("*"):
                if path.is_file():  # each seeded blob holds its own name: the bytes came from the right blob
                    rel, content = str(path.relative_to(dl)), path.read_text()
                    assert content in SEEDED and (rel.endswith(content) or content.endswith(rel)), path
        else:
            names = {b.name: b.size for b in client.list_blobs()}
            for blob in names:
                assert blob.endswith(client.download_blob(blob).readall().decode()), blob
        return Outcome(done.returncode == 0, names, done.stdout[-2000:] + done.stderr[-2000:])
    finally:
        client.delete_container()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_same_command_same_result_as_azcopy(case: Case, world: Path, azurite: Azurite,
                                             blob_service: BlobServiceClient, tmp_path: Path) -> None:
    name = f"az-{case.id}"[:40].rstrip("-") + f"-{os.getpid() % 10000}"
    compare = azcopy_missing() is None and not case.beyond_azcopy
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        ours = pool.submit(_outcome, case, "blobsync", world, azurite, blob_service, name + "-b", tmp_path / "b")
        theirs = pool.submit(_outcome, case, "azcopy", world, azurite, blob_service, name + "-a",
                             tmp_path / "a") if compare else None
        got = ours.result()
        peer = theirs.result() if theirs is not None else None
    assert got.ok == case.ok, got.output
    assert sorted(got.names) == sorted(n.replace("{c}", name + "-b") for n in case.expect), got.output
    if peer is None:
        return
    assert peer.ok == case.ok, peer.output
    theirs = {n.replace(name + "-a", name + "-b"): size for n, size in peer.names.items()}
    assert theirs == got.names, peer.output


def test_azcopy_is_compared_here_or_says_why() -> None:
    reason = azcopy_missing()
    if reason is not None:
        pytest.skip(reason)
