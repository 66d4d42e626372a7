"""TransferConfig: every option of a transfer in one frozen, validated record (the CLI flags map onto it)."""

from __future__ import annotations

import functools
import math
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Self
from urllib.parse import quote

from blobsync.arguments import HEADER_CONTROL, FlagEnum, boolean, check_header_text, choice, number, optional_path
from blobsync.checksums import BlockCheck as BlockCheck
from blobsync.errors import UsageError
from blobsync.redact import redact, register_secret

MiB = 1024 * 1024
MIN_BLOCK_SIZE = 1024
MAX_MEMORY = 1 << 40
MAX_BLOCK_SIZE = 4000 * MiB  # --block-size-mb's range, as AzCopy's (a store's own part limit: its capabilities)
MAX_PUT_BLOB_SIZE = 5000 * MiB  # --put-blob-size-mb's
# The words --block-blob-tier takes and the header properties a write may set (AzCopy's --cache-control, ...):
# whether the destination keeps them is its store's to say (jobs.check_writes), before anything moves.
TIERS = ("Hot", "Cool", "Cold", "Archive")
BLOB_PROPERTIES = ("cache_control", "content_disposition", "content_encoding", "content_language")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP token: what a metadata name becomes part of
PLACEHOLDER = "blobsyncplaceholder"  # marks an empty object a store made only to drop another writer's parts
CRC64_METADATA = "blobsynccrc64"  # the whole blob's CRC64, composed from its blocks' as blobsync wrote them
_RESERVED_METADATA = ("mtime", PLACEHOLDER, CRC64_METADATA)  # blobsync keeps the source's mtime in the first
AUTO: Literal["auto"] = "auto"
AUTO_START = 16  # --concurrency auto starts here: the old fixed default (a start at 8 cost short jobs)
AUTO_CEILING = 64  # and never goes above this; a number given instead is both the start and the ceiling
Concurrency = int | Literal["auto"]


def parse_concurrency(text: str | int) -> Concurrency:
    """--concurrency: 'auto' or a whole number (range-checked by TransferConfig)."""
    if isinstance(text, int) or str(text).strip().lower() != AUTO:
        try:
            return int(text)
        except ValueError:
            raise UsageError(f"invalid --concurrency {text!r}: use 'auto' or a number of requests") from None
    return AUTO


class Overwrite(FlagEnum):
    TRUE = "true"
    FALSE = "false"
    IF_SOURCE_NEWER = "ifSourceNewer"
    PROMPT = "prompt"  # ask for each file that exists (yes, no, all, none); needs someone to answer


class CheckMd5(FlagEnum):
    """What a download does with the blob's stored Content-MD5 (AzCopy's --check-md5)."""

    NO_CHECK = "NoCheck"
    LOG_ONLY = "LogOnly"
    FAIL_IF_DIFFERENT = "FailIfDifferent"
    FAIL_IF_DIFFERENT_OR_MISSING = "FailIfDifferentOrMissing"

    @classmethod
    def flag(cls) -> str:
        return "--check-md5"


