"""How cp reads its two arguments, as AzCopy does: the direction, a trailing wildcard, the level --as-subdir adds."""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from blobsync.backends.base import Location
from blobsync.backends.registry import is_remote, parse_location
from blobsync.errors import UsageError
from blobsync.filters import Filters
from blobsync.naming import folder_prefix, upload_name


@dataclass(frozen=True)
class CopyPlan:
    """What a cp moves: `local` is the file or folder read (upload) or the target (download); `remote` the blob,
    or the prefix names go under; `many` says a folder or prefix is listed (with -r, or a wildcard)."""

    upload: bool
    local: Path
    remote: Location
    filters: Filters
    many: bool
    dest_is_folder: bool = False  # download of one blob: the user wrote a trailing '/'
    base: Path | None = None  # a download into a folder blobsync adds (`local`'s parent): the folder the user named


def _join(prefix: str, name: str) -> str:
    if not name:
        return prefix
    return f"{prefix}{name}" if not prefix or prefix.endswith("/") else f"{prefix}/{name}"


def _wildcard_tail(path: str, what: str, seps: str = "/") -> tuple[str, str | None]:
    """(`path` without a last segment holding '*', that segment) or (`path`, None); '*' elsewhere is refused.
    `seps`: the separators of the path (a URL's '/', or a local path's, with '\\' on Windows)."""
    trimmed = path.rstrip(seps)
    cut = max(trimmed.rfind(s) for s in seps)
    head, sep, tail = (trimmed[:cut], trimmed[cut], trimmed[cut + 1:]) if cut >= 0 else ("", "", trimmed)
    if "*" not in tail:
        if "*" in path:
            raise UsageError(f"{what}: '*' works only in the last segment (e.g. folder/*.pt)")
        return path, None
    if "*" in head:
        raise UsageError(f"{what}: '*' works only in the last segment (e.g. folder/*.pt)")
    return head + sep, tail


def _narrow(filters: Filters, wildcard: str | None, recursive: bool) -> Filters:
    if wildcard is None and recursive:
        return filters
    return filters.narrowed(source_wildcard=wildcard, recursive=recursive)


def plan_upload(source: str, dest: str, *, recursive: bool, as_subdir: bool, filters: Filters) -> CopyPlan:
    loc = parse_location(dest)
    given = os.path.expanduser(source)
    # A name that exists as written is taken literally, even with a '*' in it.
    seps = os.sep + (os.altsep or "")
    path, wildcard = (given, None) if os.path.lexists(given) else _wildcard_tail(given, f"source {source!r}", seps)
    local = Path(os.path.abspath(path or "."))
    if wildcard is not None:
        if not local.is_dir():
            raise UsageError(f"source folder {str(local)!r} (before the wildcard) does not exist or is not a folder")
        return CopyPlan(True, local, loc, _narrow(filters, wildcard, recursive), many=True)
    if not local.exists():
        raise UsageError(f"source {source!r} does not exist")
    if not local.is_dir():
        return CopyPlan(True, local, loc, filters, many=False)
    if not recursive:
        raise UsageError(f"source {source!r} is a folder: pass -r/--recursive to upload it (or 'folder/*' for the "
                         "files at its top)")
    # AzCopy's layout: the folder itself becomes a level under the destination, unless --as-subdir=false.
    remote = loc.with_path(_join(loc.path, local.name)) if as_subdir else loc
    return CopyPlan(True, local, remote, filters, many=True)


@dataclass(frozen=True)
class BlobCopyPlan:
    """What a cp between two URLs copies: `source` is the blob or the prefix listed; `dest` the blob written, or
    the prefix the names go under; `many` says a prefix is listed (with -r, or a wildcard)."""

    source: Location
    dest: Location
    filters: Filters
    many: bool


def _source_url(source: str) -> tuple[Location, str | None]:
    """A source URL and its last segment's wildcard, read before parse_location unquotes the path (a '*' written
    %2A is part of a name, not a wildcard)."""
    base, _, query = source.partition("?")
    scheme_host, _, path = base.partition("://")
    host, slash, blob_path = path.partition("/")
    kept, wildcard = _wildcard_tail(blob_path, f"source URL {scheme_host}://{host}/...")
    return parse_location(f"{scheme_host}://{host}{slash}{kept}" + (f"?{query}" if query else "")), wildcard


def plan_blob_copy(source: str, dest: str, *, recursive: bool, as_subdir: bool, filters: Filters) -> BlobCopyPlan:
    """AzCopy's layout between two URLs: one blob to the blob the destination names (or, for a container or a path
    ending in '/', under it by its own name); a prefix with -r becomes a level under the destination unless
    --as-subdir=false; 'prefix/*' copies what is at that level."""
    loc, wildcard = _source_url(source)
    target = parse_location(dest)
    if wildcard is not None:
        narrowed = _narrow(filters, wildcard, recursive)
        return BlobCopyPlan(loc.with_path(folder_prefix(loc.path)), target.with_path(folder_prefix(target.path)),
                            narrowed, many=True)
    if not recursive:
        if not loc.path or loc.path.endswith("/"):
            raise UsageError(f"{loc.display!r} names no blob: add the blob's name, or pass -r to copy everything "
                             "under it")
        name = posixpath.basename(loc.path)
        return BlobCopyPlan(loc, target.with_path(upload_name(target.path, name, single=True)), filters, many=False)
    level = posixpath.basename(loc.path.rstrip("/")) or loc.container
    prefix = _join(target.path, level) if as_subdir else target.path
    return BlobCopyPlan(loc, target.with_path(folder_prefix(prefix)), filters, many=True)


def plan_download(source: str, dest: str, *, recursive: bool, as_subdir: bool, filters: Filters) -> CopyPlan:
    loc, wildcard = _source_url(source)
    target = Path(os.path.abspath(os.path.expanduser(dest)))
    folder = dest.endswith(("/", os.sep))
    if wildcard is not None:
        narrowed = _narrow(filters, wildcard, recursive)
        return CopyPlan(False, target, loc.with_path(folder_prefix(loc.path)), narrowed, many=True)
    if not recursive:
        return CopyPlan(False, target, loc, filters, many=False, dest_is_folder=folder)
    level = posixpath.basename(loc.path.rstrip("/")) or loc.container
    if as_subdir:  # blobsync makes target/level: a link planted there is not followed (see PartFile's root)
        return CopyPlan(False, target / level, loc, filters, many=True, base=target)
    return CopyPlan(False, target, loc, filters, many=True)


def plan_copy(source: str, dest: str, *, recursive: bool, as_subdir: bool = True,
              filters: Filters | None = None) -> CopyPlan:
    """Read cp's arguments; a bad one is a UsageError naming it. The direction follows from which side is a URL."""
    filters = filters or Filters()
    if is_remote(source) and is_remote(dest):
        raise UsageError("two URLs: use plan_blob_copy")
    if is_remote(source):
        return plan_download(source, dest, recursive=recursive, as_subdir=as_subdir, filters=filters)
    if not is_remote(dest):
        raise UsageError(f"destination {dest!r} is not a blob URL (https://<account>.blob.core.windows.net/...): "
                         "one side must be a URL")
    return plan_upload(source, dest, recursive=recursive, as_subdir=as_subdir, filters=filters)
