"""What a planted link or a second process on the same machine can no longer do to a download or an upload
(issue 26, points 2-4): every case against Azurite, the bytes checked with an SDK download."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blobsync.config import MiB
from blobsync.errors import TargetBusyError, UnsafeTargetError
from blobsync.local.target import PartFile, open_folder
from conftest import ContainerHandle
from support.cli import random_file, run, start
from support.proxy import FaultProxy, Rule, hold


def _down(url: str, dest: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["cp", "-r", f"{url}/*", str(dest), "--journal", str(tmp_path / "j.db"), *extra]


def test_a_planted_part_file_link_gets_nothing_and_the_file_fails_with_a_line(
        container: ContainerHandle, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"do not touch")
    dl = tmp_path / "dl"
    dl.mkdir()
    os.symlink(outside / "victim", dl / "victim.txt.blobsync-part")
    container.client.upload_blob("victim.txt", b"attacker bytes")
    container.client.upload_blob("other.txt", b"fine")
    done = run(_down(container.url, dl, tmp_path))
    assert done.returncode == 1, done.stderr
    assert (outside / "victim").read_bytes() == b"do not touch"
    assert "victim.txt.blobsync-part: is a symbolic link; refusing to write through it" in done.stdout + done.stderr
    assert (dl / "other.txt").read_bytes() == container.download("other.txt")
    assert not (dl / "victim.txt").exists()


def test_a_planted_folder_link_keeps_the_blob_inside_the_target(container: ContainerHandle, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dl = tmp_path / "dl"
    dl.mkdir()
    os.symlink(outside, dl / "sub")
    container.client.upload_blob("sub/evil.txt", b"escaped")
    container.client.upload_blob("ok.txt", b"fine")
    for command in (_down(container.url, dl, tmp_path),
                    ["sync", container.url, str(dl), "--journal", str(tmp_path / "j2.db")]):
        done = run(command)
        assert done.returncode == 1, done.stderr
        assert list(outside.iterdir()) == []
        assert "sub: is a symbolic link or not a folder; refusing to write through it" in done.stdout + done.stderr
    assert (dl / "ok.txt").read_bytes() == container.download("ok.txt")


def test_a_link_given_as_the_target_root_is_the_users_and_is_followed(
        container: ContainerHandle, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "dl")
    container.client.upload_blob("a/b.txt", b"bytes")
    done = run(_down(container.url, tmp_path / "dl", tmp_path))
    assert done.returncode == 0, done.stderr
    assert (real / "a" / "b.txt").read_bytes() == container.download("a/b.txt")


def test_a_second_run_onto_the_same_file_is_refused_and_the_first_lands_whole(
        container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    data = random_file(tmp_path / "seed.bin", 6 * MiB, seed=4)
    container.client.upload_blob("big.bin", data)
    dl = tmp_path / "dl"
    proxy.add_rule(Rule("get_blob", hold(), nth=3))  # the first run holds its third range, its part file open
    first = start(["sync", f"{proxy.endpoint()}/{container.name}", str(dl), "--block-size-mb", "1",
                   "--concurrency", "2", "--journal", str(tmp_path / "j1.db")])
    try:
        proxy.wait_for_held(1, timeout=60)
        second = run(["cp", f"{container.url}/big.bin", str(dl / "big.bin"), "--block-size-mb", "1",
                      "--journal", str(tmp_path / "j2.db")])
        assert second.returncode == 1, second.stderr
        assert "another blobsync run is writing this file" in second.stdout + second.stderr
        proxy.release_holds()
        _, err = first.communicate(timeout=120)
    finally:
        first.kill()
        first.communicate()
    assert first.returncode == 0, err
    assert (dl / "big.bin").read_bytes() == container.download("big.bin") == data
    again = run(["sync", container.url, str(dl), "--journal", str(tmp_path / "j1.db")])
    assert again.returncode == 0 and (dl / "big.bin").read_bytes() == data


def test_part_file_refuses_a_lock_held_elsewhere_and_a_swap_before_the_rename(tmp_path: Path) -> None:
    target = tmp_path / "t.bin"
    first = PartFile(target, 10, keep=False)
    with pytest.raises(TargetBusyError):
        PartFile(target, 10, keep=False)
    first.write_view(memoryview(b"0123456789"), 0)
    os.replace(tmp_path / "t.bin.blobsync-part", tmp_path / "moved")
    (tmp_path / "t.bin.blobsync-part").write_bytes(b"someone else")
    with pytest.raises(TargetBusyError):
        first.finish(None)
    assert not target.exists()


def test_part_file_refuses_a_hard_link(tmp_path: Path) -> None:
    (tmp_path / "victim").write_bytes(b"keep")
    os.link(tmp_path / "victim", tmp_path / "t.bin.blobsync-part")
    with pytest.raises(UnsafeTargetError):
        PartFile(tmp_path / "t.bin", 4, keep=False)
    assert (tmp_path / "victim").read_bytes() == b"keep"


@pytest.mark.parametrize("at", [True, False])
def test_folders_are_made_without_following_links_either_way(tmp_path: Path, at: bool) -> None:
    os.symlink(tmp_path, tmp_path / "loop")
    with pytest.raises(UnsafeTargetError):
        open_folder(tmp_path, ("loop", "x"), at=at)
    fd = open_folder(tmp_path, ("a", "b"), at=at)
    assert (tmp_path / "a" / "b").is_dir()
    if fd is not None:
        os.close(fd)


def test_the_probe_reads_this_file_system_and_leaves_nothing(tmp_path: Path) -> None:
    from blobsync.local.folding import Folding, probe

    assert probe(tmp_path, {}) == Folding(False, False)  # Linux file systems here keep every name apart
    assert list(tmp_path.iterdir()) == []
    assert probe(tmp_path, {"BLOBSYNC_NAME_FOLDING": "case,unicode"}) == Folding(True, True)


@pytest.mark.parametrize("command", ["cp", "sync"])
def test_two_blobs_one_local_name_fail_one_with_a_line_instead_of_overwriting(
        container: ContainerHandle, tmp_path: Path, command: str) -> None:
    """What a case-insensitive, normalising file system (macOS, Windows) makes of A.txt/a.txt and NFC/NFD names;
    this kernel has none, so the probe's answer is given (BLOBSYNC_NAME_FOLDING)."""
    container.client.upload_blob("A.txt", b"upper")
    container.client.upload_blob("a.txt", b"lower")
    container.client.upload_blob("caf\u00e9.txt", b"nfc")
    container.client.upload_blob("cafe\u0301.txt", b"nfd")
    dl = tmp_path / "dl"
    args = _down(container.url, dl, tmp_path) if command == "cp" else \
        ["sync", container.url, str(dl), "--journal", str(tmp_path / "j.db")]
    done = run(args, env={"BLOBSYNC_NAME_FOLDING": "case,unicode"})
    assert done.returncode == 1, done.stderr
    said = done.stdout + done.stderr
    assert "'a.txt' and 'A.txt' are one file name here (this file system ignores case and normalises Unicode)" \
        in said
    assert "are one file name here" in said.split("a.txt' and 'A.txt'")[1]  # the NFC/NFD pair too
    assert sorted(p.name for p in dl.iterdir()) == sorted(["A.txt", "cafe\u0301.txt"])
    assert (dl / "A.txt").read_bytes() == container.download("A.txt")


