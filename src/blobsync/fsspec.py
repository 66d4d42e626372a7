"""An fsspec filesystem on blobsync's engine (protocol "blobsync"): pandas, pyarrow, Dask and the rest of the Python
data ecosystem read and write blobs through it, with resumable, verified put/get and bounded concurrency."""

from __future__ import annotations

import contextlib
import glob
import io
import logging
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from fsspec.spec import AbstractFileSystem  # type: ignore[import-untyped]

from blobsync.backends.base import BlobProperties
from blobsync.blobfile import BlobReader, BlobWriter
from blobsync.client import Client
from blobsync.config import Overwrite, TransferConfig
from blobsync.errors import (
    AuthError,
    BlobNotFoundError,
    ConflictError,
    ContainerNotFoundError,
    UnsafeTargetError,
    UsageError,
)

PROTOCOL = "blobsync"
log = logging.getLogger("blobsync")
# The folders a recursive put() of this thread or task walks: a link below one of them is not followed.
_WALKED: ContextVar[tuple[str, ...]] = ContextVar("blobsync_fsspec_walked", default=())


@contextlib.contextmanager
def _walking(lpath: Any, recursive: bool) -> Iterator[None]:
    """While a recursive put or get runs: the local folders it was given, below which no link is followed."""
    roots = ([lpath] if isinstance(lpath, str | os.PathLike) else list(lpath)) if recursive else []
    token = _WALKED.set(tuple(os.path.abspath(r) for r in roots))
    try:
        yield
    finally:
        _WALKED.reset(token)


def _link_below(path: str, roots: tuple[str, ...]) -> str | None:
    """The first link on the way from a walked root down to `path` (the file itself included), or None."""
    for root in roots:
        if path == root or not path.startswith(root.rstrip(os.sep) + os.sep):
            continue
        here = root
        for part in os.path.relpath(path, root).split(os.sep):
            here = os.path.join(here, part)
            if os.path.islink(here):
                return here
    return None


class BlobFile(io.BufferedReader):
    """A blob opened 'rb' through the filesystem: buffered, seekable, one version, and what fsspec's own file
    objects carry (`fs`, `path`, `size`, `info()`)."""

    def __init__(self, raw: BlobReader, fs: BlobsyncFileSystem, path: str, details: dict[str, Any]) -> None:
        super().__init__(raw, buffer_size=min(raw.block_size, 1 << 20))
        self.fs = fs
        self.path = path
        self.size = raw.size
        self.details = details

    def info(self) -> dict[str, Any]:
        return dict(self.details)


