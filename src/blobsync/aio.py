"""The async library: the same calls as the blocking ones, to await inside a running event loop."""

from blobsync.api import (
    copy_async as copy,
    diagnose_async as diagnose,
    list_blobs_async as list_blobs,
    make_container_async as make_container,
    remove_async as remove,
    resume_async as resume,
    sync_async as sync,
    watch_async as watch,
)
from blobsync.client import AsyncClient as Client

__all__ = ["Client", "copy", "diagnose", "list_blobs", "make_container", "remove", "resume", "sync", "watch"]
