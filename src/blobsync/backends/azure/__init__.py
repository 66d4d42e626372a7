"""Azure Blob Storage: URLs, credentials, the REST store and block-blob writes; registers http(s):// URLs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from blobsync.backends.registry import Wire, register

if TYPE_CHECKING:
    from blobsync.backends.azure.store import AzureContainerStore
    from blobsync.backends.base import Location
    from blobsync.config import TransferConfig


class AzureBackend:
    """Blob URLs of the public cloud (https://<account>.blob.core.windows.net/...) and of the emulator."""

    def parse(self, url: str) -> Location:
        from blobsync.backends.azure.location import parse_location

        return parse_location(url)

    def open(self, location: Location, config: TransferConfig, env: Mapping[str, str], wire: Wire,
             credential: object = None) -> AzureContainerStore:
        from blobsync.backends.azure.auth import credential_from, resolve_credential
        from blobsync.backends.azure.location import BlobLocation
        from blobsync.backends.azure.store import AzureContainerStore

        assert isinstance(location, BlobLocation)
        signer = resolve_credential(location, env, config.trusted_suffixes) if credential is None else \
            credential_from(credential, location, env, config.trusted_suffixes)
        return AzureContainerStore(location, signer,
                                   connections=config.max_concurrency + 4, read_timeout=config.stall_timeout,
                                   throttle=wire.throttle, on_wire=wire.on_wire, proxy=config.proxy, env=env,
                                   trusted=config.trusted_suffixes)


AZURE = AzureBackend()
register("https", AZURE)
register("http", AZURE)