class BlobsyncFileSystem(AbstractFileSystem):  # type: ignore[misc]  # fsspec is untyped
    """`fsspec.filesystem("blobsync", account_url="https://acct.blob.core.windows.net", credential=...)`; paths are
    'container/path/to/blob' (or 'blobsync://container/...'). Without `account_url`, the account is the one
    AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT names (so that a bare 'blobsync://container/path'
    works where no options can be passed, such as Lightning's ModelCheckpoint dirpath). Folders are name prefixes,
    as on Blob Storage: a folder exists while a blob is under it (no empty folders). One blobsync Client serves
    every call: one connection pool, token and budget; `config` is its TransferConfig (block size, concurrency,
    journal...)."""

    protocol = PROTOCOL
    root_marker = ""

    def __init__(self, account_url: str | None = None, credential: object = None, config: TransferConfig | None = None,
                 env: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if account_url is None:
            from blobsync.backends.azure.auth import account_url_from_env

            account_url = account_url_from_env(os.environ if env is None else env)
        if not isinstance(account_url, str) or not account_url:
            raise UsageError("the blobsync filesystem needs an account: pass account_url='https://<account>.blob."
                             "core.windows.net', or set AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT")
        self.account_url = account_url.rstrip("/")
        self.client = Client(self.account_url, config, credential=credential, env=env)
        self.config = self.client.aio.config
        self._known: set[str] = set()  # containers known to exist

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        text = str(path[0] if isinstance(path, list) else path)
        if text.startswith(f"{PROTOCOL}://"):
            text = text[len(PROTOCOL) + 3:]
        return text.strip("/")

    # --- what there is -------------------------------------------------------------------------------------

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        if not path:
            raise NotImplementedError("listing the account's containers: name a container")
        container = path.split("/", 1)[0]
        try:
            blobs, folders = self.client.ls_level(path)
        except ContainerNotFoundError:
            raise FileNotFoundError(path) from None
        entries = [self._folder(f"{container}/{f.rstrip('/')}") for f in folders]
        entries += [self._file(container, b) for b in blobs]
        if not entries:
            single = self._stat(path)
            if single is None:
                if "/" not in path:
                    return []  # an empty container
                raise FileNotFoundError(path)
            entries = [self._file(container, single)]
        entries.sort(key=lambda e: str(e["name"]))
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        if "/" not in path:  # a container
            if not path:
                return self._folder("")
            try:
                self.client.ls_level(path)
            except ContainerNotFoundError:
                raise FileNotFoundError(path) from None
            return self._folder(path)
        found = self._stat(path)
        if found is not None:
            return self._file(path.split("/", 1)[0], found)
        blobs, folders = self.client.ls_level(path)
        if blobs or folders:
            return self._folder(path)
        raise FileNotFoundError(path)

    def _stat(self, path: str) -> BlobProperties | None:
        if "/" not in path:
            return None
        try:
            return self.client.stat(path)
        except (BlobNotFoundError, ContainerNotFoundError):
            return None

    @staticmethod
    def _folder(name: str) -> dict[str, Any]:
        return {"name": name, "size": 0, "type": "directory"}

    @staticmethod
    def _file(container: str, blob: BlobProperties) -> dict[str, Any]:
        return {"name": f"{container}/{blob.name}", "size": blob.size, "type": "file", "etag": blob.etag,
                "last_modified": blob.last_modified, "content_md5": blob.content_md5,
                "content_type": blob.content_type}

    def modified(self, path: str) -> Any:
        return self.info(path)["last_modified"]

    # --- bytes ---------------------------------------------------------------------------------------------

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> Any:
        path = self._strip_protocol(path)
        if mode == "rb":
            props = self._stat(path)
            if props is None:
                raise FileNotFoundError(path)
            raw = self.client.raw_reader(path, props=props)
            return BlobFile(raw, self, path, self._file(path.split("/", 1)[0], props))
        if mode == "xb":
            if self._stat(path) is not None:
                raise FileExistsError(path)
            writer = self.client.open(path, "wb", config=self._config(Overwrite.FALSE))
        else:
            writer = self.client.open(path, mode)
        assert isinstance(writer, BlobWriter)
        writer.fs, writer.path = self, path  # as fsspec's own file objects have them
        return writer

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        path = self._strip_protocol(path)
        if start is None and end is None:  # the whole blob: parallel ranges, checked against its Content-MD5
            try:
                return bytes(self.client.get(path))
            except (BlobNotFoundError, ContainerNotFoundError):
                raise FileNotFoundError(path) from None
        got = self.cat_ranges([path], [start], [end], on_error="raise")
        return bytes(got[0])

    def cat_ranges(self, paths: list[str], starts: Any, ends: Any, max_gap: Any = None, on_error: str = "return",
                   **kwargs: Any) -> list[Any]:
        """Byte ranges of blobs, all fetched at once under the session's request budget (fsspec's default fetches
        them one after the other); a range that fails is its error (on_error="return") or raised."""
        count = len(paths)
        starts = starts if isinstance(starts, list) else [starts] * count
        ends = ends if isinstance(ends, list) else [ends] * count
        if len(starts) != count or len(ends) != count:
            raise ValueError("cat_ranges: paths, starts and ends must be of one length")
        names = [self._strip_protocol(p) for p in paths]
        out: list[Any] = []
        for name, got in zip(names, self.client.read_ranges(list(zip(names, starts, ends, strict=True))),
                             strict=True):
            if isinstance(got, bytes):
                out.append(got)
                continue
            error = FileNotFoundError(name) if isinstance(got, BlobNotFoundError | ContainerNotFoundError) else got
            if on_error == "raise":
                raise error
            out.append(error)
        return out

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        try:
            self.client.put(value, path, self._config(Overwrite.FALSE if mode == "create" else Overwrite.TRUE))
        except ConflictError:
            raise FileExistsError(path) from None

    def _config(self, overwrite: Overwrite) -> TransferConfig:
        from dataclasses import replace

        return replace(self.config, overwrite=overwrite)

    # --- files in and out: blobsync's resumable, verified transfers --------------------------------------------

    def put(self, lpath: Any, rpath: Any, recursive: bool = False, **kwargs: Any) -> None:
        """fsspec's put; with `recursive`, a link found below a folder named is skipped (as `cp -r` does), never
        the file it points to uploaded."""
        with _walking(lpath, recursive):
            super().put(lpath, rpath, recursive=recursive, **kwargs)

    def put_file(self, lpath: str, rpath: str, callback: Any = None, mode: str = "overwrite", **kwargs: Any
                 ) -> None:
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath):
            return  # a folder: its files come one by one (no empty folders here)
        link = _link_below(os.path.abspath(lpath), _WALKED.get())
        if link is not None:
            log.warning("%s: a symbolic link, skipped (links found in a folder are not followed)", link)
            return
        overwrite = Overwrite.FALSE if mode == "create" else Overwrite.TRUE
        self.client.copy(lpath, self.client.url_for(rpath), self._config(overwrite), raise_on_error=True)

    def get(self, rpath: Any, lpath: Any, recursive: bool = False, **kwargs: Any) -> None:
        """fsspec's get; with `recursive`, no folder below the local folder named is a link written through (a
        blob's bytes never land outside it), as a `cp -r` download."""
        with _walking(lpath, recursive):
            super().get(rpath, lpath, recursive=recursive, **kwargs)

    def get_file(self, rpath: str, lpath: str, callback: Any = None, outfile: Any = None, **kwargs: Any) -> None:
        rpath = self._strip_protocol(rpath)
        link = _link_below(os.path.abspath(lpath), _WALKED.get())
        if link is not None:
            raise UnsafeTargetError(f"{link}: is a symbolic link; refusing to write through it (remove it, then "
                                    "run again)")
        if self.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return
        if outfile is not None:
            outfile.write(self.cat_file(rpath))
            return
        try:
            self.client.copy(self.client.url_for(rpath), lpath, self.config, raise_on_error=True)
        except (BlobNotFoundError, ContainerNotFoundError):
            raise FileNotFoundError(rpath) from None

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """A blob to blob copy the service makes (the bytes never pass through here; the source's properties and
        metadata kept), journaled and resumable as `cp URL URL` is."""
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.isdir(path1):
            return  # folders are prefixes: nothing to make
        try:
            self.client.copy(self.client.url_for(path1), self.client.url_for(path2), self.config, raise_on_error=True)
        except (BlobNotFoundError, ContainerNotFoundError):
            raise FileNotFoundError(path1) from None

    # --- removing and folders -------------------------------------------------------------------------------

    def rm_file(self, path: str) -> None:
        path = self._strip_protocol(path)
        if not self.client.delete(path) and not self.isdir(path):
            raise FileNotFoundError(path)

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        """fsspec's rm; a folder (or container) removed recursively is `rm -r URL`: one listing and Blob Batch
        deletes of up to 256 blobs a request, under the Client's budget, instead of a request per blob."""
        name = self._strip_protocol(path) if isinstance(path, str) else ""
        if recursive and maxdepth is None and name and not glob.has_magic(name):
            self._rm_tree(name)
            return
        for p in reversed(self.expand_path(path, recursive=recursive, maxdepth=maxdepth)):
            name = self._strip_protocol(p)
            if "/" in name:
                self.client.delete(name)  # a folder (prefix) has nothing to delete of its own
        self.invalidate_cache()

    def _rm_tree(self, name: str) -> None:
        try:
            report = self.client.remove(self.client.url_for(name), recursive=True, raise_on_error=True)
        except ContainerNotFoundError:
            raise FileNotFoundError(name) from None
        finally:
            self.invalidate_cache()
        if not report.files_deleted and not report.files_skipped:
            raise FileNotFoundError(name)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Folders are name prefixes: nothing to make below a container. A container is made when it is what is
        asked for, or (`create_parents`) when a folder in it is and it is missing."""
        container, _, folder = self._strip_protocol(path).partition("/")
        if container and (not folder or create_parents):
            self._container(container)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.mkdir(path, create_parents=True)

    def _container(self, name: str) -> None:
        """Make the container unless it exists. A SAS for one container may not make any (Dask, pyarrow and
        pandas call makedirs before every write): the container it is for is there, so a refusal is no error."""
        if name in self._known:
            return
        with contextlib.suppress(AuthError):
            self.client.make_container(name)
        self._known.add(name)

    def rmdir(self, path: str) -> None:
        """Folders vanish with their last blob; nothing to do."""
