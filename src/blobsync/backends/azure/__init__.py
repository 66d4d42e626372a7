"""Azure Blob Storage: URLs, credentials, the REST store and block-blob writes; registers http(s):// URLs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from blobsync.backends.registry import Connection, Wire, register

if TYPE_CHECKING:
    from blobsync.backends.azure.store import AzureContainerStore
    from blobsync.backends.base import Location
    from blobsync.backends.diagnosis import Diagnosis


class AzureBackend:
    """Blob URLs of the public cloud (https://<account>.blob.core.windows.net/...) and of the emulator."""

    def parse(self, url: str) -> Location:
        from blobsync.backends.azure.location import parse_location

        return parse_location(url)

    def open(self, location: Location, connection: Connection, env: Mapping[str, str], wire: Wire,
             credential: object = None) -> AzureContainerStore:
        from blobsync.backends.azure.auth import credential_from, resolve_credential
        from blobsync.backends.azure.location import BlobLocation
        from blobsync.backends.azure.store import AzureContainerStore

        assert isinstance(location, BlobLocation)
        trusted = connection.trusted_suffixes
        signer = resolve_credential(location, env, trusted) if credential is None else \
            credential_from(credential, location, env, trusted)
        return AzureContainerStore(location, signer, connections=connection.connections,
                                   read_timeout=connection.stall_timeout, throttle=wire.throttle,
                                   on_wire=wire.on_wire, proxy=connection.proxy, env=env, trusted=trusted)

    async def diagnose(self, location: Location, connection: Connection, env: Mapping[str, str], *,
                       write_test: bool, timeout: float) -> Diagnosis:
        from blobsync.backends.azure.doctor import diagnose
        from blobsync.backends.azure.location import BlobLocation

        assert isinstance(location, BlobLocation)
        return await diagnose(location, write_test=write_test, env=env, timeout=timeout, proxy=connection.proxy,
                              trusted_suffixes=connection.trusted_suffixes)


AZURE = AzureBackend()
register("https", AZURE)
register("http", AZURE)
