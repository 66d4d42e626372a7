"""Safety on every path (issue 37): a credential goes only where it may, whoever copies (a plain job, --processes,
--cluster, the Client). Each test runs against Azurite and a real listening socket on this machine's outside
address, which must never see a credential meant for another host."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

import blobsync
from blobsync.backends.registry import open_store, parse_location
from blobsync.config import MiB
from blobsync.errors import UsageError
from conftest import ContainerHandle, container_sas
from support.azurite import Azurite
from support.cli import clean_env, random_file, run, start
from support.processes import kill_tree
from support.proxy import FaultProxy, Rule, drop_etag, forget_if_match, hold, shift_range
from support.recorder import Recorder, outside_address, recording

PATHS = {"plain": [], "processes": ["--processes", "2"], "cluster": ["--cluster", "local:2"]}
LIBRARY = ("client", "fsspec")  # the same work through the library, each in a process of its own (pathrun.py)
PATHRUN = str(Path(__file__).parent / "support" / "pathrun.py")
EMULATOR = {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}


def start_on(path: str, command: str, src: str, dst: str, journal: Path, container_url: str,
             *, delete: bool = False) -> subprocess.Popen[str]:
    """One transfer (cp -r or sync) through `path`: the CLI (plain, --processes 2, --cluster local:2), the Client
    or fsspec."""
    if path in PATHS:
        args = [command, src, dst, "--journal", str(journal), *PATHS[path]]
        args += ["--recursive"] if command == "cp" else ["--delete-destination", "true"] if delete else []
        return start(args, EMULATOR)
    account = container_url.split("?", 1)[0].rsplit("/", 1)[0]  # a SAS's signature may hold a '/'
    env = clean_env({**EMULATOR, "PATHRUN_CONTAINER_URL": container_url, "PATHRUN_ACCOUNT_URL": account})
    args = [sys.executable, PATHRUN, path, command, src, dst, "--journal", str(journal), *(["--delete"] * delete)]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        kill_tree(proc.pid)
        proc.communicate()
    return proc.returncode, out + err
DEST_SIG = "DESTSIGdestsig0123456789"


@pytest.fixture
def evil() -> Iterator[Recorder]:
    host = outside_address()
    if host is None:
        pytest.skip("this machine has no non-loopback address")
    yield from recording(host)


def _evil_dest(evil: Recorder, name: str = "x.bin") -> str:
    return evil.url(f"acct/cont/{name}") + f"?sv=2022-11-02&sr=c&sp=rwc&sig={DEST_SIG}"


def _source_env(azurite: Azurite, container: ContainerHandle, kind: str) -> tuple[dict[str, str], str]:
    """The environment's credential for the source account, and the secret that must not travel."""
    if kind == "sas":
        sas = container_sas(azurite.account, azurite.key, container.name)
        secret = next(p[4:] for p in sas.split("&") if p.startswith("sig="))
        return {"AZURE_STORAGE_CONNECTION_STRING": f"BlobEndpoint={azurite.blob_endpoint};"
                                                   f"SharedAccessSignature={sas}"}, secret
    return {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}, "sig="


def _leaked(evil: Recorder, secret: str) -> list[str]:
    """What the destination host was sent of the source's credential (its own SAS is the user's to send)."""
    out = []
    for seen in evil.seen:
        text = seen.text().replace(f"sig={DEST_SIG}", "")
        if secret in text or "x-ms-copy-source-authorization" in text.lower() or "Bearer" in text:
            out.append(text)
    return out


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("kind", ["sas", "key"])
def test_a_copy_never_hands_the_sources_credential_to_another_host(
        container: ContainerHandle, azurite: Azurite, evil: Recorder, tmp_path: Path, kind: str, path: str) -> None:
    container.client.upload_blob("x.bin", b"secret bytes" * 100)
    env, secret = _source_env(azurite, container, kind)
    src = f"{container.url}/x.bin" if path == "plain" else container.url
    dst = _evil_dest(evil) if path == "plain" else evil.url("acct/cont") + f"?sv=2022-11-02&sig={DEST_SIG}"
    args = ["cp", src, dst, "--journal", str(tmp_path / "j.db"), "--max-retries", "0", *PATHS[path]]
    if path != "plain":
        args.append("--recursive")
    done = run(args, env=env, timeout=180)
    assert done.returncode == 2, done.stderr
    assert not _leaked(evil, secret), _leaked(evil, secret)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert "--trusted-microsoft-suffixes" in lines[-1] and "--s2s-via-client" in lines[-1], done.stderr
    assert secret not in done.stderr + done.stdout


