"""The per-file operation every path executes (a plain job, --processes, --cluster, a Client's put): what one file's
transfer is, as a picklable record, and the one place such a record becomes an upload, a download or a copy."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from blobsync.backends.base import INVALID_LENGTH, BlobProperties, Capabilities, Store
from blobsync.engine.blocks import block_count, choose_block_size
from blobsync.engine.context import EngineContext
from blobsync.engine.listing import as_properties
from blobsync.errors import ServiceError
from blobsync.journal import CommittedBlob, FileRow, FileState
from blobsync.journal.index import Entry
from blobsync.local.files import FileIdentity, Source
from blobsync.local.target import safe_join
from blobsync.redact import printable
from blobsync.report import FileResult

if TYPE_CHECKING:  # imported with the first operation of their kind: a no-op sync never loads them
    from blobsync.engine.download import FileDownloader
    from blobsync.engine.s2s import BlobCopier
    from blobsync.engine.upload import FileUploader


class OpKind(StrEnum):
    UPLOAD = "upload"  # a local file to a blob
    DOWNLOAD = "download"  # a blob to a local file
    COPY = "copy"  # a blob of another store to a blob
    PUT = "put"  # data a call holds (bytes, a file object, generated) to a blob: never leaves this process


@dataclass(frozen=True)
class FileOp:
    """One file's transfer. `rel` is the local path under the job's root ('/'-separated; a copy: the name under the
    source prefix); `blob` the object written (upload, copy, put) or read (download). A nonce set by a cluster's
    client makes whichever worker runs the operation (once, or again after a worker died) stage the same parts."""

    kind: OpKind
    rel: str
    blob: str
    size: int
    mtime_ns: int
    etag: str | None = None  # download, copy: the version listed (read If-Match)
    md5: bytes | None = None  # download, copy: the Content-MD5 listed
    exact_mtime: bool = False  # download, copy: mtime_ns is the source file's own (stored by blobsync)
    source: str = ""  # copy: the source blob's name
    tier: str | None = None  # copy: the source blob's access tier
    inode: int = 0  # upload of a walked folder: the file the walk listed (0: a file named by the user)
    crc64: bytes | None = None  # download, copy: the whole blob's CRC64 blobsync stored with it, as listed
    nonce: str = ""
    data: Source | None = field(default=None, compare=False, repr=False)  # put: what is written
    # upload on a worker: the blob as blobsync last committed it (the client's journal), what a delta builds on
    delta: CommittedBlob | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def of_entry(kind: OpKind, entry: Entry, blob: str = "") -> FileOp:
        """The download or copy of a listed blob (`blob`: a copy's destination name)."""
        name = entry.name or entry.rel
        return FileOp(kind, entry.rel, blob if kind is OpKind.COPY else name, entry.size, entry.mtime_ns, entry.etag,
                      entry.md5, entry.exact_mtime, name if kind is OpKind.COPY else "", entry.tier,
                      crc64=entry.crc64)

    def listed(self) -> BlobProperties:
        """The blob read (a download's, a copy's source) as it was listed."""
        return as_properties(Entry(self.rel, self.size, self.mtime_ns, self.exact_mtime, self.md5, self.etag,
                                   self.source or self.blob, tier=self.tier, crc64=self.crc64))


def upload_block_size(op: FileOp, requested: int, caps: Capabilities) -> int:
    """The block size of an upload: its committed version's where it is a delta (blocks line up only at the same
    size) and the file still fits that many blocks, else the engine's rule for the size asked for."""
    if op.delta is not None and op.size <= op.delta.block_size * caps.max_parts:
        return op.delta.block_size
    return choose_block_size(op.size, requested, caps)


class Performer:
    """Carries out the operations of one job on its engine context: files under `root`, a copy's blobs read from
    `source`. Each kind's engine part is made (and its code imported) with its first operation."""

    def __init__(self, ctx: EngineContext, root: Path, source: Store | None = None, base: Path | None = None
                 ) -> None:
        self.ctx, self.root, self.source = ctx, root, source
        self.base = base or root  # no link below it is followed (root may be a folder blobsync made in it)
        self._uploader: FileUploader | None = None
        self._downloader: FileDownloader | None = None
        self._copier: BlobCopier | None = None

    @property
    def copier(self) -> BlobCopier | None:
        return self._copier

    async def __call__(self, row: FileRow, op: FileOp) -> FileResult:
        if op.size == INVALID_LENGTH and op.kind in (OpKind.DOWNLOAD, OpKind.COPY):
            raise ServiceError(f"the service listed {printable(op.blob)!r} with an invalid length; this "
                               "blob is not transferred", code="InvalidContentLength")
        if op.kind is OpKind.DOWNLOAD:
            return await self._downloads().download(row, op.listed(), safe_join(self.root, op.rel))
        if op.kind is OpKind.COPY:
            return await self._copies().copy(self._adopt_copy(row, op), op.listed())
        if op.kind is OpKind.PUT:
            assert op.data is not None
            return await self._uploads().upload_source(row, op.data)
        path = self.root / op.rel
        # Opened as the walk listed it (its inode; no link unless --follow-symlinks).
        return await self._uploads().upload(self._adopt_upload(row, op, path), path, op.inode or None, self.root)

    def _uploads(self) -> FileUploader:
        if self._uploader is None:
            from blobsync.engine.upload import FileUploader

            self._uploader = FileUploader(self.ctx)
        return self._uploader

    def _downloads(self) -> FileDownloader:
        if self._downloader is None:
            from blobsync.engine.download import FileDownloader

            self._downloader = FileDownloader(self.ctx, self.base)
        return self._downloader

    def _copies(self) -> BlobCopier:
        if self._copier is None:
            from blobsync.engine.s2s import BlobCopier

            assert self.source is not None
            self._copier = BlobCopier(self.ctx, self.source)
        return self._copier

    def _adopt_upload(self, row: FileRow, op: FileOp, path: Path) -> FileRow:
        """A file new to this journal takes the operation's nonce: the parts any earlier run staged are found; and
        the commit record its client sent, so the upload is a delta as on the client."""
        ctx = self.ctx
        if op.delta is not None:
            ctx.journal.remember_commit(ctx.store.container_url, op.blob, op.delta)
        if not op.nonce or row.nonce is not None or op.size <= ctx.config.single_put_limit:
            return row
        try:
            ident = FileIdentity.of(os.stat(path))
        except OSError:
            return row  # the upload itself reports why the file cannot be read
        block_size = upload_block_size(op, ctx.config.block_size, ctx.store.capabilities)
        ctx.journal.start_file(row.id, nonce=op.nonce, block_size=block_size, n_blocks=block_count(op.size, block_size),
                               size=ident.size, mtime_ns=ident.mtime_ns, inode=ident.inode, reset=True,
                               ctime_ns=ident.ctime_ns)
        ctx.journal.flush()
        return replace(row, nonce=op.nonce, block_size=block_size, size=ident.size, mtime_ns=ident.mtime_ns,
                       inode=ident.inode, ctime_ns=ident.ctime_ns, state=FileState.ACTIVE)

    def _adopt_copy(self, row: FileRow, op: FileOp) -> FileRow:
        """As `_adopt_upload`, for a copy staged from the source's URL."""
        from blobsync.engine.s2s import copy_block_size, one_request

        ctx = self.ctx
        caps = ctx.store.capabilities
        if not op.nonce or row.nonce is not None or one_request(ctx.config, caps, op.size):
            return row
        block = copy_block_size(ctx.config, caps, op.size)
        ctx.journal.start_file(row.id, nonce=op.nonce, block_size=block, n_blocks=block_count(op.size, block),
                               size=op.size, mtime_ns=op.mtime_ns, inode=0, reset=True, etag=op.etag)
        ctx.journal.flush()
        return replace(row, nonce=op.nonce, block_size=block, etag=op.etag, state=FileState.ACTIVE)