def check_proxy_url(url: str) -> None:
    """A proxy URL as --proxy takes it: http(s)://[user:password@]host[:port], nothing else."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"invalid --proxy: {exc}") from exc
    if parts.password:
        register_secret(parts.password)  # redacted wherever it could show: messages, logs
    if HEADER_CONTROL.search(url):
        raise UsageError("invalid --proxy: line breaks and other control characters cannot be part of a URL")
    if parts.scheme not in ("http", "https") or not parts.hostname or (parts.path not in ("", "/")) or parts.query:
        shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        raise UsageError(f"invalid --proxy {shown!r}: expected http://[user:password@]host:port")
    del port


def check_metadata(key: str, value: str, what: str = "metadata") -> None:
    """One metadata pair as the user gives it: header text, and not a name blobsync keeps for itself (the names a
    store takes are its own: checked against the destination before anything moves)."""
    if not _HEADER_NAME.fullmatch(key):
        raise UsageError(f"invalid {what} name {key!r}: a name becomes part of an HTTP header (no spaces or "
                         "separators; letters, digits and '_' are taken everywhere)")
    check_header_text(value, f"{what} value for {key!r}", ascii_only=True)
    if key.lower() in _RESERVED_METADATA:
        raise UsageError(f"{what} name {key!r} is reserved: blobsync keeps a record of its own there")


def parse_blob_tags(text: str | None) -> dict[str, str]:
    """AzCopy's --blob-tags 'k1=v1&k2=v2' (URL-encoded parts); which tags a blob may hold is its store's rule."""
    from urllib.parse import unquote

    tags: dict[str, str] = {}
    for item in (text or "").split("&"):
        if not item.strip():
            continue
        key, sep, value = (unquote(part) for part in item.partition("="))
        if not sep or not key:
            raise UsageError(f"invalid --blob-tags item {item!r}: expected key=value, items joined by '&'")
        tags[key] = value
    return tags


def tier_named(text: str | None) -> str | None:
    """The tier `text` names, whatever its case; None if it names none."""
    return next((t for t in TIERS if text and t.lower() == text.lower()), None)


def parse_suffixes(text: str | None) -> tuple[str, ...]:
    """--trusted-microsoft-suffixes 'a.example;*.b.example;10.0.0.5': domains of two labels or more (matched on a
    label boundary), or IP addresses named whole; no schemes, paths, ports or bare top-level domains."""
    out = []
    for given in (text or "").split(";"):
        item = given.strip()
        wildcard = item.startswith(("*", "."))
        item = item.lstrip("*").lstrip(".").rstrip(".").lower()
        if not item:
            continue
        address = _ip(item)
        if address is not None and not wildcard:
            out.append(address)
            continue
        labels = item.split(".")
        if address is not None or not all(re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", x) for x in labels) \
                or labels[-1].isdigit():
            raise UsageError(f"invalid --trusted-microsoft-suffixes item {given.strip()!r}: a host name or domain "
                             "(e.g. 'blob.example.com'), or a whole IP address")
        if len(labels) < 2:
            raise UsageError(f"invalid --trusted-microsoft-suffixes item {given.strip()!r}: a top-level domain "
                             "alone would trust every host under it; name the domain (e.g. 'storage.example.com')")
        out.append(item)
    return tuple(out)


def _ip(text: str) -> str | None:
    """`text` as an IP address in one spelling (IPv6 with or without brackets), or None."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(text.removeprefix("[").removesuffix("]")))
    except ValueError:
        return None


def parse_metadata(text: str | None) -> dict[str, str]:
    """Parse AzCopy-style 'k=v;k2=v2' metadata; names must be valid C# identifiers, as Azure requires."""
    out: dict[str, str] = {}
    if not text:
        return out
    for item in text.split(";"):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"invalid --metadata item {item!r}: expected key=value")
        check_metadata(key, value, "--metadata")
        out[key] = value
    return out


def _size_text(n: float) -> str:
    """A byte count as a person writes it: '1 KiB', '4000 MiB', '1 TiB', '0 bytes'."""
    units = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1024))
    for unit, size in units:  # the largest unit the number is a whole count of (4000 MiB, not 3.90625 GiB)
        if n >= size and n % size == 0:
            return f"{n // size:g} {unit}"
    for unit, size in units:
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} bytes"