def test_a_trusted_destination_gets_the_grant_and_via_client_sends_none(
        container: ContainerHandle, azurite: Azurite, evil: Recorder, tmp_path: Path) -> None:
    container.client.upload_blob("x.bin", b"abc" * 100)
    env, secret = _source_env(azurite, container, "sas")
    base = ["cp", f"{container.url}/x.bin", _evil_dest(evil), "--journal", str(tmp_path / "j.db"),
            "--max-retries", "0"]
    done = run([*base, "--s2s-via-client"], env=env, timeout=60)
    assert not _leaked(evil, secret), done.stderr
    assert any(s.method == "PUT" for s in evil.seen), done.stderr  # the bytes went up from here instead
    done = run([*base, "--trusted-microsoft-suffixes", evil.host, "--overwrite", "true"], env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert _leaked(evil, secret)  # the user allowed it: the service there reads the source with it


class _Tokens:
    """An azure-identity style credential with a fixed token: the Client's Azure AD identity."""

    def __init__(self) -> None:
        self.token = "eyJ0eXAiOiJKV1QiLCJhbGciOi.TOKENtoken0123456789.sig"

    async def get_token(self, *scopes: str) -> SimpleNamespace:
        return SimpleNamespace(token=self.token, expires_on=2**40)


def test_a_clients_credential_stays_with_its_account(container: ContainerHandle, azurite: Azurite,
                                                     evil: Recorder, tmp_path: Path) -> None:
    container.client.upload_blob("x.bin", b"abc" * 100)
    sas = container_sas(azurite.account, azurite.key, container.name)
    secret = next(p[4:] for p in sas.split("&") if p.startswith("sig="))
    config = blobsync.TransferConfig(journal_path=tmp_path / "j.db", max_retries=0)
    with blobsync.Client(container.url, config, credential=sas, env={}) as client:
        with pytest.raises(UsageError, match="--trusted-microsoft-suffixes"):
            client.copy(client.url_for("x.bin"), _evil_dest(evil))
        # A put to a URL on another host is signed by that URL's own SAS, never by the Client's.
        client.put(b"hello", _evil_dest(evil, "y.bin"))
        assert client.get("x.bin") == b"abc" * 100  # its own account still gets it
    assert not _leaked(evil, secret), evil.everything()
    assert all(f"sig={DEST_SIG}" in s.target for s in evil.seen), evil.everything()


def test_a_clients_token_goes_to_no_other_host(container: ContainerHandle, evil: Recorder) -> None:
    """Azurite takes no bearer token over http: the rule is checked where the grant is made, before any request."""
    tokens = _Tokens()

    async def grants() -> None:
        config = blobsync.TransferConfig()
        store = open_store(container.url, config, {}, credential=tokens)
        try:
            with pytest.raises(UsageError, match="s2s-via-client"):
                await store.copy_source("x.bin", None, parse_location(_evil_dest(evil)))
            trusting = open_store(container.url, blobsync.TransferConfig(trusted_suffixes=(evil.host,)), {},
                                  credential=tokens)
            try:
                granted = await trusting.copy_source("x.bin", None, parse_location(_evil_dest(evil)))
            finally:
                await trusting.close()
            assert granted.headers["x-ms-copy-source-authorization"] == f"Bearer {tokens.token}"
        finally:
            await store.close()

    asyncio.run(grants())
    assert not evil.seen


# --- uploads: a file is opened only as the walk listed it ------------------------------------------------------

SWAPS = [(path, swap) for path in [*PATHS, *LIBRARY] for swap in ("link", "file")
         if (path, swap) != ("fsspec", "file")]  # fsspec names files one by one: a new file there is the user's


@pytest.mark.parametrize(("path", "swap"), SWAPS)
def test_a_file_swapped_after_the_walk_is_not_uploaded_on_any_path(
        container: ContainerHandle, proxy: FaultProxy, tmp_path: Path, path: str, swap: str) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"private key material")
    secret.chmod(0o600)
    src = tmp_path / "src"
    random_file(src / "aa.txt", 100, seed=1)
    random_file(src / "zz.txt", 200, seed=2)
    url = f"{proxy.endpoint()}/{container.name}"
    if path == "fsspec":  # a put, one file after the other: the walk is done while the first one is held
        proxy.add_rule(Rule("put_blob", hold(), blob="aa.txt", nth=1))
        proc = start_on(path, "cp", str(src), f"{url}/src", tmp_path / "j.db", url)
    else:  # a sync: the walk is done while the listing of the destination is held
        proxy.add_rule(Rule("list_blobs", hold(), nth=1))
        proc = start_on(path, "sync", str(src), url, tmp_path / "j.db", url)
    try:
        proxy.wait_for_held(1, timeout=60)
        time.sleep(1.0)  # the local walk (two files) is long done
        if swap == "link":
            (src / "zz.txt").unlink()
            os.symlink(secret, src / "zz.txt")
        else:  # made beside it first: another inode for sure (a freed one is often handed out again at once)
            (tmp_path / "other").write_bytes(b"another file, same name, put there after the walk")
            os.replace(tmp_path / "other", src / "zz.txt")
    finally:
        proxy.release_holds()
    code, said = finish(proc)
    assert "private key material" not in said
    if path == "fsspec":  # skipped with a warning, as a link a walk finds
        assert code == 0 and "zz.txt: a symbolic link, skipped" in said, said
        assert container.blob_names() == ["src/aa.txt"]
        assert container.download("src/aa.txt") == (src / "aa.txt").read_bytes()
        return
    assert code == 1, said
    assert f"zz.txt: {'is a symbolic link now' if swap == 'link' else 'is another file than the one listed'}" in \
        said, said
    assert container.blob_names() == ["aa.txt"]
    assert container.download("aa.txt") == (src / "aa.txt").read_bytes()


