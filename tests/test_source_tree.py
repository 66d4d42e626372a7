"""Source trees as users have them: symlink loops, odd names, files rewritten with their times put back."""

from __future__ import annotations

import os
from pathlib import Path

from blobsync.config import MiB
from conftest import ContainerHandle
from support.cli import kill_when_held, random_file, run, start
from support.proxy import FaultProxy


def _rewrite_keeping_times(path: Path, seed: int) -> bytes:
    """Rewrite a file in place with new bytes of the same size, then put its times back (rsync --times, cp -p)."""
    st = path.stat()
    data = random_file(path, st.st_size, seed=seed)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size
    return data


def _six_mib_upload(container: ContainerHandle, proxy: FaultProxy, tmp_path: Path, seed: int
                    ) -> tuple[Path, list[str]]:
    path = tmp_path / "f.bin"
    random_file(path, 6 * MiB, seed=seed)
    url = f"{proxy.endpoint()}/{container.name}/f.bin"
    return path, ["cp", str(path), url, "--journal", str(tmp_path / "j.db"), "--block-size-mb", "1",
                  "--concurrency", "2", "--quiet"]


def test_follow_symlinks_through_loops_ends_and_uploads_the_rest(container: ContainerHandle, tmp_path: Path) -> None:
    src = tmp_path / "src"
    data = {rel: random_file(src / rel, 100 + i, seed=i) for i, rel in enumerate(["top.bin", "a/x.bin", "b/y.bin"])}
    os.symlink("..", src / "a" / "up")  # two links back to the root: exponential without loop detection
    os.symlink(".", src / "a" / "here")
    os.symlink("../b", src / "a" / "to_b")  # not a loop: followed
    done = run(["cp", "-r", "--as-subdir=false", str(src), container.url, "--follow-symlinks",
                "--journal", str(tmp_path / "j.db")],
               timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "makes a loop" in done.stdout + done.stderr and "a/up" in done.stdout + done.stderr
    assert container.blob_names() == ["a/to_b/y.bin", "a/x.bin", "b/y.bin", "top.bin"]
    for rel, blob in data.items():
        assert container.download(rel) == blob


def test_a_name_that_is_not_utf8_is_skipped_with_a_clear_line_and_the_rest_goes(container: ContainerHandle,
                                                                                tmp_path: Path) -> None:
    src = tmp_path / "src"
    good = random_file(src / "good.bin", 10, seed=1)
    with open(os.path.join(os.fsencode(src), b"\xff\xfe.txt"), "wb") as f:
        f.write(b"z")
    done = run(["cp", "-r", "--as-subdir=false", str(src), container.url, "--journal", str(tmp_path / "j.db")])
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    out = done.stdout + done.stderr
    assert "\\xff\\xfe.txt" in out and "not valid UTF-8" in out
    assert container.blob_names() == ["good.bin"] and container.download("good.bin") == good


def test_names_with_control_characters_are_printed_escaped(container: ContainerHandle, tmp_path: Path) -> None:
    src = tmp_path / "src"
    random_file(src / "ok.bin", 10, seed=1)
    random_file(src / "bad\nname.bin", 10, seed=2)
    done = run(["cp", "-r", "--as-subdir=false", str(src), container.url, "--journal", str(tmp_path / "j.db")])
    assert done.returncode == 1
    out = done.stdout + done.stderr
    assert "bad\\nname.bin" in out
    assert not any(line.startswith("name.bin") for line in out.splitlines()), out


def test_a_backslash_name_syncs_once_and_a_second_sync_with_deletes_is_a_no_op(container: ContainerHandle,
                                                                               tmp_path: Path) -> None:
    src = tmp_path / "src"
    data = random_file(src / "a\\b.txt", 10, seed=3)
    args = ["sync", str(src), container.url, "--delete-destination", "true", "--journal", str(tmp_path / "j.db")]
    first = run(args)
    assert first.returncode == 0, first.stderr
    assert container.blob_names() == ["a/b.txt"]  # the service stores '\' as '/'
    again = run(args)
    assert again.returncode == 0, (again.stdout, again.stderr)
    assert "Nothing to do: 1 file(s) already in sync" in again.stdout
    assert container.download("a/b.txt") == data


def test_a_backslash_name_that_collides_with_a_real_path_is_refused(container: ContainerHandle,
                                                                    tmp_path: Path) -> None:
    src = tmp_path / "src"
    random_file(src / "a\\b.txt", 10, seed=3)
    real = random_file(src / "a" / "b.txt", 12, seed=4)
    done = run(["cp", "-r", "--as-subdir=false", str(src), container.url, "--journal", str(tmp_path / "j.db")])
    assert done.returncode == 1
    assert "both would be the same blob" in done.stdout + done.stderr
    assert container.blob_names() == ["a/b.txt"] and container.download("a/b.txt") == real


def test_a_file_rewritten_with_its_times_put_back_during_the_upload_is_not_committed(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    path, args = _six_mib_upload(container, proxy, tmp_path, seed=5)
    proxy.hold_after("put_block", 2)
    proc = start(args)
    try:
        proxy.wait_for_held(1, timeout=60)
        new = _rewrite_keeping_times(path, seed=6)
        proxy.clear_rules()
        proxy.release_holds()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1, err
    assert "changed" in err
    assert container.blob_names() == []
    again = run(args)
    assert again.returncode == 0, again.stderr
    assert container.download("f.bin") == new


def test_a_file_rewritten_with_its_times_put_back_between_a_kill_and_the_rerun_is_sent_whole(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    path, args = _six_mib_upload(container, proxy, tmp_path, seed=7)
    proxy.hold_after("put_block", 3)
    kill_when_held(args, proxy)
    new = _rewrite_keeping_times(path, seed=8)
    proxy.reset_stats()
    again = run(args)
    assert again.returncode == 0, again.stderr
    assert proxy.stats.bytes_in["put_block"] == 6 * MiB  # nothing of the old version was reused
    assert container.download("f.bin") == new
