"""Start-up stays light: the CLI (and `import blobsync`) load only what a sync needs before its first request."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import blobsync

# Loaded on first use only: a no-op sync never needs them (see blobsync/__init__.py and api.py).
NOT_AT_START = ("blobsync.backends.azure.doctor", "blobsync.jobs.watch", "watchfiles", "blobsync.jobs.remove",
                "blobsync.engine.download", "blobsync.engine.upload", "blobsync.jobs.transfer", "blobsync.jobs.put",
                "xml.etree.ElementTree", "email.utils", "aiohttp", "tenacity",
                "blobsync.cluster.processes", "multiprocessing", "re2")


def _loaded_after(statement: str) -> set[str]:
    src = str(Path(blobsync.__file__).resolve().parents[1])  # the blobsync under test, wherever it lives
    code = f"import sys\n{statement}\nprint('\\n'.join(sys.modules))"
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_cli_import_leaves_the_rest_for_later() -> None:
    loaded = _loaded_after("import blobsync.cli.main")
    assert "blobsync.jobs.sync" in loaded  # sanity: the check sees blobsync's own modules
    assert loaded.isdisjoint(NOT_AT_START), sorted(loaded & set(NOT_AT_START))


def test_public_names_still_load_on_use() -> None:
    loaded = _loaded_after("import blobsync\nassert blobsync.Diagnosis.__name__ == 'Diagnosis'\n"
                           "from blobsync import aio, sync, watch\nassert aio.diagnose and sync and watch")
    assert {"blobsync.backends.diagnosis", "blobsync.api", "blobsync.aio"} <= loaded
    assert sorted(dir(blobsync)) == sorted(blobsync.__all__)


def test_a_transfer_journals_without_sqlite_utils(tmp_path: Path) -> None:
    # Its import costs ~45 ms of every transfer's start-up; only the `jobs` commands need its query helpers.
    statement = (
        "from blobsync.journal import Journal\n"
        f"j = Journal({str(tmp_path / 'journal.db')!r})\n"
        "job = j.create_job('upload', 'src', 'dst', {})\n"
        "rows = j.add_files(job.id, [('a', 'a', 1, 2, 3)])\n"
        "j.block_done(rows['a'].id, 0, 1, '00')\n"
        "j.flush()\n"
        "assert [b.idx for b in j.blocks(rows['a'].id)] == [0]\n"
        "assert j.find_unfinished_job('upload', 'src', 'dst') == j.get_job(job.id[:6]) and j.job_cap(job.id) is None\n"
        "assert 'sqlite_utils' not in sys.modules\n"
        "from blobsync.journal.jobs import JobBook\n"
        "book = JobBook(j)\n"
        "assert [s.id for s in book.list_jobs()] == [job.id] and book.job_totals(job.id)['pending']['files'] == 1\n"
    )
    assert "sqlite_utils" in _loaded_after(statement)


def test_the_command_keeps_freed_heap_memory_and_the_library_leaves_the_allocator_alone() -> None:
    """cli.entry tunes glibc's malloc (a download's bodies were faulted in afresh: 195,000 minor faults per GiB), and
    only the command: importing blobsync leaves its host's allocator as it was. mallopt says whether it took each."""
    from blobsync.local import platform

    code = ("import sys, blobsync.local.platform as p\n"
            "print(p.tune_malloc())")
    env = {**os.environ, "PYTHONPATH": str(Path(blobsync.__file__).resolve().parents[1])}
    took = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    glibc = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION") is not None
    assert took.strip() == str(glibc)
    env["BLOBSYNC_PORTABLE_IO"] = "1"  # the portable paths: no Linux-only tuning
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
    entry = (Path(platform.__file__).parents[1] / "cli" / "entry.py").read_text(encoding="utf-8")
    assert "tune_malloc()" in entry
    assert "tune_malloc" not in (Path(blobsync.__file__).parent / "__init__.py").read_text(encoding="utf-8")
