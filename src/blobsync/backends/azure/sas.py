"""The one reader of a SAS token: its fields (permissions, validity, protocol, kind) and what is wrong with them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from urllib.parse import parse_qs, unquote

# What each kind of request needs from a SAS 'sp' field.
_NEEDED_PERMISSION = {
    "PUT": ("w", "write"),
    "GET": ("r", "read"),
    "HEAD": ("r", "read"),
    "DELETE": ("d", "delete"),
    "LIST": ("l", "list"),  # not an HTTP method: what the store passes for a List Blobs request
}


def parse_sas_time(value: str) -> datetime | None:
    value = unquote(value)
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%MZ", "%Y-%m-%d", "%Y-%m-%dT%H:%M:%S.%fZ"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


@dataclass(frozen=True)
class Sas:
    """A SAS query string read locally (nothing here is sent anywhere, nor is the signature ever shown)."""

    query: str

    @cached_property
    def fields(self) -> dict[str, str]:
        """The SAS parameters (sp, se, st, spr, sv, ...) by name, first value each."""
        return {k: v[0] for k, v in parse_qs(self.query, keep_blank_values=True).items()}

    @property
    def permissions(self) -> str:
        return unquote(self.fields.get("sp", ""))

    @property
    def protocol(self) -> str:
        return unquote(self.fields.get("spr", ""))

    @property
    def is_account_sas(self) -> bool:
        return "ss" in self.fields or "srt" in self.fields

    @property
    def kind(self) -> str:
        if "skoid" in self.fields:
            return "user delegation SAS"
        return "account SAS" if self.is_account_sas else "service SAS"

    @property
    def expiry(self) -> datetime | None:
        """None when there is no 'se' or it cannot be read (`expiry_unreadable` tells which)."""
        return parse_sas_time(self.fields["se"]) if "se" in self.fields else None

    @property
    def expiry_unreadable(self) -> bool:
        return "se" in self.fields and self.expiry is None

    @property
    def start(self) -> datetime | None:
        return parse_sas_time(self.fields["st"]) if "st" in self.fields else None

    def explain(self, method: str, scheme: str, now: datetime | None = None) -> str | None:
        """What is wrong with this SAS for a `method` request over `scheme`, or None if nothing is."""
        now = now or datetime.now(UTC)
        expiry = self.expiry
        if expiry is not None and expiry <= now:
            return f"the SAS expired at {expiry:%Y-%m-%d %H:%M:%S}Z: generate a new one"
        start = self.start
        if start is not None and start > now:
            return f"the SAS is not valid before {start:%Y-%m-%d %H:%M:%S}Z (check the clock, or the 'st' field)"
        if self.protocol == "https" and scheme == "http":
            return "the SAS allows HTTPS only (spr=https) but the URL is http://"
        perms = self.permissions
        need = _NEEDED_PERMISSION.get(method.upper())
        if need and perms and need[0] not in perms:
            if need[0] == "w" and "c" in perms:
                return (f"the SAS has permissions '{perms}': 'c' (create) without 'w' (write) cannot stage blocks "
                        "or overwrite; generate one with 'w'")
            return f"the SAS has permissions '{perms}' and lacks '{need[0]}' ({need[1]}): generate one that has it"
        return None