def test_a_range_task_stages_and_hashes_only_the_file_walked(tmp_path: Path) -> None:
    """A file too big for one shard is staged by range tasks and hashed by another: each opens it as walked."""
    from blobsync.cluster.spec import RangeSpec, WorkerJob
    from blobsync.cluster.split import hash_file
    from blobsync.cluster.work import check_identity
    from blobsync.errors import SourceChangedError
    from blobsync.jobs.ops import FileOp, OpKind

    path = tmp_path / "big.bin"
    path.write_bytes(b"x" * 1000)
    st = path.stat()
    f = FileOp(OpKind.UPLOAD, "big.bin", "big.bin", 1000, st.st_mtime_ns, inode=st.st_ino, nonce="n")
    spec = RangeSpec(WorkerJob("j", True, str(tmp_path), "memory://m/c", {}), f, 1000, 0, 1)
    assert hash_file(spec) == hashlib.md5(b"x" * 1000).hexdigest()
    other = tmp_path / "other"
    other.write_bytes(b"y" * 1000)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, path)
    with pytest.raises(SourceChangedError, match="another file than the one listed"):
        check_identity(path, f)
    with pytest.raises(SourceChangedError):
        hash_file(spec)


@pytest.mark.parametrize("size", [0, 1, 8 * 1024 * 1024, 8 * 1024 * 1024 + 1, 2 * 8 * 1024 * 1024 + 77])
def test_the_hash_task_reads_ahead_and_hashes_every_byte_once_in_order(tmp_path: Path, size: int) -> None:
    """The split upload's hash task reads the next step while it hashes this one, into two buffers in turn."""
    from blobsync.engine.upload import file_md5
    from blobsync.local.files import FileIdentity

    path = tmp_path / "f.bin"
    data = os.urandom(size)
    path.write_bytes(data)
    st = path.stat()
    got = file_md5(path, FileIdentity(size, st.st_mtime_ns, st.st_ino), follow_symlinks=False, root=None)
    assert got == hashlib.md5(data).digest()


# --- sync down with --delete-destination: nothing outside the target is deleted ----------------------------------

@pytest.mark.parametrize("path", [*PATHS, "client"])  # fsspec has no sync
def test_a_delete_never_goes_through_a_folder_swapped_for_a_link(
        container: ContainerHandle, proxy: FaultProxy, tmp_path: Path, path: str) -> None:
    container.client.upload_blob("d/keep.pt", b"keep")
    container.client.upload_blob("z.bin", b"new bytes")
    down, outside = tmp_path / "down", tmp_path / "outside"
    (down / "d").mkdir(parents=True)
    (down / "d" / "keep.pt").write_bytes(b"keep")
    (down / "d" / "stale.pt").write_bytes(b"orphan")
    outside.mkdir()
    (outside / "stale.pt").write_bytes(b"not the sync's to delete")
    proxy.add_rule(Rule("get_blob", hold(), blob="z.bin", nth=1))  # both sides listed, the deletes still to come
    url = f"{proxy.endpoint()}/{container.name}"
    proc = start_on(path, "sync", url, str(down), tmp_path / "j.db", url, delete=True)
    try:
        proxy.wait_for_held(1, timeout=60)
        os.rename(down / "d", tmp_path / "d.old")
        os.symlink("../outside", down / "d")
    finally:
        proxy.release_holds()
    code, said = finish(proc)
    assert (outside / "stale.pt").read_bytes() == b"not the sync's to delete"
    assert code == 1, said
    assert "d: is a symbolic link or not a folder; refusing to delete through it" in said
    assert (down / "z.bin").read_bytes() == container.download("z.bin")


def test_remove_below_unlinks_a_link_itself_and_never_its_target(tmp_path: Path) -> None:
    from blobsync.local.target import remove_below

    (tmp_path / "root" / "d").mkdir(parents=True)
    (tmp_path / "victim").write_bytes(b"v")
    os.symlink(tmp_path / "victim", tmp_path / "root" / "d" / "f.pt")
    for at in (True, False):
        assert remove_below(tmp_path / "root", "d/f.pt", at=at) is (at is True)
    assert (tmp_path / "victim").read_bytes() == b"v"
    assert remove_below(tmp_path / "root", "gone/f.pt") is False


# --- a partial file planted by another user is never adopted ------------------------------------------------------

