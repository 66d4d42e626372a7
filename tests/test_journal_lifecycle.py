"""The journal of a long-lived process (issue 38, point 7): puts of data in memory that can never resume, resumes
of finished jobs, what list_jobs() returns, and dry runs, against Azurite."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import blobsync
from conftest import ContainerHandle
from support.cli import clean_env, random_file, run
from support.processes import kill_tree
from support.proxy import FaultProxy

EMULATOR = {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"}


def test_a_killed_put_of_memory_is_abandoned_not_resumable(container: ContainerHandle, proxy: FaultProxy,
                                                           tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    code = textwrap.dedent(f"""
        import blobsync
        config = blobsync.TransferConfig(journal_path={str(journal)!r}, block_size=4 * 1024 * 1024)
        with blobsync.Client({proxy.endpoint() + '/' + container.name!r}, config) as client:
            client.put(b"m" * (40 * 1024 * 1024), "big.bin")
    """)
    proxy.hold_after("put_block", 2)
    proc = subprocess.Popen([sys.executable, "-c", code], env=clean_env(EMULATOR), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        proxy.wait_for_held(1, timeout=60)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        kill_tree(proc.pid)
        proxy.release_holds()
    listed = run(["jobs", "list", "--journal", str(journal)], env=EMULATOR)
    assert listed.returncode == 0 and " abandoned " in listed.stdout, listed.stdout
    job = listed.stdout.split()[0]
    resumed = run(["jobs", "resume", job, "--journal", str(journal)], env=EMULATOR)
    assert resumed.returncode == 2, resumed.stderr
    assert "held in memory" in resumed.stderr and "nothing is left to resume" in resumed.stderr
    assert "does not exist" not in resumed.stderr
    cleaned = run(["jobs", "clean", "--journal", str(journal)], env=EMULATOR)
    assert "removed 1 job(s)" in cleaned.stdout, cleaned.stdout
    assert container.blob_names() == []


def test_resume_of_a_done_job_is_a_no_op_that_says_so(container: ContainerHandle, tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    random_file(tmp_path / "src" / "a.bin", 1000, seed=1)
    config = blobsync.TransferConfig(journal_path=journal, recursive=True)
    report = blobsync.copy(str(tmp_path / "src"), container.url, config, env=EMULATOR)
    assert report.files_transferred == 1
    jobs = blobsync.list_jobs(journal)
    again = blobsync.resume(jobs[0], journal_path=journal, env=EMULATOR)  # what list_jobs() returns is taken
    assert again.job_id == report.job_id and again.files_transferred == 0 and again.ok
    assert blobsync.show_job(jobs[0].job, journal)[0].job.id == report.job_id
    done = run(["jobs", "resume", report.job_id, "--journal", str(journal)], env=EMULATOR)
    assert done.returncode == 0 and "already done: nothing to resume" in done.stdout, done.stderr
    assert container.download("src/a.bin") == (tmp_path / "src" / "a.bin").read_bytes()


def test_a_dry_run_counts_what_it_would_move_as_planned(container: ContainerHandle, tmp_path: Path) -> None:
    for i in range(3):
        random_file(tmp_path / "src" / f"f{i}.bin", 100 * (i + 1), seed=i)
    config = blobsync.TransferConfig(journal_path=tmp_path / "j.db", recursive=True)
    up = blobsync.copy(str(tmp_path / "src"), container.url, config, env=EMULATOR, dry_run=True)
    synced = blobsync.sync(str(tmp_path / "src"), container.url, config, env=EMULATOR, dry_run=True)
    for report in (up, synced):
        assert (report.files_transferred, report.bytes_transferred) == (0, 0)
        assert (report.files_planned, report.bytes_planned) == (3, 600)
    assert container.blob_names() == []
    done = run(["cp", "-r", str(tmp_path / "src"), container.url, "--dry-run", "--journal", str(tmp_path / "j.db")],
               env=EMULATOR)
    assert done.returncode == 0 and "Dry run: 3 to upload" in done.stdout, done.stdout


def test_the_overwrite_question_is_what_the_docs_say(container: ContainerHandle, tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    for name in ("last.pt", "other.pt"):
        (tmp_path / "ckpt" / name).write_bytes(b"new " + name.encode())
        container.client.upload_blob(f"ckpt/{name}", b"old")
    asked: list[str] = []

    def answer(question: str) -> blobsync.Answer:
        asked.append(question)
        return blobsync.Answer.YES if "last.pt'" in question else blobsync.Answer.NO

    config = blobsync.TransferConfig(journal_path=tmp_path / "j.db", recursive=True,
                                     overwrite=blobsync.Overwrite.PROMPT)
    blobsync.copy(str(tmp_path / "ckpt"), container.url, config, env=EMULATOR, confirm_overwrite=answer)
    assert sorted(asked) == ["blob 'ckpt/last.pt' exists (3 bytes)", "blob 'ckpt/other.pt' exists (3 bytes)"]
    assert container.download("ckpt/last.pt") == b"new last.pt" and container.download("ckpt/other.pt") == b"old"
