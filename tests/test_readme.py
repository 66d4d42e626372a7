"""The manual stays true: every command and every flag of the CLI is documented in docs/, and so is every exit code;
README stays a front page; the docs site builds with no broken link and no page left out of the navigation."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import click

from blobsync.cli.main import cli
from blobsync.errors import ExitCode

ROOT = Path(__file__).resolve().parents[1]
DOCS = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
CLI_PAGE = (ROOT / "docs" / "cli.md").read_text()


def _commands(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        yield path, command
        if isinstance(command, click.Group):
            yield from _commands(command, path + " ")


def test_every_command_and_flag_is_in_the_manual() -> None:
    missing = []
    for path, command in _commands(cli):
        if f"blobsync {path}" not in DOCS:
            missing.append(f"command 'blobsync {path}'")
        for param in command.params:
            if isinstance(param, click.Option):
                for flag in [*param.opts, *param.secondary_opts]:
                    if flag.startswith("--") and flag not in DOCS and flag != "--help":
                        missing.append(f"{path}: {flag}")
    assert not missing, "undocumented in docs/: " + ", ".join(missing)


def test_every_exit_code_is_in_the_manual() -> None:
    table = CLI_PAGE[CLI_PAGE.index("## Exit codes"):]
    for code in ExitCode:
        assert f"| {int(code)} |" in table, code


def test_the_performance_tables_are_made_from_the_committed_results() -> None:
    import subprocess
    import sys

    current = Path(__file__).resolve().parents[1] / "bench" / "current.py"
    done = subprocess.run([sys.executable, str(current), "--check"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr


def test_the_readme_is_a_front_page_that_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "scripts/test.sh" in readme  # CI runs the test command the README names
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert page.name == "index.md" or f"docs/{page.name}" in readme, page.name


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    """mkdocs --strict fails on a broken link, an anchor that is not there, or a page missing from the nav."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_generated_tables_are_current() -> None:
    """The transfer flags' table (from their declarations) and AzCopy's (from cli/azcopy.py) are what the pages hold."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "docs_tables.py"), "--check"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