def test_a_file_replaced_after_the_walk_is_refused(tmp_path: Path) -> None:
    from blobsync.errors import SourceChangedError
    from blobsync.local.files import OpenFile

    path = tmp_path / "f"
    path.write_bytes(b"one")
    listed = path.stat().st_ino
    (tmp_path / "other").write_bytes(b"two")
    os.replace(tmp_path / "other", path)
    with pytest.raises(SourceChangedError, match="another file than the one listed"):
        OpenFile(path, walked=listed, follow_symlinks=False)
    OpenFile(path, walked=path.stat().st_ino, follow_symlinks=False).close()


def test_blobsyncs_own_files_are_the_users_alone(container: ContainerHandle, tmp_path: Path) -> None:
    import stat

    (tmp_path / "f").write_bytes(b"x")
    journal = tmp_path / "state" / "deep" / "j.db"
    log = tmp_path / "run.log"
    done = run(["cp", str(tmp_path / "f"), container.url, "--journal", str(journal), "--log-file", str(log),
                "--log-level", "INFO"])
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600
    assert stat.S_IMODE(journal.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    for extra in journal.parent.glob("j.db-*"):  # SQLite's WAL and shared memory take the database's mode
        assert stat.S_IMODE(extra.stat().st_mode) & 0o077 == 0, extra


def test_the_log_file_follows_no_link_and_is_never_another_users(container: ContainerHandle, tmp_path: Path) -> None:
    """Issue 51: --log-file followed a planted link and appended to another user's 0666 file."""
    import stat

    (tmp_path / "f").write_bytes(b"x")
    theirs = tmp_path / "theirs.log"
    theirs.write_text("their log\n")
    os.chmod(theirs, 0o666)
    base = ["cp", str(tmp_path / "f"), container.url, "--journal", str(tmp_path / "j.db"), "--log-level", "INFO",
            "--overwrite", "true", "--log-file"]
    os.symlink(theirs, tmp_path / "planted.log")
    done = run([*base, str(tmp_path / "planted.log")])
    assert done.returncode == 2 and "symbolic link" in done.stderr and "Traceback" not in done.stderr, done.stderr
    if os.geteuid() == 0:  # another user's file: only root can make one here
        os.chown(theirs, 65534, 65534)
        done = run([*base, str(theirs)])
        assert done.returncode == 2 and "not a regular file of this user's" in done.stderr, done.stderr
        os.chown(theirs, 0, 0)
    assert theirs.read_text() == "their log\n"
    done = run([*base, str(theirs)])  # the user's own, too open: used, and made 0600
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o600 and theirs.read_text().startswith("their log\n")


def test_worker_shard_journals_live_in_a_private_folder_of_their_own() -> None:
    import stat
    import tempfile

    from blobsync.cluster import work

    with work.SHARD_FOLDER.used() as folder, work.SHARD_FOLDER.used() as again:
        assert again == folder and folder.parent == Path(tempfile.gettempdir())
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()
        assert folder.name != f"blobsync-shards-{os.getuid()}"  # not a name another user could create first
    assert not folder.exists()  # removed once no task uses it


def test_a_folder_swapped_for_a_link_after_the_walk_is_not_read_through(tmp_path: Path) -> None:
    """Issue 51: the walk's check was the inode number alone, and the folders on the way were followed: with the
    parent folder swapped for a link to a folder holding a file of the same identity, the open went through it.
    Now each folder below the root is opened without following links, on every path (OpenFile is under all)."""
    from blobsync.errors import SourceChangedError
    from blobsync.local.files import OpenFile

    root = tmp_path / "src"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.bin").write_bytes(b"listed")
    walked = (root / "sub" / "a.bin").stat().st_ino
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.link(root / "sub" / "a.bin", elsewhere / "a.bin")  # the same inode, reached through another folder
    (root / "sub").rename(tmp_path / "moved")
    os.symlink(elsewhere, root / "sub")
    with pytest.raises(SourceChangedError, match="symbolic link"):
        OpenFile(root / "sub" / "a.bin", walked=walked, follow_symlinks=False, root=root)
    opened = OpenFile(root / "sub" / "a.bin", walked=walked, follow_symlinks=True, root=root)  # the user's choice
    opened.close()
