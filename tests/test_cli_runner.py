"""The CLI in-process with click's runner: help, version, and usage errors as one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from blobsync import __version__
from blobsync.cli.main import cli
from conftest import ContainerHandle


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_version_and_help_of_every_command(runner: CliRunner) -> None:
    assert __version__ in runner.invoke(cli, ["--version"]).output
    for command in (["cp"], ["sync"], ["ls"], ["rm"], ["doctor"], ["jobs", "list"], ["jobs", "resume"]):
        result = runner.invoke(cli, [*command, "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, command


@pytest.mark.parametrize(("args", "fragment"), [
    (["sync", "{tmp}", "http://127.0.0.1:1/devstoreaccount1/cont", "--include-regex", "("], "invalid --include-regex"),
    (["sync", "{tmp}", "http://127.0.0.1:1/devstoreaccount1/cont", "--include-pattern", "a/b"], "patterns match"),
    (["rm", "-r", "http://127.0.0.1:1/devstoreaccount1/cont", "--include-after", "yesterday"], "ISO 8601"),
    (["ls", "ftp://nowhere/x"], "malformed URL"),
    (["doctor", "https://acct.blob.core.windows.net"], "names no container"),
    (["cp", "{tmp}", "http://127.0.0.1:1/devstoreaccount1/cont", "--concurrency", "0"], "out of range"),
])
def test_usage_errors_are_one_line_with_exit_2(runner: CliRunner, tmp_path: Path, args: list[str],
                                               fragment: str) -> None:
    result = runner.invoke(cli, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_ls_and_rm_in_process(runner: CliRunner, container: ContainerHandle, azurite_env: str) -> None:
    container.client.upload_blob("p/a.txt", b"abc")
    listed = runner.invoke(cli, ["ls", container.url, "--output-type", "json"])
    assert listed.exit_code == 0, listed.output
    assert [json.loads(line)["type"] for line in listed.output.splitlines()] == ["blob", "summary"]
    removed = runner.invoke(cli, ["rm", container.url + "/p/a.txt"])
    assert removed.exit_code == 0 and "Removed 1 blob(s)" in removed.output
    assert container.blob_names() == []
