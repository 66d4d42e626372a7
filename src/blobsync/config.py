"""TransferConfig: every option of a transfer in one frozen, validated record (the CLI flags map onto it)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Literal, Self
from urllib.parse import quote

from blobsync.errors import UsageError
from blobsync.redact import register_secret

MiB = 1024 * 1024
MAX_BLOCK_SIZE = 4000 * MiB
MAX_PUT_BLOB_SIZE = 5000 * MiB
MAX_BLOCKS = 50_000
TIERS = ("Hot", "Cool", "Cold", "Archive")
_RESERVED_METADATA = ("mtime",)
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


class FlagEnum(Enum):
    """An enum whose values are a flag's accepted words, matched case-insensitively."""

    @classmethod
    def flag(cls) -> str:
        return "--" + re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()

    @classmethod
    def parse(cls, text: str) -> Self:
        for member in cls:
            if str(member.value).lower() == text.lower():
                return member
        words = ", ".join(str(m.value) for m in cls)
        raise UsageError(f"invalid {cls.flag()} {text!r}: use one of {words}")


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


# Control characters, CR and LF above all, would end a header line early: what follows would be read as more
# headers, or as a second request on the same connection. HTAB is the one control character a header may hold.
_HEADER_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_META_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a C# identifier (ASCII), as Azure requires


def check_header_text(value: str, what: str, *, ascii_only: bool = False) -> None:
    """Refuse text that cannot be one HTTP header value (UsageError naming `what`), before any request."""
    if _HEADER_CONTROL.search(value):
        raise UsageError(f"invalid {what} {value[:60]!r}: line breaks and other control characters cannot be part "
                         "of an HTTP header")
    try:
        value.encode("ascii" if ascii_only else "latin-1")
    except UnicodeEncodeError as exc:
        allowed = "ASCII" if ascii_only else "Latin-1"
        raise UsageError(f"invalid {what} {value[:60]!r}: an HTTP header holds {allowed} text only") from exc


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
    if _HEADER_CONTROL.search(url):
        raise UsageError("invalid --proxy: line breaks and other control characters cannot be part of a URL")
    if parts.scheme not in ("http", "https") or not parts.hostname or (parts.path not in ("", "/")) or parts.query:
        shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        raise UsageError(f"invalid --proxy {shown!r}: expected http://[user:password@]host:port")
    del port


def check_metadata(key: str, value: str, what: str = "metadata") -> None:
    """Azure's rules for one metadata pair: the name a C# identifier, the value ASCII header text."""
    if not _META_NAME.match(key):
        raise UsageError(f"invalid {what} name {key!r}: letters, digits and '_', not starting with a digit")
    if key.lower() in _RESERVED_METADATA:
        raise UsageError(f"{what} name {key!r} is reserved: blobsync stores the source mtime there")
    check_header_text(value, f"{what} value for {key!r}", ascii_only=True)


# Properties a blob is stored with and returned on download, by AzCopy's flag names.
PROPERTY_HEADERS = {
    "cache_control": "x-ms-blob-cache-control",
    "content_disposition": "x-ms-blob-content-disposition",
    "content_encoding": "x-ms-blob-content-encoding",
    "content_language": "x-ms-blob-content-language",
}
_TAG_TEXT = re.compile(r"^[A-Za-z0-9 +\-./:=_]*$")  # what Azure allows in blob index tag names and values


def parse_blob_tags(text: str | None) -> dict[str, str]:
    """AzCopy's --blob-tags 'k1=v1&k2=v2' (URL-encoded parts): at most 10 tags, Azure's characters and lengths."""
    from urllib.parse import unquote

    tags: dict[str, str] = {}
    for item in (text or "").split("&"):
        if not item.strip():
            continue
        key, sep, value = (unquote(part) for part in item.partition("="))
        if not sep or not key:
            raise UsageError(f"invalid --blob-tags item {item!r}: expected key=value, items joined by '&'")
        if not (len(key) <= 128 and len(value) <= 256 and _TAG_TEXT.match(key) and _TAG_TEXT.match(value)):
            raise UsageError(f"invalid --blob-tags item {item!r}: names up to 128 and values up to 256 characters, "
                             "from letters, digits, space and + - . / : = _")
        tags[key] = value
    if len(tags) > 10:
        raise UsageError(f"--blob-tags has {len(tags)} tags: a blob holds at most 10")
    return tags


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


def _mib(value: float, flag: str, lo: float, hi: int) -> int:
    if not (lo <= value * MiB <= hi):
        raise UsageError(f"{flag} {value:g} is out of range: {lo / MiB:g} to {hi // MiB} MiB")
    return int(value * MiB)


