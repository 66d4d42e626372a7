"""s3://bucket/prefix URLs, and the endpoint, region and credentials the usual AWS variables give them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Self
from urllib.parse import quote, unquote, urlsplit

from blobsync.backends.s3.sigv4 import AwsCredentials
from blobsync.errors import UsageError

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    path: str  # key or prefix, without a leading '/'

    @property
    def container(self) -> str:
        return self.bucket

    @property
    def container_url(self) -> str:
        return f"s3://{self.bucket}"

    @property
    def display(self) -> str:
        return f"s3://{self.bucket}/{quote(self.path, safe='/')}" if self.path else f"s3://{self.bucket}"

    def with_path(self, path: str) -> Self:
        return replace(self, path=path)

    def with_sas(self, sas: str) -> Self:
        raise UsageError(f"{self.display}: a SAS signs Azure Blob URLs; S3 credentials come from the environment "
                         "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")


def parse_s3(url: str) -> S3Location:
    shown = url.split("?", 1)[0]
    parts = urlsplit(url)
    if parts.scheme.lower() != "s3" or not parts.netloc:
        raise UsageError(f"malformed URL {shown!r}: expected s3://<bucket>[/<prefix>]")
    if parts.query:
        raise UsageError(f"URL {shown!r}: an s3:// URL takes no query string (credentials come from "
                         "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
    if not _BUCKET.match(parts.netloc):
        raise UsageError(f"invalid bucket name {parts.netloc!r}: 3-63 lower-case letters, digits, '.' and '-'")
    return S3Location(parts.netloc, unquote(parts.path.lstrip("/")))


@dataclass(frozen=True)
class Endpoint:
    """Where a bucket's requests go: scheme and host, the path its keys are under, and the signing region."""

    scheme: str
    netloc: str
    base_path: str  # '/<bucket>' (path style, a custom endpoint) or '' (virtual-hosted, AWS itself)
    region: str


def endpoint_for(loc: S3Location, env: Mapping[str, str]) -> Endpoint:
    """AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL) in path style, else AWS's virtual-hosted endpoint of the region
    (AWS_REGION or AWS_DEFAULT_REGION, us-east-1 by default)."""
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    custom = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if custom:
        parts = urlsplit(custom)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError(f"invalid AWS_ENDPOINT_URL {custom.split('?', 1)[0]!r}: expected http(s)://host[:port]")
        return Endpoint(parts.scheme, parts.netloc, f"{parts.path.rstrip('/')}/{loc.bucket}", region)
    return Endpoint("https", f"{loc.bucket}.s3.{region}.amazonaws.com", "", region)


def credentials_from(env: Mapping[str, str]) -> AwsCredentials | None:
    """AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN); None: unsigned requests (a public
    bucket). Half a pair is a usage error."""
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if not key and not secret:
        return None
    if not key or not secret:
        raise UsageError("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY go together: set both, or neither for a "
                         "public bucket")
    return AwsCredentials(key, secret, env.get("AWS_SESSION_TOKEN") or None)
