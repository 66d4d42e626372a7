"""AzCopy's flags as scripts carry them: every on/off flag takes =true/=false, AzCopy's other flags are accepted
or refused with a reason, the manual's table is the code's table, and the flags that do something do it."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
from pathlib import Path

import click
import pytest
from azure.storage.blob import BlobServiceClient, ContainerSasPermissions, generate_container_sas

import blobsync
from blobsync.cli.azcopy import BLOBSYNC_NAMES, FLAGS, booleans_rewritten, check_from_to, compatibility_table
from blobsync.cli.main import cli
from blobsync.errors import UsageError
from conftest import ContainerHandle
from support.azcopy import AZCOPY_BIN, azcopy_missing, run_azcopy
from support.azurite import REPO_ROOT, Azurite
from support.cli import blobsync_cmd, clean_env, kill_when_held, random_file, run
from support.processes import on_a_terminal, read_terminal
from support.proxy import FaultProxy


def _sas(azurite: Azurite, name: str) -> str:
    return generate_container_sas(
        azurite.account, name, account_key=azurite.key,
        permission=ContainerSasPermissions(read=True, add=True, create=True, write=True, delete=True, list=True),
        expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1))


def _commands() -> dict[str, click.Command]:
    out = {name: cmd for name, cmd in cli.commands.items() if not isinstance(cmd, click.Group)}
    jobs = cli.commands["jobs"]
    assert isinstance(jobs, click.Group)
    out.update({f"jobs {name}": cmd for name, cmd in jobs.commands.items()})
    return out


def test_every_on_off_flag_of_every_command_takes_azcopys_equals_form() -> None:
    seen = 0
    for name, command in _commands().items():
        for param in command.params:
            if not (isinstance(param, click.Option) and param.is_flag) or "--help" in param.opts:
                continue
            flag = next(o for o in param.opts if o.startswith("--"))
            for word, expected in (("true", True), ("True", True), ("false", False), ("FALSE", False)):
                rewritten = booleans_rewritten(command.params, [f"{flag}={word}"])
                ctx = command.make_context(name, ["1"] * _nargs(command) + rewritten, resilient_parsing=True)
                assert bool(ctx.params[param.name or ""]) is expected, (name, flag, word)
            with pytest.raises(click.BadParameter, match="use true or false"):
                booleans_rewritten(command.params, [f"{flag}=maybe"])
            seen += 1
    assert seen > 40
    # After '--' nothing is an option.
    assert booleans_rewritten(cli.commands["cp"].params, ["--", "--dry-run=true"]) == ["--", "--dry-run=true"]


def _nargs(command: click.Command) -> int:
    return sum(1 for p in command.params if isinstance(p, click.Argument))


def test_the_table_names_every_flag_each_command_accepts_and_readme_shows_it() -> None:
    commands = _commands()
    for flag in FLAGS:
        for az in flag.commands:
            command = commands[BLOBSYNC_NAMES[az]]
            names = {o for p in command.params for o in (*p.opts, *getattr(p, "secondary_opts", ()))}
            assert f"--{flag.name}" in names, (az, flag.name)
    page = (REPO_ROOT / "docs" / "azcopy.md").read_text()
    assert compatibility_table() in page, "docs/azcopy.md's table is not the one blobsync.cli.azcopy makes"


@pytest.mark.skipif(azcopy_missing() is not None, reason=str(azcopy_missing()))
def test_the_table_covers_every_flag_of_the_real_azcopy() -> None:
    table = {(f.name, c) for f in FLAGS for c in f.commands}
    for az in BLOBSYNC_NAMES:
        done = subprocess.run([str(AZCOPY_BIN), az, "--help"], capture_output=True, text=True, timeout=30,
                              check=False)
        flags = set(re.findall(r"^\s+(?:-\w, )?--([a-z0-9-]+)", done.stdout, re.M)) - {"help"}
        assert flags, done.stdout
        missing = sorted(f for f in flags if (f, az) not in table)
        assert not missing, f"azcopy {az} has flags the table does not cover: {missing}"


def test_from_to_is_checked_against_the_arguments() -> None:
    url = "https://acct.blob.core.windows.net/c"
    check_from_to("LocalBlob", "copy", "./src", url)
    check_from_to("bloblocal", "copy", url, "./dl")
    check_from_to("BlobTrash", "remove", url)
    with pytest.raises(UsageError, match="contradicts the arguments, which make an upload"):
        check_from_to("BlobLocal", "copy", "./src", url)
    check_from_to("BlobBlob", "copy", url, url + "2")
    with pytest.raises(UsageError, match="which make a copy between two URLs"):
        check_from_to("LocalBlob", "copy", url, url + "2")
    with pytest.raises(UsageError, match="LocalBlob or BlobLocal or BlobBlob"):
        check_from_to("BlobFile", "copy", url, url)
    with pytest.raises(UsageError, match="BlobTrash"):
        check_from_to("FileTrash", "remove", url)


def test_refused_flags_say_why_in_one_line_and_harmless_values_pass(container: ContainerHandle, azurite: Azurite,
                                                                    tmp_path: Path) -> None:
    (tmp_path / "a.pt").write_bytes(b"x")
    url = f"{container.url}?{_sas(azurite, container.name)}"
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    for extra, words in ((["--blob-type", "PageBlob"], "block blobs"), (["--backup"], "Windows backup"),
                         (["--from-to", "BlobLocal"], "contradicts"), (["--cpk-by-value=true"], "customer-provided"),
                         (["--put-md5=maybe"], "use true or false"), (["--preserve-info"], "SMB/NFS")):
        done = run(["cp", str(tmp_path / "a.pt"), url, *extra], env=env)
        assert done.returncode == 2, (extra, done.stderr)
        assert words in done.stderr and "Traceback" not in done.stderr, (extra, done.stderr)
        assert "sig=" not in done.stderr or "REDACTED" in done.stderr
    assert container.blob_names() == []
    done = run(["cp", str(tmp_path / "a.pt"), url, "--backup=false", "--preserve-info=false",
                "--blob-type", "Detect", "--page-blob-tier", "None", "--hardlinks", "follow"], env=env)
    assert done.returncode == 0, done.stderr
    assert container.download("a.pt") == b"x"


def test_azcopy_flags_scripts_carry_do_what_they_say(container: ContainerHandle, azurite: Azurite,
                                                     blob_service: BlobServiceClient, tmp_path: Path) -> None:
    src = tmp_path / "models"
    data = random_file(src / "w.pt", 300_000, seed=1)
    random_file(src / "cfg.json", 10, seed=2)
    url = f"{container.url}?{_sas(azurite, container.name)}"
    flags = ["--recursive=true", "--from-to", "LocalBlob", "--put-md5=true", "--log-level", "NONE",
             "--output-level", "quiet", "--check-length=true", "--no-guess-mime-type", "--blob-type", "BlockBlob",
             "--overwrite", "true", "--cache-control", "max-age=3600", "--content-language", "en",
             "--blob-tags", "team=ml&run=7", "--block-blob-tier", "None"]
    done = run(["copy", str(src), url, *flags], env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == 0, done.stderr
    if azcopy_missing() is None:  # the same command line is one AzCopy takes, with the same names
        peer = f"{container.name[:50]}-az"
        client = blob_service.create_container(peer)
        try:
            peer_url = f"{azurite.blob_endpoint}/{peer}?{_sas(azurite, peer)}"
            theirs = run_azcopy(["copy", str(src), peer_url, *flags], cwd=tmp_path, state=tmp_path / "az")
            assert theirs.returncode == 0, theirs.stdout
            assert sorted(b.name for b in client.list_blobs()) == container.blob_names()
        finally:
            client.delete_container()
    assert done.stdout == "" and done.stderr == ""  # --output-level quiet, --log-level NONE
    blob = container.client.get_blob_client("models/w.pt")
    assert blob.download_blob().readall() == data
    props = blob.get_blob_properties()
    assert props.content_settings.content_type == "application/octet-stream"  # --no-guess-mime-type
    assert props.content_settings.cache_control == "max-age=3600"
    assert props.content_settings.content_language == "en"
    assert props.content_settings.content_md5 is not None
    assert blob.get_blob_tags() == {"team": "ml", "run": "7"}
    # Guessed types: model files are bytes, not 'application/vnd.snesdev-page-table'; others as the platform says.
    done = run(["cp", str(src), url, "-r", "--as-subdir=false", "--output-level", "essential"],
               env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == 0 and "2 uploaded" in done.stdout, done.stdout + done.stderr
    types = {b.name: b.content_settings.content_type for b in container.client.list_blobs()}
    assert types["w.pt"] == "application/octet-stream" and types["cfg.json"] == "application/json"


def test_exit_codes_azcopy_maps_every_failure_to_one(tmp_path: Path) -> None:
    bad = ["cp", str(tmp_path / "missing"), "https://acct.blob.core.windows.net/c"]
    assert run(bad).returncode == 2
    assert run([*bad, "--exit-codes", "azcopy"]).returncode == 1
    assert run([*bad, "--exit-codes=azcopy"]).returncode == 1
    assert run(bad, env={"BLOBSYNC_EXIT_CODES": "azcopy"}).returncode == 1
    assert run([*bad, "--exit-codes", "blobsync"], env={"BLOBSYNC_EXIT_CODES": "azcopy"}).returncode == 2
    assert run(["cp", "--bogus"], env={"BLOBSYNC_EXIT_CODES": "azcopy"}).returncode == 1


def test_cp_dry_run_lists_each_file_and_changes_nothing(container: ContainerHandle, azurite: Azurite,
                                                        tmp_path: Path) -> None:
    random_file(tmp_path / "run1" / "a.pt", 10, seed=1)
    random_file(tmp_path / "run1" / "sub" / "b.pt", 10, seed=2)
    container.client.upload_blob("keep/x.h5", b"x")
    url = f"{container.url}?{_sas(azurite, container.name)}"
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    up = run(["cp", str(tmp_path / "run1"), url, "-r", "--dry-run", "--exclude-path", "sub"], env=env)
    assert up.returncode == 0, up.stderr
    assert "a.pt  (to run1/a.pt)" in up.stdout and "b.pt" not in up.stdout and "nothing was changed" in up.stdout
    down = run(["cp", f"{container.url}/keep?{_sas(azurite, container.name)}", str(tmp_path / "dl"), "-r",
                "--dry-run", "--output-type", "json"], env=env)
    records = [json.loads(line) for line in down.stdout.splitlines()]
    actions = [r for r in records if r["type"] == "action"]
    assert [(a["path"], a["dry_run"]) for a in actions] == [("x.h5", True)]
    assert str(tmp_path / "dl" / "keep" / "x.h5") in actions[0]["reason"]
    assert container.blob_names() == ["keep/x.h5"] and not (tmp_path / "dl").exists()
    assert "no jobs" in run(["jobs", "list"], env=env).stdout


def test_cp_time_filters(container: ContainerHandle, tmp_path: Path) -> None:
    for name, when in (("old.pt", "2020-01-01T00:00:00"), ("mid.pt", "2022-06-01T00:00:00"),
                       ("new.pt", "2024-01-01T00:00:00")):
        random_file(tmp_path / "src" / name, 10, seed=len(name))
        stamp = datetime.datetime.fromisoformat(when).replace(tzinfo=datetime.UTC).timestamp()
        os.utime(tmp_path / "src" / name, (stamp, stamp))
    config = blobsync.TransferConfig(recursive=True, journal_path=tmp_path / "j.db")
    filters = blobsync.Filters.parse(include_after="2022-06-01T00:00:00Z", include_before="2023-01-01")
    report = blobsync.copy(tmp_path / "src", container.url, config, filters=filters,
                           env={"AZURE_STORAGE_CONNECTION_STRING": _conn(container)})
    assert report.files_transferred == 1 and container.blob_names() == ["src/mid.pt"]
    assert container.download("src/mid.pt") == (tmp_path / "src" / "mid.pt").read_bytes()


def _conn(container: ContainerHandle) -> str:
    from support.azurite import connection_string

    return connection_string(container.url.rsplit("/", 1)[0])


def test_resume_of_a_filtered_copy_keeps_its_filters(container: ContainerHandle, azurite: Azurite,
                                                     proxy: FaultProxy, tmp_path: Path) -> None:
    for i in range(6):
        random_file(tmp_path / "src" / f"f{i}.pt", 1000 + i, seed=i)
        random_file(tmp_path / "src" / f"f{i}.tmp", 1000, seed=10 + i)
    sas = _sas(azurite, container.name)
    journal = tmp_path / "j.db"
    args = ["cp", str(tmp_path / "src"), f"{proxy.endpoint()}/{container.name}?{sas}", "-r", "--journal",
            str(journal), "--include-pattern", "*.pt", "--concurrency", "1", "--quiet"]
    proxy.hold_after("put_blob", 2)
    kill_when_held(args, proxy)
    job_id = run(["jobs", "list", "--journal", str(journal)]).stdout.split()[0]
    done = run(["jobs", "resume", job_id, "--journal", str(journal), "--sas", sas])
    assert done.returncode == 0, done.stderr
    assert container.blob_names() == [f"src/f{i}.pt" for i in range(6)]  # the filter held on resume
    for i in range(6):
        assert container.download(f"src/f{i}.pt") == (tmp_path / "src" / f"f{i}.pt").read_bytes()


def test_overwrite_prompt_asks_per_file_and_remembers_all(container: ContainerHandle, tmp_path: Path) -> None:
    for name in ("a", "b", "c", "d"):
        random_file(tmp_path / "src" / f"{name}.pt", 100, seed=ord(name))
        container.client.upload_blob(f"src/{name}.pt", b"old")
    asked: list[str] = []
    answers = iter([blobsync.Answer.NO, blobsync.Answer.YES, blobsync.Answer.ALL])

    def ask(description: str) -> blobsync.Answer:
        asked.append(description)
        return next(answers)

    config = blobsync.TransferConfig(recursive=True, overwrite=blobsync.Overwrite.PROMPT,
                                     journal_path=tmp_path / "j.db", concurrency=1)
    report = blobsync.copy(tmp_path / "src", container.url, config, confirm_overwrite=ask,
                           env={"AZURE_STORAGE_CONNECTION_STRING": _conn(container)})
    assert len(asked) == 3 and all("exists" in q for q in asked)  # 'all' answered the fourth
    assert (report.files_transferred, report.files_skipped) == (3, 1)
    kept = [n for n in "abcd" if container.download(f"src/{n}.pt") == b"old"]
    assert len(kept) == 1
    for n in "abcd":
        if n not in kept:
            assert container.download(f"src/{n}.pt") == (tmp_path / "src" / f"{n}.pt").read_bytes()
    # Without anyone to answer: a usage error before any transfer.
    done = run(["cp", str(tmp_path / "src"), container.url, "-r", "--overwrite", "prompt"],
               env={"AZURE_STORAGE_CONNECTION_STRING": _conn(container)}, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "needs a terminal" in done.stderr


def test_ls_names_relative_to_the_url_and_doctor_names_u(container: ContainerHandle, azurite: Azurite) -> None:
    for name in ("run1/a.pt", "run1/sub/b.pt", "run10/c.pt"):
        container.client.upload_blob(name, b"x")
    sas = _sas(azurite, container.name)
    listed = run(["list", f"{container.url}/run1?{sas}"])
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[-1] for line in listed.stdout.splitlines()[:-1]]
    assert names == ["a.pt", "sub/b.pt"]
    records = [json.loads(x) for x in run(["ls", f"{container.url}/run1?{sas}", "--output-type", "json"]
                                          ).stdout.splitlines()]
    assert [(r["name"], r["path"]) for r in records if r["type"] == "blob"] == [
        ("run1/a.pt", "a.pt"), ("run1/sub/b.pt", "sub/b.pt")]
    doctor = run(["doctor", f"{container.url}?{sas.replace('sp=', 'sp=u')}"])
    assert "'u'?" not in doctor.stdout and "update" in doctor.stdout


def test_make_creates_a_container_once(azurite: Azurite, tmp_path: Path) -> None:
    name = f"made-{os.getpid()}"
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    url = f"{azurite.blob_endpoint}/{name}"
    done = run(["make", url], env=env)
    assert done.returncode == 0 and "Successfully created" in done.stdout, done.stderr
    again = run(["make", url], env=env)
    assert again.returncode == 1 and "already exists" in again.stderr
    assert run(["make", f"{url}/path"], env=env).returncode == 2
    assert run(["rm", f"{url}/nothing"], env=env).returncode != 0  # the container is there to talk to


def test_overwrite_prompt_on_a_terminal(container: ContainerHandle, tmp_path: Path) -> None:
    for name in ("a", "b"):
        random_file(tmp_path / "src" / f"{name}.pt", 100, seed=ord(name))
        container.client.upload_blob(f"src/{name}.pt", b"old")
    random_file(tmp_path / "src" / "new.pt", 100, seed=3)
    cmd = blobsync_cmd("cp", "-r", str(tmp_path / "src"), container.url, "--overwrite", "prompt",
                       "--journal", str(tmp_path / "j.db"))
    env = clean_env({"AZURE_STORAGE_CONNECTION_STRING": _conn(container)})
    answers = [b"y\r", b"n\r"]
    with on_a_terminal(cmd, env) as term:

        def answer(output: bytes) -> None:
            if answers and output.count(b"overwrite?") > 2 - len(answers):
                os.write(term.master, answers.pop(0))

        output = read_terminal(term.master, 60, answer)
    text = output.decode(errors="replace")
    assert term.exit_code == 0, text
    assert text.count("overwrite?") == 2 and "new.pt" not in text.split("Job ")[0], text  # only files that exist
    olds = [n for n in ("a", "b") if container.download(f"src/{n}.pt") == b"old"]
    assert len(olds) == 1, text
    assert container.download("src/new.pt") == (tmp_path / "src" / "new.pt").read_bytes()


def test_folder_stubs_are_skipped_as_azcopy_does(container: ContainerHandle, tmp_path: Path) -> None:
    """Data Lake tools write a zero-length 'dir' blob with hdi_isfolder=true beside 'dir/a.pt': a file named 'dir'
    would stand where the folder must be."""
    container.client.upload_blob("dir", b"", metadata={"hdi_isfolder": "true"})
    container.client.upload_blob("dir/a.pt", b"model")
    env = {"AZURE_STORAGE_CONNECTION_STRING": _conn(container)}
    done = run(["cp", "-r", container.url, str(tmp_path / "dl"), "--journal", str(tmp_path / "j.db")], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "dl" / container.name / "dir" / "a.pt").read_bytes() == b"model"
    synced = run(["sync", container.url, str(tmp_path / "s"), "--journal", str(tmp_path / "j.db")], env=env)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert sorted(str(p.relative_to(tmp_path / "s")) for p in (tmp_path / "s").rglob("*")) == ["dir", "dir/a.pt"]