@dataclass(frozen=True)
class TransferConfig:
    """Options of a transfer; sizes in bytes. Build it with `TransferConfig.from_mib(...)` from MiB values."""

    block_size: int = 8 * MiB
    put_blob_size: int | None = None  # None: same as block_size (AzCopy's rule)
    concurrency: Concurrency = AUTO  # requests in flight: "auto" (tuned, up to AUTO_CEILING) or a fixed ceiling
    memory: int = 256 * MiB
    overwrite: Overwrite = Overwrite.TRUE
    put_md5: bool = True
    check_md5: CheckMd5 = CheckMd5.FAIL_IF_DIFFERENT
    preserve_last_modified_time: bool = False
    content_type: str | None = None
    guess_mime_type: bool = True  # False: application/octet-stream unless content_type is given
    metadata: Mapping[str, str] = field(default_factory=dict)
    tier: str | None = None
    create_container: bool = False
    recursive: bool = False
    follow_symlinks: bool = False
    journal_path: Path | None = None
    max_retries: int = 8
    retry_deadline: float = 900.0
    stall_timeout: float = 120.0
    cap_mbps: float | None = None  # megabits per second for the whole job, as AzCopy's --cap-mbps
    proxy: str | None = None  # http(s)://[user:pass@]host:port, over the environment's proxies; never journaled
    properties: Mapping[str, str] = field(default_factory=dict)  # cache_control, content_encoding, ... (uploads)
    blob_tags: Mapping[str, str] = field(default_factory=dict)  # blob index tags set on upload

    def __post_init__(self) -> None:
        if not (1 <= self.block_size <= MAX_BLOCK_SIZE):
            raise UsageError(f"--block-size-mb is out of range: up to {MAX_BLOCK_SIZE // MiB} MiB")
        if self.put_blob_size is not None and not (0 <= self.put_blob_size <= MAX_PUT_BLOB_SIZE):
            raise UsageError(f"--put-blob-size-mb is out of range: 0 to {MAX_PUT_BLOB_SIZE // MiB} MiB")
        if self.concurrency != AUTO and not (
                isinstance(self.concurrency, int) and 1 <= self.concurrency <= 512):
            raise UsageError(f"--concurrency {self.concurrency} is out of range: 'auto' or 1 to 512")
        if self.memory < MiB:
            raise UsageError("--memory-mb must be at least 1")
        if self.memory < self.block_size:
            raise UsageError(
                f"--memory-mb ({self.memory // MiB}) must hold at least one block "
                f"(--block-size-mb {self.block_size / MiB:g})"
            )
        if self.tier is not None and self.tier not in TIERS:
            raise UsageError(f"invalid --block-blob-tier {self.tier!r}: use one of {', '.join(TIERS)}")
        if self.cap_mbps is not None and self.cap_mbps <= 0:
            raise UsageError("--cap-mbps must be positive")
        if self.max_retries < 0 or self.retry_deadline <= 0 or self.stall_timeout <= 0:
            raise UsageError("retry limits and timeouts must be positive")
        if self.content_type is not None:
            check_header_text(self.content_type, "--content-type")
        if self.proxy is not None:
            check_proxy_url(self.proxy)
        for key, value in self.metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise UsageError(f"invalid metadata {key!r}: names and values are text")
            check_metadata(key, value)
        for key, value in self.properties.items():
            if key not in PROPERTY_HEADERS:
                raise UsageError(f"unknown blob property {key!r}: use one of {', '.join(PROPERTY_HEADERS)}")
            check_header_text(value, "--" + key.replace("_", "-"))
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))
        object.__setattr__(self, "blob_tags", MappingProxyType(parse_blob_tags(
            "&".join(f"{quote(k)}={quote(v)}" for k, v in self.blob_tags.items()))))

    @property
    def auto_concurrency(self) -> bool:
        return self.concurrency == AUTO

    @property
    def max_concurrency(self) -> int:
        """The most requests ever in flight: the auto ceiling, or the number given."""
        return AUTO_CEILING if isinstance(self.concurrency, str) else self.concurrency

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
            block_size=_mib(block_size_mb, "--block-size-mb", 1 / 1024, MAX_BLOCK_SIZE),
            put_blob_size=None if put_blob_size_mb is None
            else _mib(put_blob_size_mb, "--put-blob-size-mb", 0, MAX_PUT_BLOB_SIZE),
            memory=_mib(memory_mb, "--memory-mb", 1, 1 << 45),
            **kwargs,  # type: ignore[arg-type]
        )

    def journal_options(self) -> dict[str, object]:
        """The options worth keeping with a job (for 'jobs show' and 'jobs resume'); no secrets live here."""
        return {
            "block_size": self.block_size,
            "put_blob_size": self.put_blob_size,
            "concurrency": self.concurrency,
            "memory": self.memory,
            "overwrite": self.overwrite.value,
            "put_md5": self.put_md5,
            "check_md5": self.check_md5.value,
            "preserve_last_modified_time": self.preserve_last_modified_time,
            "content_type": self.content_type,
            "guess_mime_type": self.guess_mime_type,
            "metadata": dict(self.metadata),
            "tier": self.tier,
            "recursive": self.recursive,
            "follow_symlinks": self.follow_symlinks,
            "cap_mbps": self.cap_mbps,
            "properties": dict(self.properties),
            "blob_tags": dict(self.blob_tags),
        }

    @classmethod
    def from_journal(cls, options: Mapping[str, object], **overrides: object) -> TransferConfig:
        known = dict(options)
        known["overwrite"] = Overwrite.parse(str(known.get("overwrite", "true")))
        known["check_md5"] = CheckMd5.parse(str(known.get("check_md5", "FailIfDifferent")))
        if "concurrency" in known:  # an int in journals written before "auto" existed; either form is read back
            known["concurrency"] = parse_concurrency(known["concurrency"])  # type: ignore[arg-type]
        known.update(overrides)
        return cls(**known)  # type: ignore[arg-type]
