"""Amazon S3 (and S3-compatible endpoints) as a copy's source: s3://bucket/prefix URLs; registers s3://."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from blobsync.backends.registry import Connection, Wire, no_credential_object, nothing_to_diagnose, register

if TYPE_CHECKING:
    from blobsync.backends.base import Location
    from blobsync.backends.diagnosis import Diagnosis
    from blobsync.backends.s3.store import S3Store


class S3Backend:
    """Buckets at AWS (virtual-hosted endpoints of AWS_REGION) or at AWS_ENDPOINT_URL(_S3) (path style)."""

    def parse(self, url: str) -> Location:
        from blobsync.backends.s3.location import parse_s3

        return parse_s3(url)

    def open(self, location: Location, connection: Connection, env: Mapping[str, str], wire: Wire,
             credential: object = None) -> S3Store:
        from blobsync.backends.s3.location import S3Location, credentials_from, endpoint_for
        from blobsync.backends.s3.store import S3Store

        assert isinstance(location, S3Location)
        no_credential_object(location, credential)  # S3 credentials come from the environment (AWS_*)
        return S3Store(location, endpoint_for(location, env), credentials_from(env),
                       connections=connection.connections, read_timeout=connection.stall_timeout,
                       on_wire=wire.on_wire, proxy=connection.proxy, env=env)

    async def diagnose(self, location: Location, connection: Connection, env: Mapping[str, str], *,
                       write_test: bool, timeout: float) -> Diagnosis:
        raise nothing_to_diagnose(location)


register("s3", S3Backend())