def _bytes_in(value: object, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise UsageError(f"{name} {value!r} is out of range: {_size_text(lo)} to {_size_text(hi)} (in bytes)")
    return value


def _mib(value: float, flag: str, lo: float, hi: int) -> int:
    """A size given in MiB (as the flags take it), finite and within [lo, hi] bytes."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UsageError(f"invalid {flag} {value!r}: a number of MiB from {_size_text(lo)} to {_size_text(hi)}")
    if not (lo <= value * MiB <= hi):
        raise UsageError(f"{flag} {value:g} is out of range: {_size_text(lo)} to {_size_text(hi)}")
    return int(value * MiB)


def mbps_to_bytes(mbps: float) -> float:
    """Megabits per second (--cap-mbps, as in AzCopy) as bytes per second: the one place the unit changes."""
    return mbps * 1_000_000 / 8


def _concurrency_value(value: object) -> Concurrency:
    if value == AUTO and isinstance(value, str):
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 512:
        raise UsageError(f"--concurrency {value!r} is out of range: 'auto' or 1 to 512 requests")
    return value


@dataclass(frozen=True)
class Flag:
    """How one TransferConfig field is given on the command line and kept with a job: the one declaration the
    CLI's options (cli/config_flags.py), their help and the journal's stored options are made from."""

    decl: str | None  # '--block-size-mb', '--put-md5/--no-put-md5'; None: each command declares its own
    help: str = ""
    kind: type | tuple[str, ...] = str  # float, int, bool (a flag), Path, or the words a choice takes
    default: object = None  # as typed on the command line
    show_default: bool = False
    parse: Callable[[Any], object] | None = None  # what was typed -> the field's value
    journal: bool = True  # kept with the job (what `jobs show` prints and `jobs resume` runs with)
    group: tuple[str, ...] = ()  # one flag per key (--cache-control, ...), gathered into the field's mapping
    metavar: str | None = None
    shown: str = ""  # the value as the manual's flag table shows it ('F', 'auto|N', '"k=v;k2=v2"'); derived if ''
    default_text: str = ""  # the default in words, where the value alone says too little ('the block size')
    # "session": how requests are made (connections, budgets, cap, retries, journal), shared by every call of a
    # Client or a `blobsync run`; "call": what one job does. See TransferConfig.in_session.
    scope: Literal["session", "call"] = "call"


def _flag(decl: str | None, help: str = "", **kwargs: Any) -> dict[str, Flag]:
    return {"flag": Flag(decl, help, **kwargs)}


_TYPED: dict[type, tuple[tuple[str, type], ...]] = {}


def _typed_fields(cls: type) -> tuple[tuple[str, type], ...]:
    """(name, type) of the fields of a config class whose declared type is an enum or bool: what a journal's
    text or a caller's word is parsed as (a field added later is read back the same way). Worked out once."""
    known = _TYPED.get(cls)
    if known is None:
        hints = typing.get_type_hints(cls)
        known = _TYPED[cls] = tuple(
            (f.name, hints[f.name]) for f in fields(cls)
            if isinstance(hints[f.name], type) and (issubclass(hints[f.name], Enum) or hints[f.name] is bool))
    return known


@dataclass(frozen=True)
class TransferConfig:
    """Options of a transfer; sizes in bytes. Build it with `TransferConfig.from_mib(...)` from MiB values.

    Each field's `Flag` says how the command line gives it: a new option is one field here."""

    block_size: int = field(default=8 * MiB, metadata=_flag(
        "--block-size-mb", "Block (upload) or range (download) size; raised automatically so no blob needs more than "
                           "50,000 blocks (max 4000).", shown="F",
        kind=float, default=8, show_default=True, parse=lambda v: _mib(v, "--block-size-mb", MIN_BLOCK_SIZE,
                                                                        MAX_BLOCK_SIZE)))
    put_blob_size: int | None = field(default=None, metadata=_flag(  # None: same as block_size (AzCopy's rule)
        "--put-blob-size-mb", "Files up to this size go in one request (Put Blob, or one GET) (max 5000).",
        shown="F", default_text="the block size", kind=float,
        parse=lambda v: None if v is None else _mib(v, "--put-blob-size-mb", 0, MAX_PUT_BLOB_SIZE)))
    concurrency: Concurrency = field(default=AUTO, metadata=_flag(
        "--concurrency", "Requests in flight, one budget shared by all files: `auto` tunes the level to the link (16 "
                         "up to 64), a number is a fixed ceiling; while the service throttles (429, 503, 500 "
                         "OperationTimedOut) the limit halves and then grows back.",
        shown="auto|N", default="auto", show_default=True, parse=parse_concurrency, scope="session"))
    memory: int = field(default=256 * MiB, metadata=_flag(
        "--memory-mb", "Bytes in flight (read buffers), one budget shared by all files.",
        shown="F", kind=float, default=256,
        show_default=True, parse=lambda v: _mib(v, "--memory-mb", MiB, MAX_MEMORY), scope="session"))
    overwrite: Overwrite = field(default=Overwrite.TRUE, metadata=_flag(None, parse=Overwrite.parse))
    put_md5: bool = field(default=True, metadata=_flag(
        "--put-md5/--no-put-md5", "Uploads: store the whole-file MD5 as the blob's Content-MD5 (each block always "
                                  "carries its own check, see `--block-check`).",
        kind=bool, default=True, show_default=True))
    block_check: BlockCheck = field(default=BlockCheck.AUTO, metadata=_flag(
        "--block-check", "Uploads: the check each block carries, which the service verifies: `auto` is a Storage "
                         "CRC64 on Azure (`x-ms-content-crc64`, ~0.06 s of CPU per GiB) and an MD5 on the emulator "
                         "(Azurite computes CRC64s in JavaScript, ~20 s of its CPU per GiB); without the awscrt wheel "
                         "`auto` is an MD5 and `crc64` is refused.", shown="auto|crc64|md5",
        kind=tuple(m.value for m in BlockCheck), default="auto", show_default=True, parse=BlockCheck.parse))
    check_md5: CheckMd5 = field(default=CheckMd5.FAIL_IF_DIFFERENT, metadata=_flag(
        "--check-md5", "Downloads: check the bytes against the blob's Content-MD5 (as AzCopy), or, for a blob "
                       "blobsync wrote in blocks, against the CRC64 it stored with it (bound to that Content-MD5; "
                       "~30x cheaper).",
        shown="NoCheck|LogOnly|FailIfDifferent|FailIfDifferentOrMissing",
        kind=tuple(m.value for m in CheckMd5), default="FailIfDifferent", show_default=True, parse=CheckMd5.parse))
    preserve_last_modified_time: bool = field(default=False, metadata=_flag(None))
    content_type: str | None = field(default=None, metadata=_flag(
        "--content-type", "Content-Type of the blobs; model and array files (`.pt`, `.pth`, `.ckpt`, `.safetensors`, "
                          "`.h5`, `.joblib`, `.pkl`, `.onnx`, `.npy`, `.npz`, `.parquet`, `.gguf`, ...) are "
                          "`application/octet-stream`.", shown="T", default_text="guessed from the name"))
    guess_mime_type: bool = field(default=True, metadata=_flag(  # False: octet-stream unless content_type
        "--no-guess-mime-type", "`application/octet-stream` unless `--content-type`.", kind=bool,
        default=False, parse=lambda v: not v))
    metadata: Mapping[str, str] = field(default_factory=dict, metadata=_flag(
        "--metadata", "Blob metadata (blobsync also stores the source mtime as `mtime`, RFC 3339, as rclone does; "
                      "`mtime`, `blobsyncplaceholder` and `blobsynccrc64` are blobsync's own names).",
        shown="\"k=v;k2=v2\"", parse=parse_metadata))
    tier: str | None = field(default=None, metadata=_flag(
        "--block-blob-tier", "Access tier.",
        shown="Hot|Cool|Cold|Archive|None", default_text="account default", kind=(*TIERS, "None"),
        parse=tier_named))
    create_container: bool = field(default=False, metadata=_flag(
        "--create-container", "Create the container if it does not exist.", kind=bool, default=False,
        journal=False))
    recursive: bool = field(default=False, metadata=_flag(None))
    s2s_preserve_properties: bool = field(default=True, metadata=_flag(
        "--s2s-preserve-properties/--no-s2s-preserve-properties", "Blob to blob: the copy keeps the source's "
        "content type, encoding, disposition, language, cache control, Content-MD5 and metadata.", kind=bool,
        default=True, show_default=True))
    s2s_preserve_access_tier: bool = field(default=True, metadata=_flag(
        "--s2s-preserve-access-tier/--no-s2s-preserve-access-tier", "Blob to blob: the copy keeps the source's "
        "access tier (Hot, Cool, Cold) unless --block-blob-tier names one.", kind=bool, default=True,
        show_default=True))
    s2s_preserve_blob_tags: bool = field(default=False, metadata=_flag(
        "--s2s-preserve-blob-tags", "Blob to blob: the copy keeps the source's blob index tags (--blob-tags names "
        "more over them).", kind=bool, default=False))
    s2s_via_client: bool = field(default=False, metadata=_flag(
        "--s2s-via-client", "Blob to blob: move the bytes through this machine instead of having the destination's "
        "service read the source (done on its own, and said, when the service cannot reach the source).",
        kind=bool, default=False))
    follow_symlinks: bool = field(default=False, metadata=_flag(
        "--follow-symlinks", "Follow symbolic links (otherwise they are skipped with a note); a link that leads back "
                             "to a folder above it (a loop) is skipped with a note naming it.",
        kind=bool, default=False))
    journal_path: Path | None = field(default=None, metadata=_flag(
        "--journal", "The job journal.",
        shown="PATH", default_text="`$XDG_STATE_HOME/blobsync/journal.db` (else `~/.local/state/blobsync/journal.db`)",
        kind=Path,
        journal=False, scope="session"))
    max_retries: int = field(default=8, metadata=_flag(
        "--max-retries", "Retries per request (429, 500, 502, 503, 504, 408, timeouts, resets, corrupted bodies).",
        shown="N", kind=int, default=8, show_default=True, journal=False, scope="session"))
    retry_deadline: float = field(default=900.0, metadata=_flag(
        "--retry-deadline", "A request stops retrying after this many seconds.", shown="S", kind=float, default=900,
        show_default=True, journal=False, scope="session"))
    stall_timeout: float = field(default=120.0, metadata=_flag(
        "--stall-timeout", "A request whose body or response makes no progress for this long is aborted and retried "
                           "(not a total-time limit: a slow but moving transfer is never cut off).",
        shown="S", kind=float, default=120, show_default=True, journal=False, scope="session"))
    cap_mbps: float | None = field(default=None, metadata=_flag(  # for the whole job, as AzCopy's --cap-mbps
        "--cap-mbps", "Cap the job's bandwidth in megabits per second: one token bucket shared by every connection, "
                      "uploads and downloads, paced in 256 KiB slices, and by every worker of `--processes` (on "
                      "`--cluster`, split among the workers busy with the job, again every second).", shown="N",
        kind=float, scope="session"))
    proxy: str | None = field(default=None, metadata=_flag(  # over the environment's proxies; never journaled
        "--proxy", "Proxy for every request, http://[user:password@]host:port.", metavar="URL", journal=False,
        shown="URL", default_text="HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, minus NO_PROXY", scope="session"))
    properties: Mapping[str, str] = field(default_factory=dict, metadata=_flag(  # uploads: cache_control, ...
        None, "Uploads: the blob's {title} header (returned on download).", group=BLOB_PROPERTIES,
        parse=lambda values: {k: v for k, v in values.items() if v is not None}))
    blob_tags: Mapping[str, str] = field(default_factory=dict, metadata=_flag(
        "--blob-tags", "Blob index tags (at most 10; URL-encode `&` and `=` inside values).",
        shown="\"k1=v1&k2=v2\"", parse=parse_blob_tags))
    trusted_suffixes: tuple[str, ...] = field(default=(), metadata=_flag(  # beside Azure's own; never journaled
        "--trusted-microsoft-suffixes", "More host suffixes (';'-separated) that account keys, Azure AD tokens and a "
        "copy's source credential may go to, beside *.core.windows.net and the national clouds' (a SAS in the URL "
        "goes anywhere).",
        metavar="SUFFIXES", parse=parse_suffixes, journal=False, scope="session"))

    # Incremental writes (blobsync.torch's incremental checkpoints; library only): a block equal to the same block
    # of an earlier blob is staged by the service from that blob, not sent. `blocks_from` names that blob (a write of
    # one blob) or the folder holding each file's blob of the same relative name (a folder's upload), in the
    # destination's container; its digests are read from `<blob>.blocks` beside it, which `block_digests` writes.
    blocks_from: str | None = field(default=None, metadata=_flag(None))
    block_digests: bool = field(default=False, metadata=_flag(None))

    def __repr__(self) -> str:
        # A proxy's password (user:password@) never shows: reprs reach logs, tracebacks and notebooks.
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return redact(f"TransferConfig({shown})")

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled (a Client handed to a spawned process) as its fields, the read-only mappings as plain dicts;
        # __post_init__ checks and freezes them again where it is unpickled.
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return _rebuilt, ({k: dict(v) if isinstance(v, Mapping) else v for k, v in values.items()},)

    def __post_init__(self) -> None:
        self._check_limits()
        self._check_text()
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))
        object.__setattr__(self, "blob_tags", MappingProxyType(parse_blob_tags(
            "&".join(f"{quote(k)}={quote(v)}" for k, v in self.blob_tags.items()))))

    def _check_limits(self) -> None:
        """Every number finite and within a range stated as a person writes it; enums and bools mean what the
        caller wrote (False is FALSE, "false" is FALSE), whatever the Python type."""
        set_ = functools.partial(object.__setattr__, self)
        for name, kind in _typed_fields(type(self)):  # each field read as its declared type says
            if issubclass(kind, Enum):
                set_(name, choice(getattr(self, name), kind, name))
            elif kind is bool:
                set_(name, boolean(getattr(self, name), name))
        set_("concurrency", _concurrency_value(self.concurrency))
        _bytes_in(self.block_size, "block_size (--block-size-mb)", MIN_BLOCK_SIZE, MAX_BLOCK_SIZE)
        if self.put_blob_size is not None:
            _bytes_in(self.put_blob_size, "put_blob_size (--put-blob-size-mb)", 0, MAX_PUT_BLOB_SIZE)
        _bytes_in(self.memory, "memory (--memory-mb)", MiB, MAX_MEMORY)
        if self.memory < self.block_size:
            raise UsageError(f"memory (--memory-mb) {_size_text(self.memory)} must hold at least one block "
                             f"(--block-size-mb {_size_text(self.block_size)})")
        if self.cap_mbps is not None:
            number(self.cap_mbps, "cap_mbps (--cap-mbps)", 0.001, 1_000_000, " Mbit/s")
        number(self.max_retries, "max_retries (--max-retries)", 0, 100, integer=True)
        number(self.retry_deadline, "retry_deadline (--retry-deadline)", 0.1, 30 * 86400, " seconds")
        number(self.stall_timeout, "stall_timeout (--stall-timeout)", 0.1, 86400, " seconds")
        set_("journal_path", optional_path(self.journal_path, "journal_path (--journal)"))
        for name in ("content_type", "tier", "proxy", "blocks_from"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise UsageError(f"invalid {name}={getattr(self, name)!r}: expected text or None")
        if self.blocks_from is not None and ("://" in self.blocks_from or not self.blocks_from.strip("/")):
            raise UsageError(f"invalid blocks_from={self.blocks_from!r}: the name of a blob or folder in the "
                             "destination's container (no URL, no SAS)")
        suffixes = self.trusted_suffixes
        if isinstance(suffixes, str) or not all(isinstance(x, str) for x in suffixes):
            raise UsageError(f"invalid trusted_suffixes={suffixes!r}: a tuple of host names or domains")
        set_("trusted_suffixes", parse_suffixes(";".join(suffixes)))
        for name in ("metadata", "properties", "blob_tags"):
            if not isinstance(getattr(self, name), Mapping):
                raise UsageError(f"invalid {name}={getattr(self, name)!r}: expected a mapping of text to text")

    def _check_text(self) -> None:
        """Every text that reaches a request header: checked here, before anything is sent."""
        if self.tier is not None and self.tier not in TIERS:
            raise UsageError(f"invalid --block-blob-tier {self.tier!r}: use one of {', '.join(TIERS)}")
        if self.content_type is not None:
            check_header_text(self.content_type, "--content-type")
        if self.proxy is not None:
            check_proxy_url(self.proxy)
        for key, value in self.metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise UsageError(f"invalid metadata {key!r}: names and values are text")
            check_metadata(key, value)
        for key, value in self.properties.items():
            if key not in BLOB_PROPERTIES:
                raise UsageError(f"unknown blob property {key!r}: use one of {', '.join(BLOB_PROPERTIES)}")
            check_header_text(value, "--" + key.replace("_", "-"))

    @property
    def auto_concurrency(self) -> bool:
        return self.concurrency == AUTO

    @property
    def max_concurrency(self) -> int:
        """The most requests ever in flight: the auto ceiling, or the number given."""
        return AUTO_CEILING if isinstance(self.concurrency, str) else self.concurrency

    @property
    def cap_bytes(self) -> float | None:
        """The bandwidth cap in bytes per second (None: no cap)."""
        return mbps_to_bytes(self.cap_mbps) if self.cap_mbps else None

    @property
    def start_concurrency(self) -> int:
        return AUTO_START if isinstance(self.concurrency, str) else self.concurrency

    @property
    def single_put_limit(self) -> int:
        """Files up to this size go up in one Put Blob."""
        limit = self.block_size if self.put_blob_size is None else self.put_blob_size
        return min(limit, self.memory)

    @classmethod
    def from_mib(
        cls,
        *,
        block_size_mb: float = 8,
        put_blob_size_mb: float | None = None,
        memory_mb: float = 256,
        **kwargs: object,
    ) -> TransferConfig:
        return cls(
            block_size=_mib(block_size_mb, "--block-size-mb", MIN_BLOCK_SIZE, MAX_BLOCK_SIZE),
            put_blob_size=None if put_blob_size_mb is None
            else _mib(put_blob_size_mb, "--put-blob-size-mb", 0, MAX_PUT_BLOB_SIZE),
            memory=_mib(memory_mb, "--memory-mb", MiB, MAX_MEMORY),
            **kwargs,  # type: ignore[arg-type]
        )

    def session_key(self) -> tuple[object, ...]:
        """The values of the session fields: two configs with the same key can run on one session."""
        return tuple(getattr(self, name) for name in session_fields())

    def in_session(self, session: TransferConfig) -> TransferConfig:
        """This config as a call on `session`'s session runs it: every session field left at its default takes
        the session's value (a Client's cap, a `blobsync run --max-retries`); one set to another value stays, and
        the call then gets a session of its own (Session.context)."""
        changes = {name: getattr(session, name) for name in session_fields()
                   if getattr(self, name) == _DEFAULTS[name] and getattr(self, name) != getattr(session, name)}
        if not changes:
            return self
        if "memory" in changes and changes["memory"] < self.block_size:
            changes["memory"] = self.memory  # the session's budget cannot hold this call's block: keep the call's
        return replace(self, **changes)

    def journal_options(self) -> dict[str, object]:
        """The options worth keeping with a job (for 'jobs show' and 'jobs resume'); no secrets live here."""
        return self._plain(lambda flag: flag.journal)

    def worker_options(self) -> dict[str, object]:
        """Every option a machine running part of the job needs (not the journal, the proxy or container
        creation, which are the client's), as plain values for `from_journal`."""
        return {**self._plain(lambda flag: flag.decl != "--journal" and flag.decl != "--proxy"),
                "create_container": False}

    def _plain(self, wanted: Callable[[Flag], bool]) -> dict[str, object]:
        out: dict[str, object] = {}
        for f in fields(self):
            flag = f.metadata.get("flag")
            if flag is not None and wanted(flag):
                value = getattr(self, f.name)
                out[f.name] = value.value if isinstance(value, Enum) else dict(value) if isinstance(
                    value, Mapping) else value
        return out

    @classmethod
    def from_journal(cls, options: Mapping[str, object], **overrides: object) -> Self:
        """The config a job was journaled with (`journal_options`), its enum fields read back from their words by
        the same rule as any caller's (see _typed_fields), with `overrides` on top."""
        known = dict(options)
        if "concurrency" in known:  # an int in journals written before "auto" existed; either form is read back
            known["concurrency"] = parse_concurrency(known["concurrency"])  # type: ignore[arg-type]
        known.update(overrides)
        return cls(**known)  # type: ignore[arg-type]


def _rebuilt(values: dict[str, Any]) -> TransferConfig:
    return TransferConfig(**values)


def session_fields() -> tuple[str, ...]:
    """The fields whose Flag says "session": the same for every call on one session."""
    return _SESSION_FIELDS


_SESSION_FIELDS = tuple(f.name for f in fields(TransferConfig) if f.metadata["flag"].scope == "session")
_DEFAULTS: dict[str, object] = {f.name: f.default for f in fields(TransferConfig) if f.name in _SESSION_FIELDS}
