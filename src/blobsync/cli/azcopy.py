"""AzCopy's flag surface: each AzCopy flag and what blobsync does with it, the flags declared only for scripts'
sake, the `--flag=true|false` form, and `--from-to` checked against the arguments."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import click

from blobsync.backends.registry import is_remote
from blobsync.cli.common import F
from blobsync.errors import UsageError


class Treatment(Enum):
    SAME = "same"  # blobsync has the flag, with AzCopy's meaning
    MAPPED = "mapped"  # accepted and mapped onto blobsync's behaviour (the note says how)
    ACCEPTED = "accepted"  # accepted; it changes nothing here (the note says why)
    REFUSED = "refused"  # a usage error with the reason, when it asks for something


COMMANDS = ("copy", "sync", "remove", "list", "make")  # AzCopy's names; blobsync's are cp, sync, rm, ls, make
ALL = frozenset(COMMANDS)
_XFER = frozenset(("copy", "sync"))


@dataclass(frozen=True)
class AzFlag:
    """One AzCopy flag. `declare`: this module adds the option (blobsync has none of its own); a bool one asks
    for something only when true, a value one whenever it is not in `harmless`."""

    name: str
    commands: frozenset[str]
    treatment: Treatment
    note: str = ""
    declare: bool = False
    boolean: bool = False
    harmless: tuple[str, ...] = ()  # values (case-insensitive) that ask for nothing blobsync lacks
    default: str | bool | None = None


def _f(name: str, commands: Sequence[str] | frozenset[str], treatment: Treatment, note: str = "", **kw: Any) -> AzFlag:
    return AzFlag(name, frozenset(commands), treatment, note, **kw)


S, M, A, R = Treatment.SAME, Treatment.MAPPED, Treatment.ACCEPTED, Treatment.REFUSED
_NO_SMB = "SMB/NFS file properties are not carried (blobsync keeps the mtime in metadata)"

FLAGS: tuple[AzFlag, ...] = (
    _f("as-subdir", ["copy"], S, "default true: a folder or prefix copied with -r becomes a level of its own"),
    _f("backup", ["copy"], R, "Windows backup privileges are not used", declare=True, boolean=True),
    _f("blob-tags", ["copy"], S, "'k1=v1&k2=v2', at most 10 tags"),
    _f("blob-type", ["copy"], M, "BlockBlob and Detect: blobsync writes block blobs; PageBlob and AppendBlob are "
       "refused", declare=True, harmless=("BlockBlob", "Detect")),
    _f("block-blob-tier", ["copy"], S, "Hot, Cool, Cold, Archive (None: the account's default)"),
    _f("block-size-mb", _XFER, S),
    _f("cache-control", ["copy"], S),
    _f("check-length", ["copy"], A, "the length (and the MD5) is always checked; =false (--no-check-length) "
       "changes nothing",
       declare=True, boolean=True, default=True),
    _f("check-md5", _XFER, S),
    _f("compare-hash", ["sync"], S, "None or MD5 (local hashes are cached in the journal)"),
    _f("content-disposition", ["copy"], S),
    _f("content-encoding", ["copy"], S),
    _f("content-language", ["copy"], S),
    _f("content-type", ["copy"], S),
    _f("cpk-by-name", ["copy", "sync", "remove"], R, "customer-provided encryption keys are not supported",
       declare=True),
    _f("cpk-by-value", ["copy", "sync", "remove"], R, "customer-provided encryption keys are not supported",
       declare=True, boolean=True),
    _f("decompress", ["copy"], R, "downloads are byte-exact; decompress afterwards (e.g. gunzip)", declare=True,
       boolean=True),
    _f("delete-destination", ["sync"], S, "true, false, prompt; never deletes what the filters exclude"),
    _f("delete-snapshots", ["remove"], M, "snapshots always go with their blob: include is what blobsync does; "
       "only is refused", declare=True, harmless=("include",)),
    _f("disable-auto-decoding", ["copy"], A, "Windows name decoding: blobsync does none", declare=True,
       boolean=True),
    _f("dry-run", ["copy", "sync", "remove"], S),
    _f("exclude-attributes", ["copy", "sync"], R, "Windows file attributes are not read", declare=True),
    _f("exclude-blob-type", ["copy"], R, "blob types are not filtered", declare=True),
    _f("exclude-container", ["copy"], R, "account-to-account copies are not supported", declare=True),
    _f("exclude-path", ["copy", "sync", "remove"], S, "a string prefix of the relative path ('sub' also excludes "
       "'sub.pt' and 'subway/'); a trailing '/' keeps it to the folder"),
    _f("exclude-pattern", ["copy", "sync", "remove"], S, "globs on the file name, ';'-separated"),
    _f("exclude-regex", ["copy", "sync"], S),
    _f("follow-symlinks", _XFER, S, "loops are detected and skipped with a note"),
    _f("force-if-read-only", ["copy", "sync", "remove"], A, "a download replaces a read-only file by rename, "
       "which its mode does not prevent on Linux and macOS", declare=True, boolean=True),
    _f("from-to", ["copy", "sync", "remove"], M, "checked against the arguments: LocalBlob (upload), BlobLocal "
       "(download), BlobBlob (blob to blob), BlobTrash (remove); other pairs are refused", declare=True),
    _f("hardlinks", _XFER, M, "follow (each link's content is copied, the default); skip and preserve are "
       "refused", declare=True, harmless=("follow",)),
    _f("hash-meta-dir", ["sync"], A, "local hashes are cached in the journal, never beside the files",
       declare=True),
    _f("include-after", ["copy", "remove"], S, "ISO 8601; on or after"),
    _f("include-attributes", ["copy", "sync"], R, "Windows file attributes are not read", declare=True),
    _f("include-before", ["copy", "remove"], S, "ISO 8601; before or on"),
    _f("include-directory-stub", _XFER, R, "folder stub blobs are not transferred", declare=True, boolean=True),
    _f("include-path", ["copy", "remove"], S, "whole paths or folders relative to the source"),
    _f("include-pattern", ["copy", "sync", "remove"], S, "globs on the file name, ';'-separated"),
    _f("include-regex", ["copy", "sync"], S),
    _f("include-root", ["sync"], A, "root folder properties are an Azure Files matter", declare=True,
       boolean=True),
    _f("list-of-files", ["copy", "remove"], S, "paths relative to the source, one per line; copy: folders take "
       "everything below them"),
    _f("list-of-versions", ["copy", "remove"], R, "blob versions are not supported", declare=True),
    _f("local-hash-storage-mode", ["sync"], A, "local hashes are cached in the journal", declare=True),
    _f("location", ["list"], M, "Blob; File and BlobFS are refused", declare=True, harmless=("Blob",)),
    _f("machine-readable", ["list"], A, "sizes are always printed in bytes", declare=True, boolean=True),
    _f("mega-units", ["list"], A, "sizes are printed in bytes; totals in KiB/MiB/GiB", declare=True,
       boolean=True),
    _f("metadata", ["copy"], S, "'k=v;k2=v2'"),
    _f("mirror-mode", ["sync"], S),
    _f("no-guess-mime-type", ["copy"], S, "application/octet-stream unless --content-type"),
    _f("overwrite", ["copy"], S, "true, false, ifSourceNewer, prompt (prompt needs a terminal)"),
    _f("page-blob-tier", ["copy"], R, "page blobs are not supported", declare=True, harmless=("None",)),
    _f("permanent-delete", ["remove"], R, "soft-deleted snapshots and versions are not purged", declare=True,
       harmless=("none",)),
    _f("posix-properties-style", _XFER, A, "POSIX properties are not carried", declare=True),
    _f("preserve-info", _XFER, R, _NO_SMB, declare=True, boolean=True),
    _f("preserve-owner", ["copy"], A, "only with --preserve-permissions", declare=True, boolean=True),
    _f("preserve-permissions", _XFER, R, _NO_SMB, declare=True, boolean=True),
    _f("preserve-posix-properties", _XFER, R, _NO_SMB, declare=True, boolean=True),
    _f("preserve-symlinks", _XFER, R, "links are followed or skipped, never stored as links", declare=True,
       boolean=True),
    _f("preserve-last-modified-time", ["copy"], S, "downloads: the mtime blobsync stored, else Last-Modified"),
    _f("properties", ["list"], A, "each line shows last modified, size, tier and Content-MD5; --output-type json "
       "has every property", declare=True),
    _f("put-blob-size-mb", _XFER, S),
    _f("put-md5", _XFER, S, "on by default in blobsync (AzCopy: off); --put-md5=false turns it off"),
    _f("quota-gb", ["make"], R, "file share quotas: blobsync makes containers", declare=True),
    _f("recursive", ["copy", "sync", "remove"], S, "sync: on by default; --recursive=false syncs the top level "
       "only"),
    _f("running-tally", ["list"], A, "the total is always printed", declare=True, boolean=True),
    _f("s2s-detect-source-changed", ["copy"], A, "always on: each blob is read at the version listed (If-Match); "
       "one that changes meanwhile fails with a line", declare=True, boolean=True),
    _f("s2s-handle-invalid-metadata", ["copy"], A, "names Azure refuses (an S3 source's 'x-owner') are left out, "
       "as AzCopy's default ExcludeIfInvalid", declare=True),
    _f("s2s-preserve-access-tier", _XFER, S, "default true; --block-blob-tier overrides"),
    _f("s2s-preserve-blob-tags", _XFER, S, "default false; --blob-tags names more over them"),
    _f("s2s-preserve-properties", ["copy"], S, "default true: content type, encoding, disposition, language, cache "
       "control, Content-MD5 and metadata"),
    _f("trailing-dot", ["copy", "sync", "remove", "list"], A, "an Azure Files setting; blob names ending in '.' "
       "are refused per file", declare=True),
    # Global flags: every command.
    _f("cap-mbps", _XFER, S),
    _f("cap-mbps", ["remove", "list", "make"], A, "nothing there to cap", declare=True),
    _f("check-version", ALL, A, "no update check: blobsync --version", declare=True, boolean=True),
    _f("log-level", ALL, M, "DEBUG, INFO, WARNING (default), ERROR, PANIC (as ERROR), NONE; logs go to stderr or "
       "--log-file"),
    _f("output-level", ALL, M, "default; essential (no progress display); quiet (errors only)"),
    _f("output-type", ALL, S, "text or json (JSON lines)"),
    _f("trusted-microsoft-suffixes", ALL, S),
    _f("await-continue", ALL, R, "an AzCopy debugging aid", declare=True, boolean=True),
    _f("await-open", ALL, R, "an AzCopy debugging aid", declare=True, boolean=True),
    _f("debug-skip-files", ALL, R, "an AzCopy debugging aid", declare=True),
)

BLOBSYNC_NAMES = {"copy": "cp", "sync": "sync", "remove": "rm", "list": "ls", "make": "make"}
_FROM_TO = {"copy": ("LocalBlob", "BlobLocal", "BlobBlob"), "sync": ("LocalBlob", "BlobLocal", "BlobBlob"),
            "remove": ("BlobTrash",)}
_TRUE = ("1", "t", "true", "yes", "on")  # Go's strconv.ParseBool, which AzCopy uses, and click's words
_FALSE = ("0", "f", "false", "no", "off")


def _param(name: str) -> str:
    return name.replace("-", "_")


def _check(flag: AzFlag, value: object) -> None:
    """Refuse a value of a declared flag that asks for something blobsync does not do."""
    if flag.boolean:
        asks = bool(value) and flag.default is not True
    else:
        asks = value is not None and str(value).lower() not in (h.lower() for h in flag.harmless)
    if asks and flag.treatment in (Treatment.REFUSED, Treatment.MAPPED):
        shown = f"--{flag.name}" if flag.boolean else f"--{flag.name} {value}"
        raise UsageError(f"{shown} is not supported by blobsync: {flag.note}")


def check_from_to(value: str | None, command: str, source: str, dest: str | None = None) -> None:
    """AzCopy's --from-to, checked against the direction the arguments give (the URL side is the blob side)."""
    if value is None:
        return
    allowed = _FROM_TO[command]
    match = next((a for a in allowed if a.lower() == value.lower()), None)
    if match is None:
        raise UsageError(f"--from-to {value}: blobsync's {BLOBSYNC_NAMES[command]} does "
                         f"{' or '.join(allowed)} (local disks and Blob Storage)")
    if command == "remove":
        return
    implied = "BlobLocal" if is_remote(source) else "LocalBlob"
    if dest is not None and is_remote(source) and is_remote(dest):
        implied = "BlobBlob"
    elif dest is not None and not is_remote(source) and not is_remote(dest):
        return  # the command itself reports that one side must be a URL
    if match != implied:
        what = {"BlobLocal": "a download", "LocalBlob": "an upload", "BlobBlob": "a copy between two URLs"}[implied]
        raise UsageError(f"--from-to {value} contradicts the arguments, which make {what} ({implied})")


