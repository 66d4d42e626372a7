"""`blobsync run FILE` (issue 30, part 5): many commands, one per line, in one process and one session: uploads,
a blob-to-blob copy, a sync, a listing and a removal; JSON lines per command; the exit code the worst of them;
a line that may not run refused before anything runs. Every blob checked with an SDK download."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import ContainerHandle, Side
from support.azurite import Azurite
from support.cli import run


def test_a_file_of_commands_runs_in_one_process_and_reports_the_worst_exit_code(
        azurite: Azurite, source: Side, dest: Side, tmp_path: Path) -> None:
    ep = azurite.base_url
    files = {f"f{i}.bin": os.urandom(500 + i) for i in range(30)}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "t.txt").write_bytes(b"tree")
    lines = [f'cp "{tmp_path / name}" "{source.url(ep, "up/" + name)}"' for name in files]
    lines += ["# a comment, then a blank line", "",
              f'blobsync cp -r "{source.url(ep, "up")}" "{dest.url(ep, "copied")}"',
              f'sync "{tmp_path / "tree"}" "{source.url(ep, "tree")}"',
              f'rm "{source.url(ep, "up/f0.bin")}"',
              f'ls "{source.url(ep, "tree")}"',
              f'cp "{tmp_path / "no-such-file"}" "{source.url(ep)}"']
    script = tmp_path / "commands.txt"
    script.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = run(["run", str(script), "--journal", str(tmp_path / "j.db"), "--output-type", "json"])
    assert out.returncode == 2, out.stderr  # the last line's usage error is the worst
    records = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    ran = [r for r in records if r.get("type") == "run"]
    assert [r["exit_code"] for r in ran] == [0] * 34 + [2] and ran[-1]["line"] == len(lines)
    assert "does not exist" in out.stderr and "Traceback" not in out.stderr
    for name, data in files.items():
        assert dest.download(f"copied/up/{name}") == data  # copied before the rm on a later line
    names = sorted(b.name for b in source.client.list_blobs())
    assert "up/f0.bin" not in names and "up/f1.bin" in names
    assert source.download("tree/t.txt") == b"tree"


def test_a_line_that_may_not_run_is_refused_before_any_runs(container: ContainerHandle, azurite: Azurite,
                                                            tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"a")
    script = tmp_path / "commands.txt"
    script.write_text(f'cp "{tmp_path / "a.txt"}" "{container.url}"\njobs clean\n', encoding="utf-8")
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    out = run(["run", str(script)], env=env)
    assert out.returncode == 2 and "line 2: 'jobs' cannot be run from a file" in out.stderr
    assert container.blob_names() == []
    unbalanced = tmp_path / "bad.txt"
    unbalanced.write_text('cp "unterminated\n', encoding="utf-8")
    out = run(["run", str(unbalanced)], env=env)
    assert out.returncode == 2 and "bad.txt:1" in out.stderr and "Traceback" not in out.stderr


def test_commands_come_from_standard_input_too(container: ContainerHandle, azurite: Azurite, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"from stdin")
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    out = run(["run", "-", "--journal", str(tmp_path / "j.db")], env=env,
              input=f'cp "{tmp_path / "a.txt"}" "{container.url}"\n', preexec_fn=None)
    assert out.returncode == 0, out.stderr
    assert container.download("a.txt") == b"from stdin"
