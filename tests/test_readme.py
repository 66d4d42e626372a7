"""README stays true: every command and every flag of the CLI is documented there, and so is every exit code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click

from blobsync.cli.main import cli
from blobsync.errors import ExitCode

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _commands(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        yield path, command
        if isinstance(command, click.Group):
            yield from _commands(command, path + " ")


def test_every_command_and_flag_is_in_the_readme() -> None:
    missing = []
    for path, command in _commands(cli):
        if f"blobsync {path}" not in README:
            missing.append(f"command 'blobsync {path}'")
        for param in command.params:
            if isinstance(param, click.Option):
                for flag in [*param.opts, *param.secondary_opts]:
                    if flag.startswith("--") and flag not in README and flag != "--help":
                        missing.append(f"{path}: {flag}")
    assert not missing, "undocumented in README.md: " + ", ".join(missing)


def test_every_exit_code_is_in_the_readme() -> None:
    table = README[README.index("### Exit codes"):]
    for code in ExitCode:
        assert f"| {int(code)} |" in table, code


def test_the_performance_tables_are_made_from_the_committed_results() -> None:
    import subprocess
    import sys

    current = Path(__file__).resolve().parents[1] / "bench" / "current.py"
    done = subprocess.run([sys.executable, str(current), "--check"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