@pytest.mark.parametrize("path", [*PATHS, *LIBRARY])
def test_a_part_file_of_another_user_is_refused(container: ContainerHandle, tmp_path: Path, path: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file owned by another user")
    container.client.upload_blob("m.pt", b"model bytes" * 1000)
    container.client.upload_blob("ok.pt", b"fine")
    dl = tmp_path / "dl"
    dl.mkdir()
    planted = dl / "m.pt.blobsync-part"
    planted.write_bytes(b"model bytes" * 10)
    planted.chmod(0o666)
    os.chown(planted, 65534, 65534)
    code, said = finish(start_on(path, "cp", f"{container.url}/*", str(dl), tmp_path / "j.db", container.url))
    assert code == 1, said
    assert "m.pt.blobsync-part: belongs to another user (uid 65534); refusing to resume from it" in said
    assert not (dl / "m.pt").exists() and planted.stat().st_uid == 65534
    if path != "fsspec":  # fsspec's get stops at the first file that fails
        assert (dl / "ok.pt").read_bytes() == container.download("ok.pt")


@pytest.mark.parametrize("path", [*PATHS, *LIBRARY])
def test_links_planted_below_a_download_target_get_nothing(container: ContainerHandle, tmp_path: Path,
                                                            path: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"do not touch")
    dl = tmp_path / "dl"
    dl.mkdir()
    os.symlink(outside, dl / "sub")  # a folder link: sub/evil.txt would land outside
    os.symlink(outside / "victim", dl / "victim.txt.blobsync-part")  # a part-file link: written through
    container.client.upload_blob("sub/evil.txt", b"escaped")
    container.client.upload_blob("victim.txt", b"attacker bytes")
    container.client.upload_blob("ok.txt", b"fine")
    code, said = finish(start_on(path, "cp", f"{container.url}/*", str(dl), tmp_path / "j.db", container.url))
    assert code == 1, said
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_bytes() == b"do not touch"
    assert "refusing to write through it" in said
    if path != "fsspec":
        assert (dl / "ok.txt").read_bytes() == container.download("ok.txt")


@pytest.mark.parametrize("path", [*PATHS, *LIBRARY])
def test_a_second_run_onto_a_file_being_written_is_refused(container: ContainerHandle, proxy: FaultProxy,
                                                           tmp_path: Path, path: str) -> None:
    data = random_file(tmp_path / "src.bin", 3 * MiB, seed=5)
    container.client.upload_blob("m.bin", data)
    url = f"{proxy.endpoint()}/{container.name}"
    proxy.add_rule(Rule("get_blob", hold(), blob="m.bin", nth=1))
    first = start_on(path, "cp", f"{url}/*", str(tmp_path / "dl"), tmp_path / "j1.db", url)
    try:
        proxy.wait_for_held(1, timeout=60)
        second = run(["cp", f"{container.url}/m.bin", str(tmp_path / "dl" / "m.bin"), "--journal",
                      str(tmp_path / "j2.db")], env=EMULATOR, timeout=60)
    finally:
        proxy.release_holds()
    code, said = finish(first)
    assert second.returncode == 1, second.stderr
    assert "another blobsync run is writing this file" in second.stdout + second.stderr
    assert code == 0, said
    assert (tmp_path / "dl" / "m.bin").read_bytes() == container.download("m.bin") == data


@pytest.mark.parametrize("path", [*PATHS, *LIBRARY])
def test_no_path_prints_or_journals_a_sas(container: ContainerHandle, azurite: Azurite, tmp_path: Path,
                                          path: str) -> None:
    random_file(tmp_path / "src" / "a.bin", 1000, seed=6)
    sas = container_sas(azurite.account, azurite.key, container.name)
    forged = "&".join(p if not p.startswith("sig=") else "sig=FORGEDforged0123456789%2B%3D" for p in sas.split("&"))
    url = f"{container.url}?{forged}"
    code, said = finish(start_on(path, "cp", str(tmp_path / "src"), url, tmp_path / "j.db", url))
    assert code in (1, 3), said  # refused by the service: the forged signature does not open it
    assert "FORGED" not in said and "forged0123" not in said
    journal = b"".join(p.read_bytes() for p in tmp_path.glob("j.db*"))
    assert b"FORGED" not in journal and b"forged0123" not in journal


# --- times out of any range a journal holds -----------------------------------------------------------------------

FAR_TIMES = ["2300-01-01T00:00:00Z", "9999-12-31T23:59:59.999999999Z", "0001-01-01T00:00:00Z"]


def test_blob_times_out_of_range_are_per_file_fallbacks_not_a_traceback(
        container: ContainerHandle, source: object, dest: object, azurite: Azurite, tmp_path: Path) -> None:
    for i, when in enumerate(FAR_TIMES):
        container.client.upload_blob(f"f{i}.bin", b"far %d" % i, metadata={"mtime": when})
    env = {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}
    other = dest.url(azurite.base_url)  # type: ignore[attr-defined]
    for n, args in enumerate([["cp", "-r", f"{container.url}/*", str(tmp_path / "cp")],
                              ["sync", container.url, str(tmp_path / "sync")],
                              ["sync", container.url, str(tmp_path / "sync")],
                              ["cp", "-r", source.url(azurite.base_url), other],  # type: ignore[attr-defined]
                              ["sync", source.url(azurite.base_url), other]]):  # type: ignore[attr-defined]
        done = run([*args, "--journal", str(tmp_path / f"j{n}.db")], env=env, timeout=120)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stderr)
    for i in range(len(FAR_TIMES)):
        assert (tmp_path / "cp" / f"f{i}.bin").read_bytes() == container.download(f"f{i}.bin")
        assert (tmp_path / "sync" / f"f{i}.bin").read_bytes() == container.download(f"f{i}.bin")
        assert dest.download(f"f{i}.bin") == container.download(f"f{i}.bin")  # type: ignore[attr-defined]


