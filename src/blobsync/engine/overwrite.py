"""--overwrite for one write: the preconditions it is sent with, or why the destination is left alone."""

from __future__ import annotations

from blobsync.backends.base import PLACEHOLDER, BlobProperties, Conditions
from blobsync.config import Overwrite
from blobsync.engine.context import EngineContext
from blobsync.engine.mtime import destination_mtime_ns
from blobsync.errors import ConflictError

EXISTS = "exists at the destination (--overwrite false)"


async def write_conditions(ctx: EngineContext, name: str, source_mtime_ns: int, nonce: str | None = None
                           ) -> Conditions | str:
    """The write's preconditions under ctx.config.overwrite (create-only, or over the version compared), or the
    reason the object `name` is to be left as it is. `nonce`: the write's own (a resumed one's), which an empty
    placeholder its crash left behind carries: that one is taken for no object; any other blob is a blob."""
    overwrite = ctx.config.overwrite
    if overwrite is Overwrite.TRUE:
        return Conditions()
    props = await ctx.request(lambda: ctx.store.stat(name))
    if props is None:
        return Conditions(if_none_match_any=True)
    if props.size == 0 and nonce is not None and props.metadata.get(PLACEHOLDER) == nonce:  # this write's, left by
        # a crash while it dropped another tool's parts
        return Conditions(if_match=props.etag)
    if overwrite is Overwrite.FALSE:
        return EXISTS
    if overwrite is Overwrite.IF_SOURCE_NEWER and source_mtime_ns <= destination_mtime_ns(props):
        return "destination is as new or newer (--overwrite ifSourceNewer)"
    prompt = ctx.overwrite_prompt
    if overwrite is Overwrite.PROMPT and prompt is not None and not await prompt(
            f"blob {name!r} exists ({props.size} bytes)"):
        return "exists at the destination (not overwritten, as answered)"
    return Conditions(if_match=props.etag)


async def created_meanwhile(ctx: EngineContext, name: str, size: int, md5: bytes | None) -> BlobProperties | str:
    """After a create-only write (--overwrite false) was refused because the object exists, though it did not when
    checked: a try whose answer was lost may have made it. The object, when it holds exactly these bytes (size and
    MD5), so the write counts as done; else the reason it is left alone (another writer made it)."""
    props = await ctx.request(lambda: ctx.store.stat(name))
    if props is not None and md5 is not None and props.size == size and props.content_md5 == md5:
        return props
    return EXISTS


def created_only(exc: ConflictError, conditions: Conditions) -> bool:
    """Whether a refusal is a create-only write finding the object there."""
    return exc.code == "BlobAlreadyExists" and conditions.if_none_match_any