def declared(command: str) -> list[AzFlag]:
    return [f for f in FLAGS if command in f.commands and f.declare]


def azcopy_flags(command: str) -> Callable[[F], F]:
    """Add the AzCopy flags of `command` that blobsync has no option for (hidden from --help; docs/azcopy.md lists
    them); the function never sees them. --from-to is checked against SOURCE/DESTINATION (or URL)."""

    def decorate(fn: F) -> F:
        flags = declared(command)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for flag in flags:
                value = kwargs.pop(_param(flag.name))
                if flag.name == "from-to":
                    check_from_to(value, command, kwargs.get("source") or kwargs.get("url") or "",
                                  kwargs.get("destination"))
                    continue
                _check(flag, value)
                if flag.treatment is Treatment.ACCEPTED and value is not None and value != bool(flag.default):
                    shown = (f"--{flag.name}" if value is True else f"--{flag.name}=false" if value is False
                             else f"--{flag.name} {value}")
                    click.echo(f"blobsync: note: {shown} changes nothing: {flag.note}", err=True)
            return fn(*args, **kwargs)

        for flag in reversed(flags):
            if flag.boolean:
                names = [f"--{flag.name}"] + ([f"--no-{flag.name}"] if flag.default is True else [])
                option = click.option("/".join(names) if len(names) > 1 else names[0], _param(flag.name),
                                      is_flag=True, default=bool(flag.default), hidden=True)
            else:
                option = click.option(f"--{flag.name}", _param(flag.name), default=None, hidden=True)
            wrapper = option(wrapper)
        return wrapper  # type: ignore[return-value]

    return decorate