def test_a_local_file_from_year_2300_goes_up_and_comes_back(container: ContainerHandle, tmp_path: Path) -> None:
    src = tmp_path / "src"
    random_file(src / "future.bin", 1000, seed=3)
    far = 10_413_792_000 * 1_000_000_000  # 2300-01-01, past what a 64-bit count of nanoseconds holds
    os.utime(src / "future.bin", ns=(far, far))
    env = {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}
    for n, args in enumerate([["cp", "-r", str(src), container.url], ["sync", str(src), container.url],
                              ["sync", str(src), container.url],
                              ["sync", container.url, str(tmp_path / "back")]]):
        done = run([*args, "--journal", str(tmp_path / f"j{n}.db")], env=env, timeout=120)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stderr)
    assert container.download("src/future.bin") == (src / "future.bin").read_bytes()
    assert container.download("future.bin") == (src / "future.bin").read_bytes()
    assert (tmp_path / "back" / "future.bin").read_bytes() == (src / "future.bin").read_bytes()


# --- click's own messages go through the redaction too ------------------------------------------------------------

CLICK_ERRORS = [
    ["ls", "{url}", "{url}"],  # an extra argument, quoted back
    ["cp", "a", "{url}", "--block-size-mb", "{url}"],  # a bad number
    ["cp", "a", "{url}", "--check-md5", "{url}"],  # a bad choice
    ["rm", "{url}", "{url}"],
]


