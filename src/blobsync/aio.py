"""The async library: the same calls as the blocking ones, to await inside a running event loop."""

from blobsync.api import copy_async as copy
from blobsync.api import list_blobs_async as list_blobs
from blobsync.api import make_container_async as make_container
from blobsync.api import remove_async as remove
from blobsync.api import resume_async as resume
from blobsync.api import sync_async as sync
from blobsync.api import watch_async as watch
from blobsync.backends.azure.doctor import diagnose
from blobsync.client import AsyncClient as Client

__all__ = ["Client", "copy", "diagnose", "list_blobs", "make_container", "remove", "resume", "sync", "watch"]