class AzCommand(click.Command):
    """A command that also takes AzCopy's `--flag=true` / `--flag=false` for its on/off flags."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, booleans_rewritten(self.params, args))


def booleans_rewritten(params: Sequence[click.Parameter], args: list[str]) -> list[str]:
    """`--x=true` becomes `--x`; `--x=false` becomes `--no-x` where there is one, else nothing (off is the
    default of a lone flag); `--no-x=false` is `--x`. Any other value is a usage error naming the flag."""
    opposite: dict[str, str | None] = {}  # each on/off flag's long name -> the name that says the opposite
    for p in params:
        if isinstance(p, click.Option) and p.is_flag:
            on = next((o for o in p.opts if o.startswith("--")), None)
            off = next((o for o in p.secondary_opts if o.startswith("--")), None)
            if on is not None:
                opposite[on] = off
            if off is not None:
                opposite[off] = on
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        name, eq, value = arg.partition("=")
        if not eq or name not in opposite:
            out.append(arg)
            continue
        word = value.strip().lower()
        if word not in _TRUE + _FALSE:
            raise click.BadParameter(f"{value!r}: use true or false", param_hint=name)
        chosen = name if word in _TRUE else opposite[name]
        if chosen is not None:
            out.append(chosen)
    return out


def compatibility_table() -> str:
    """docs/azcopy.md's table: every AzCopy 10.32 flag of copy, sync, remove, list and make, and what blobsync does."""
    lines = ["| AzCopy flag | commands | blobsync |", "|---|---|---|"]
    for flag in sorted(FLAGS, key=lambda f: f.name):
        commands = "all" if flag.commands == ALL else ", ".join(c for c in COMMANDS if c in flag.commands)
        what = flag.treatment.value + (f": {flag.note}" if flag.note else "")
        lines.append(f"| `--{flag.name}` | {commands} | {what} |")
    return "\n".join(lines)