@pytest.mark.parametrize("args", CLICK_ERRORS, ids=lambda a: a[0] + ":" + a[-1][:12])
def test_clicks_usage_errors_never_print_a_sas(tmp_path: Path, args: list[str]) -> None:
    url = "http://127.0.0.1:9/devstoreaccount1/c?sv=2022-11-02&sp=rl&sig=CLICKSIGclicksig0123%2B%3D"
    line = [a.replace("{url}", url) for a in args]
    done = run(line, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "CLICKSIG" not in done.stderr + done.stdout and "sig=REDACTED" in done.stderr, done.stderr
    script = tmp_path / "cmds.txt"
    script.write_text(" ".join(f"'{a}'" for a in line) + "\n", encoding="utf-8")
    done = run(["run", str(script)], timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "CLICKSIG" not in done.stderr + done.stdout and "sig=REDACTED" in done.stderr, done.stderr


# --- a journal row blobsync did not write is a line, not a traceback ----------------------------------------------

@pytest.mark.parametrize("damage", [
    "update jobs set options = 'not json {'",
    "update jobs set options = '[1, 2]'",
    "update jobs set state = 'exploded'",
    "update jobs set kind = NULL",
    "update files set size = NULL",
    "update files set state = 'sideways'",
    "update files set mtime_ns = 'soon'",
    """update jobs set options = '{"from_a_later_version": 1}'""",  # issue 51: a TypeError from jobs resume
])
def test_a_crafted_journal_row_is_one_line_in_every_jobs_command(
        container: ContainerHandle, tmp_path: Path, damage: str) -> None:
    import sqlite3

    journal = tmp_path / "j.db"
    random_file(tmp_path / "src" / "a.bin", 1000, seed=4)
    env = {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}
    done = run(["cp", "-r", str(tmp_path / "src"), container.url, "--journal", str(journal)], env=env)
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(journal) as conn:
        job = conn.execute("select id from jobs").fetchone()[0]
        if "files" in damage or "later_version" in damage:
            conn.execute("update jobs set state = 'running'")  # resume reads its files and options
        conn.execute(damage)
    for args in (["jobs", "list"], ["jobs", "show", job], ["jobs", "resume", job]):
        done = run([*args, "--journal", str(journal)], env=env, timeout=60)
        assert "Traceback" not in done.stderr, (args, done.stderr)
        # Rows only a resume reads: list (and, for options it does not parse, show) print the job as it is.
        lenient = ("list",) if "files" in damage else ("list", "show") if "later_version" in damage else ()
        if args[1] in lenient:
            assert done.returncode == 0 and job in done.stdout, done.stderr
            continue
        assert done.returncode == (0 if args[1] == "list" else 2), (args, done.stderr)
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "is damaged" in lines[0] and job in lines[0], (args, done.stderr)


# --- a read is of the version and the bytes asked for --------------------------------------------------------------

def _no_md5_blob(container: ContainerHandle, name: str, data: bytes) -> None:
    from azure.storage.blob import ContentSettings

    blob = container.client.get_blob_client(name)
    blob.upload_blob(data, overwrite=True)
    blob.set_http_headers(ContentSettings(content_type="application/octet-stream"))  # no Content-MD5 to catch it
    assert blob.get_blob_properties().content_settings.content_md5 is None


def test_a_server_ignoring_if_match_never_makes_a_file_of_two_versions(
        container: ContainerHandle, proxy: FaultProxy, azurite: Azurite, tmp_path: Path) -> None:
    old, new = b"A" * (12 * MiB), b"B" * (12 * MiB)
    _no_md5_blob(container, "big.bin", old)
    sas = container_sas(azurite.account, azurite.key, container.name)
    proxy.add_rule(Rule("get_blob", forget_if_match(held=True), nth=2))
    proxy.add_rule(Rule("get_blob", forget_if_match()))
    target = tmp_path / "big.bin"
    proc = start(["cp", f"{proxy.endpoint()}/{container.name}/big.bin?{sas}", str(target), "--block-size-mb", "4",
                  "--journal", str(tmp_path / "j.db"), "--max-retries", "1"])
    try:
        proxy.wait_for_held(1, timeout=60)
        _no_md5_blob(container, "big.bin", new)  # the blob changes between two of its ranges
        proxy.release_holds()
        out, err = proc.communicate(timeout=120)
    finally:
        kill_tree(proc.pid)
        proc.communicate()
    assert "Traceback" not in err
    if proc.returncode == 0:  # started over on the new version: then all of it
        assert target.read_bytes() == container.download("big.bin"), "a file mixed from two versions"
    else:
        assert proc.returncode == 1 and not target.exists(), err
        assert "another version than the one asked for" in out + err


def test_an_answer_with_another_range_is_fetched_again(
        container: ContainerHandle, proxy: FaultProxy, azurite: Azurite, tmp_path: Path) -> None:
    data = random_file(tmp_path / "src.bin", 12 * MiB, seed=9)
    _no_md5_blob(container, "big.bin", data)
    sas = container_sas(azurite.account, azurite.key, container.name)
    proxy.add_rule(Rule("get_blob", shift_range(MiB), nth=2))
    target = tmp_path / "big.bin"
    done = run(["cp", f"{proxy.endpoint()}/{container.name}/big.bin?{sas}", str(target), "--block-size-mb", "4",
                "--journal", str(tmp_path / "j.db")], timeout=120)
    assert done.returncode == 0, done.stderr
    assert proxy.stats.faults["get_blob"] == 1
    assert target.read_bytes() == container.download("big.bin") == data


# --- what a run leaves behind, and what a long line costs ----------------------------------------------------------

def test_processes_leave_no_shard_folder_behind(container: ContainerHandle, tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    for i in range(4):
        random_file(tmp_path / "src" / f"f{i}.bin", 1000 + i, seed=i)
    done = run(["cp", "-r", str(tmp_path / "src"), container.url, "--processes", "2", "--journal",
                str(tmp_path / "j.db")], env={"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true",
                                              "TMPDIR": str(scratch)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert list(scratch.iterdir()) == []
    assert container.download("src/f3.bin") == (tmp_path / "src" / "f3.bin").read_bytes()


def test_a_run_file_with_an_endless_line_is_refused_at_once(tmp_path: Path) -> None:
    script = tmp_path / "cmds.txt"
    script.write_text("ls 'memory://m/c'\n" + "cp " + "a" * 1_000_000 + " memory://m/c\n", encoding="utf-8")
    started = time.monotonic()
    done = run(["run", str(script)], timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert ":2: a line of 1,000,016 characters; the limit is 65,536" in done.stderr, done.stderr
    assert time.monotonic() - started < 30


# --- fsspec and the Client: links found by a walk, writers never closed --------------------------------------------

def test_fsspec_put_recursive_skips_links_as_cp_does(container: ContainerHandle, azurite: Azurite,
                                                     tmp_path: Path) -> None:
    from blobsync.fsspec import BlobsyncFileSystem

    secret = tmp_path / "secret"
    secret.write_bytes(b"private key material")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "more.txt").write_bytes(b"outside the folder")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"a")
    (src / "sub" / "b.txt").write_bytes(b"b")
    os.symlink(secret, src / "key.txt")
    os.symlink(tmp_path / "elsewhere", src / "linked")
    fs = BlobsyncFileSystem(azurite.blob_endpoint, config=blobsync.TransferConfig(journal_path=tmp_path / "j.db"),
                            skip_instance_cache=True)
    try:
        fs.put(str(src), f"{container.name}/up", recursive=True)
    finally:
        fs.client.close()
    assert container.blob_names() == ["up/a.txt", "up/sub/b.txt"]
    assert container.download("up/sub/b.txt") == b"b"


def test_a_writer_dropped_without_close_commits_nothing(container: ContainerHandle, tmp_path: Path) -> None:
    import gc
    import warnings

    config = blobsync.TransferConfig(journal_path=tmp_path / "j.db", block_size=4 * MiB)
    with blobsync.Client(container.url, config) as client:
        f = client.open("dropped.bin", "wb")
        f.write(b"x" * (5 * MiB))  # a block staged already
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del f
            gc.collect()
        assert any("dropped without close()" in str(w.message) for w in caught)
        with client.open("kept.bin", "wb") as g:
            g.write(b"y" * 10)
    assert container.blob_names() == ["kept.bin"]
    assert container.download("kept.bin") == b"y" * 10


# --- torn reads (issue 51) ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [*PATHS, *LIBRARY])
def test_a_server_that_names_no_version_gets_no_file_of_two_versions(
        container: ContainerHandle, proxy: FaultProxy, azurite: Azurite, tmp_path: Path, path: str) -> None:
    """No ETag in any answer (headers or listing): a blob read in several ranges could mix two versions, so it is
    refused with one line; a blob read in one request still comes down, its bytes checked with the SDK."""
    big = random_file(tmp_path / "big.src", 12 * MiB, seed=51)
    container.client.upload_blob("big.bin", big)
    container.client.upload_blob("small.bin", b"small and whole")
    proxy.add_rule(Rule(None, drop_etag()))
    sas = container_sas(azurite.account, azurite.key, container.name)
    url = f"{proxy.endpoint()}/{container.name}?{sas}"
    src = f"{proxy.endpoint()}/{container.name}/*?{sas}"
    dl = tmp_path / "dl"
    dl.mkdir()
    proc = start_on(path, "cp", src, str(dl), tmp_path / "j.db", url) if path in LIBRARY else \
        start(["cp", src, str(dl), "--recursive", "--block-size-mb", "4", "--journal", str(tmp_path / "j.db"),
               *PATHS[path]], EMULATOR)
    code, said = finish(proc)
    assert code in (1, 4), said
    assert "named no version (ETag)" in said and "Traceback" not in said, said
    assert not (dl / "big.bin").exists()
    if path != "fsspec":  # fsspec's get stops at the first file that fails
        assert (dl / "small.bin").read_bytes() == container.download("small.bin")


def test_a_client_read_of_a_blob_without_a_version_is_one_request_or_refused(
        container: ContainerHandle, proxy: FaultProxy, azurite: Azurite) -> None:
    data = os.urandom(10 * MiB)
    container.client.upload_blob("x.bin", data)
    proxy.add_rule(Rule(None, drop_etag()))
    sas = container_sas(azurite.account, azurite.key, container.name)
    config = blobsync.TransferConfig(block_size=4 * MiB)
    with blobsync.Client(f"{proxy.endpoint()}/{container.name}?{sas}", config) as client:
        proxy.reset_stats()
        assert bytes(client.read_into("x.bin", bytearray(len(data)))) == data
        assert proxy.stats.ok("get_blob") == 1  # no version to pin the ranges to: all of it in one GET
        proxy.reset_stats()
        assert client.get("x.bin") == data == container.download("x.bin")
        with pytest.raises(blobsync.errors.UnpinnedReadError, match="named no version"):
            client.open("x.bin").read()


# --- a Client's credential on its workers (issue 51) --------------------------------------------------------------

@pytest.mark.parametrize("cluster", [None, "processes:2", "local:2"])
def test_workers_sign_with_the_clients_credential_never_the_environments(
        container: ContainerHandle, azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        cluster: str | None) -> None:
    """A Client given a read-only SAS cannot write through its workers: they sign with that SAS, not with the
    account key the workers' environment holds."""
    from datetime import UTC, datetime, timedelta

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    read_only = generate_container_sas(azurite.account, container.name, account_key=azurite.key,
                                       expiry=datetime.now(UTC) + timedelta(hours=1),
                                       permission=ContainerSasPermissions(read=True, list=True))
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)  # the key, on every worker
    for i in range(2):
        random_file(tmp_path / "src" / f"f{i}.bin", 1000 + i, seed=i)
    config = blobsync.TransferConfig(journal_path=tmp_path / "j.db", max_retries=0, recursive=True)
    with blobsync.Client(container.url, config, credential=read_only) as client, \
            pytest.raises(blobsync.errors.AuthError, match="lacks 'w'"):
        client.copy(str(tmp_path / "src"), client.url_for("up"), cluster=cluster)
    assert container.blob_names() == []


def test_a_credential_that_cannot_travel_to_workers_is_refused(container: ContainerHandle, tmp_path: Path) -> None:
    class Local:  # a credential object bound to this process (a lock: it does not pickle)
        lock = __import__("threading").Lock()

        def __reduce__(self) -> tuple[object, ...]:
            raise TypeError("cannot pickle")

        def get_token(self, *scopes: str, **kwargs: object) -> SimpleNamespace:
            return SimpleNamespace(token="t", expires_on=2**40)

    random_file(tmp_path / "src" / "a.bin", 100, seed=1)
    config = blobsync.TransferConfig(journal_path=tmp_path / "j.db", recursive=True)
    with blobsync.Client(container.url, config, credential=Local()) as client, \
            pytest.raises(UsageError, match=r"credential .* cannot be sent to the workers"):
        client.copy(str(tmp_path / "src"), client.url_for("up"), cluster="processes:2")


# --- secrets in reprs and pickles (issue 51) ----------------------------------------------------------------------

def _fresh_sas() -> str:  # a credential factory: pickles by name, never by what it returns
    return "sv=2022-11-02&sp=r&sig=FACTORYsecret0123456789"


def test_no_repr_shows_a_secret_and_a_factory_keeps_it_out_of_a_pickle(container: ContainerHandle) -> None:
    import pickle

    from blobsync.cluster.spec import WorkerJob

    config = blobsync.TransferConfig(proxy="http://user:PROXYpass0123@127.0.0.1:3128")
    assert "PROXYpass0123" not in repr(config) and "REDACTED" in repr(config)
    job = WorkerJob("j", True, "/x", f"{container.url}?sv=1&sig=URLsecret0123456", {}, topic="t",
                    source_url="https://a/b?sig=SRCsecret0123456", credential="sv=1&sig=CREDsecret0123456")
    assert "secret0123456" not in repr(job)
    with blobsync.Client(container.url, credential=_fresh_sas) as client:
        assert b"FACTORYsecret" not in pickle.dumps(client)
        assert "FACTORYsecret" not in repr(client)


# --- the folder cp -r adds to the destination (issue 51) ----------------------------------------------------------

@pytest.mark.parametrize("level", ["prefix", "container"])
@pytest.mark.parametrize("path", [*PATHS, *LIBRARY])
def test_a_link_planted_at_the_folder_cp_r_adds_gets_nothing(container: ContainerHandle, tmp_path: Path, path: str,
                                                            level: str) -> None:
    """`cp -r <container>/d T` makes T/d (and `cp -r <container> T` makes T/<container>): a link planted there
    before the run was followed and the files landed in the folder it names."""
    target, victim = tmp_path / "T", tmp_path / "V"
    target.mkdir()
    victim.mkdir()
    name = "d" if level == "prefix" else container.name
    os.symlink(victim, target / name)
    container.client.upload_blob("d/a.txt", b"attacker bytes")
    src = f"{container.url}/d" if level == "prefix" else container.url
    code, said = finish(start_on(path, "cp", src, str(target), tmp_path / "j.db", container.url))
    assert list(victim.iterdir()) == [], said
    if (path, level) == ("fsspec", "container"):  # fsspec's get of a whole container puts its blobs into T itself
        assert code == 0 and (target / "d" / "a.txt").read_bytes() == container.download("d/a.txt"), said
        return
    assert code != 0 and "symbolic link" in said and "Traceback" not in said, said


@pytest.mark.parametrize("path", [*PATHS, *LIBRARY])
def test_a_fifo_at_a_download_target_is_refused_not_replaced(container: ContainerHandle, tmp_path: Path,
                                                             path: str) -> None:
    """A download onto a FIFO (or a device: as root, `cp URL /dev/null`) replaced it with a regular file."""
    dl = tmp_path / "dl"
    dl.mkdir()
    os.mkfifo(dl / "x.bin")
    container.client.upload_blob("x.bin", b"bytes for a fifo")
    code, said = finish(start_on(path, "cp", f"{container.url}/*", str(dl), tmp_path / "j.db", container.url))
    assert code != 0 and "is a device, a FIFO or a socket" in said, said
    assert stat.S_ISFIFO(os.lstat(dl / "x.bin").st_mode)
    assert not (dl / "x.bin.blobsync-part").exists()


def test_a_refused_cluster_copy_is_one_line(container: ContainerHandle, azurite: Azurite, tmp_path: Path) -> None:
    """Issue 51: Dask's "Compute Failed" and a traceback (22 lines) came before the final line."""
    from datetime import UTC, datetime, timedelta

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    read_only = generate_container_sas(azurite.account, container.name, account_key=azurite.key,
                                       expiry=datetime.now(UTC) + timedelta(hours=1),
                                       permission=ContainerSasPermissions(read=True, list=True))
    random_file(tmp_path / "src" / "a.bin", 1000, seed=3)
    done = run(["cp", str(tmp_path / "src"), f"{container.url}?{read_only}", "--recursive", "--cluster", "local:2",
                "--journal", str(tmp_path / "j.db"), "--max-retries", "0"], env={}, timeout=180)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 3 and len(lines) == 1 and "lacks 'w'" in lines[0], done.stderr
