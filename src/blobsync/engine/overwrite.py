"""--overwrite for one write: the preconditions it is sent with, or why the destination is left alone."""

from __future__ import annotations

from blobsync.backends.base import Conditions
from blobsync.config import Overwrite
from blobsync.engine.context import EngineContext
from blobsync.engine.mtime import destination_mtime_ns


async def write_conditions(ctx: EngineContext, name: str, source_mtime_ns: int) -> Conditions | str:
    """The write's preconditions under ctx.config.overwrite (create-only, or over the version compared), or the
    reason the object `name` is to be left as it is."""
    overwrite = ctx.config.overwrite
    if overwrite is Overwrite.TRUE:
        return Conditions()
    props = await ctx.request(lambda: ctx.store.stat(name))
    if props is None:
        return Conditions(if_none_match_any=True)
    if overwrite is Overwrite.FALSE:
        return "exists at the destination (--overwrite false)"
    if overwrite is Overwrite.IF_SOURCE_NEWER and source_mtime_ns <= destination_mtime_ns(props):
        return "destination is as new or newer (--overwrite ifSourceNewer)"
    prompt = ctx.overwrite_prompt
    if overwrite is Overwrite.PROMPT and prompt is not None and not await prompt(
            f"blob {name!r} exists ({props.size} bytes)"):
        return "exists at the destination (not overwritten, as answered)"
    return Conditions(if_match=props.etag)
