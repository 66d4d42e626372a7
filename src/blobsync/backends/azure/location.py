"""Azure blob URLs (public-cloud host style and emulator path style): account, container, path and SAS; name rules."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from urllib.parse import quote, unquote, urlsplit

from blobsync.backends.azure.sas import Sas
from blobsync.errors import UnsafeNameError, UsageError

_CONTAINER_RE = re.compile(r"^(?:\$root|\$web|\$logs|[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62})$")
_ACCOUNT_RE = re.compile(r"^[a-z0-9]{3,24}$|^devstoreaccount1$")
_NOT_IN_A_QUERY = re.compile(r"[\s#\x00-\x1f\x7f]")


@dataclass(frozen=True)
class BlobLocation:
    """A container (and optional prefix or blob name) addressed by URL, with the SAS kept apart."""

    scheme: str
    netloc: str
    account: str
    container: str
    path: str  # blob name or prefix inside the container, without a leading '/', may be ""
    path_style: bool  # emulator style: http://host:port/<account>/<container>/...
    sas: str | None  # the query string as given, or None; never logged, never journaled

    @property
    def account_url(self) -> str:
        """The account's base URL (no trailing slash, no SAS)."""
        base = f"{self.scheme}://{self.netloc}"
        return f"{base}/{self.account}" if self.path_style else base

    @property
    def container_url(self) -> str:
        """The container's URL without SAS."""
        return f"{self.account_url}/{self.container}"

    @property
    def display(self) -> str:
        """The URL without its query string: safe to print, log and journal."""
        tail = f"/{quote(self.path, safe='/')}" if self.path else ""
        return f"{self.container_url}{tail}"

    @property
    def host(self) -> str:
        """The host name or address, without port, brackets or user info ('::1', 'acct.blob.core.windows.net')."""
        from urllib.parse import urlsplit

        try:
            return (urlsplit(f"//{self.netloc}").hostname or "").lower()
        except ValueError:
            return ""

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)

    @property
    def sas_token(self) -> Sas | None:
        """The SAS, read (None without one)."""
        return Sas(self.sas) if self.sas else None

    def with_path(self, path: str) -> BlobLocation:
        return replace(self, path=path)

    def with_sas(self, sas: str) -> BlobLocation:
        text = sas.strip().lstrip("?")
        if "sig=" not in text or _NOT_IN_A_QUERY.search(text):
            raise UsageError("the SAS given is not a SAS token: a query string with 'sig=', without spaces or '#' "
                             "(the part after '?' of a SAS URL)")
        return replace(self, sas=text)


def _is_path_style_host(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return ".blob." not in host


def parse_location(url: str) -> BlobLocation:
    """Parse a container/blob URL; raises UsageError naming what is wrong (never echoing a SAS)."""
    shown = url.split("?", 1)[0]
    if "#" in shown:
        # urlsplit would take the rest for a fragment: the blob name cut short, and the SAS dropped with it.
        raise UsageError(f"URL {shown.split('#', 1)[0] + '#...'!r} holds a '#': a name with '#' is written %23 in "
                         "a URL (e.g. run%231.pt)")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise UsageError(f"malformed URL {shown!r}: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UsageError(
            f"malformed URL {shown!r}: expected https://<account>.blob.core.windows.net/<container>[/<path>]"
        )
    host = (parts.hostname or "").lower()
    if not host:
        raise UsageError(f"malformed URL {shown!r}: no host")
    netloc = parts.netloc.rsplit("@", 1)[-1]
    try:
        parts.port  # noqa: B018  (urlsplit checks a port only when asked: 99999 and -1 fail here, not in a request)
    except ValueError:
        port = netloc.rpartition(":")[2]
        raise UsageError(f"malformed URL {shown!r}: port {port!r} is not a port (a number from 0 to 65535)") from None
    segments = parts.path.split("/")[1:]  # path starts with '/'
    path_style = _is_path_style_host(host)
    if path_style:
        if not segments or not segments[0]:
            raise UsageError(
                f"malformed URL {shown!r}: expected http://{netloc}/<account>/<container>[/<path>]"
            )
        account = segments.pop(0)
    else:
        account = host.split(".", 1)[0]
    if not _ACCOUNT_RE.match(account):
        raise UsageError(f"malformed URL {shown!r}: {account!r} is not a valid storage account name")
    if not segments or not segments[0]:
        raise UsageError(
            f"URL {shown!r} names no container: add one, e.g. {scheme}://{netloc}"
            f"{'/' + account if path_style else ''}/<container>"
        )
    container = unquote(segments.pop(0))
    if not _CONTAINER_RE.match(container):
        raise UsageError(
            f"invalid container name {container!r} in {shown!r}: 3-63 lowercase letters, digits and "
            "single hyphens, starting with a letter or digit"
        )
    path = unquote("/".join(segments))
    sas = parts.query or None
    if sas is not None and "sig=" not in sas:
        # A query without a signature is not a SAS (e.g. a copied '?restype=container').
        raise UsageError(f"URL {shown!r} has a query string that is not a SAS token (no 'sig=')")
    return BlobLocation(scheme, netloc, account, container, path, path_style, sas)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # control characters: Azure refuses them in names


def check_blob_name(name: str) -> None:
    """Refuse names Azure rejects or silently changes, with the reason (raises UnsafeNameError)."""
    if not name or len(name) > 1024:
        raise UnsafeNameError(f"{name[:80]!r}...: a blob name has 1 to 1,024 characters")
    if name.count("/") >= 254:
        raise UnsafeNameError(f"{name[:80]!r}: a blob name has at most 254 path segments")
    if name.endswith((".", "/")):
        raise UnsafeNameError(f"{name!r}: blob names ending in '.' or '/' are changed or refused by Azure")
    if any(segment.endswith(".") for segment in name.split("/")[:-1]):
        raise UnsafeNameError(f"{name!r}: a path segment ending in '.' is changed or refused by Azure")
    if _CONTROL.search(name):
        raise UnsafeNameError(f"{name!r}: control characters are not valid in blob names")


def is_loopback_host(host: str) -> bool:
    """'localhost' or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
