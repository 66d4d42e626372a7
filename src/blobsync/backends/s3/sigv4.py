"""AWS Signature Version 4 for S3 requests (header form), as the AWS General Reference specifies it."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote

from blobsync.redact import register_secret

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()  # the payload hash of a request without a body


@dataclass(frozen=True)
class AwsCredentials:
    access_key: str
    secret_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        register_secret(self.secret_key)
        if self.session_token:
            register_secret(self.session_token)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def canonical_uri(path: str) -> str:
    """S3 encodes each path segment once (no double encoding), '/' kept."""
    return quote(path, safe="/~")


def canonical_query(query: Mapping[str, str]) -> str:
    return "&".join(f"{quote(k, safe='~')}={quote(v, safe='~')}" for k, v in sorted(query.items()))


def sign(creds: AwsCredentials, region: str, method: str, host: str, path: str, query: Mapping[str, str],
         headers: Mapping[str, str], payload_hash: str = EMPTY_SHA256, now: float | None = None) -> dict[str, str]:
    """The headers to send: `headers` with host, x-amz-date, x-amz-content-sha256, the session token and the
    Authorization that signs them all."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    day = stamp[:8]
    out = {**headers, "x-amz-date": stamp, "x-amz-content-sha256": payload_hash}
    if creds.session_token:
        out["x-amz-security-token"] = creds.session_token
    signed = {k.lower(): " ".join(str(v).split()) for k, v in {**out, "host": host}.items()}
    names = ";".join(sorted(signed))
    request = "\n".join([method, canonical_uri(path), canonical_query(query),
                         "".join(f"{k}:{signed[k]}\n" for k in sorted(signed)), names, payload_hash])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(request.encode("utf-8")).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{creds.secret_key}".encode(), day), region), "s3"), "aws4_request")
    signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    out["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, SignedHeaders={names}, "
                            f"Signature={signature}")
    return out
