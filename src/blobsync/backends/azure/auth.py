"""Azure credentials: where they come from (URL, environment, emulator, Azure AD) and how a request is signed."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import inspect
import ipaddress
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from blobsync.backends import trust_store
from blobsync.backends.azure.location import BlobLocation, is_loopback_host
from blobsync.errors import AuthError, UsageError
from blobsync.redact import register_secret

# The Azurite / storage-emulator account key: public, documented, the same on every machine.
EMULATOR_ACCOUNT = "devstoreaccount1"
EMULATOR_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
STORAGE_SCOPE = "https://storage.azure.com/.default"
SAS_VERSION = "2022-11-02"  # of the read SAS made for a copy source from an account key
READ_SAS_LIFETIME = 6 * 3600.0  # seconds: a copy job asks again for each blob, and a resumed one anew
log = logging.getLogger("blobsync")


@dataclass
class Request:
    """The parts of an HTTP request a signer needs to see or change."""

    method: str
    path: str  # percent-encoded, as sent
    query: list[tuple[str, str]]  # decoded names and values, excluding any SAS
    headers: dict[str, str]
    sas: str | None = None  # a raw SAS query string to append, set by SasCredential


class Credential(Protocol):
    """Signs requests for one storage account."""

    description: str  # e.g. "SAS token from the URL"; never contains the secret
    is_sas: bool

    async def authorize(self, request: Request) -> None: ...

    async def refresh(self, refused: Request) -> bool:
        """After the service refused the `refused` request (401/403): get a fresh credential unless one came since;
        True if the request is worth sending again."""
        ...

    async def close(self) -> None: ...


class _NothingToClose:
    async def close(self) -> None:
        return None

    async def refresh(self, refused: Request) -> bool:
        return False  # a fixed credential: the refusal stands


@dataclass
class AnonymousCredential(_NothingToClose):
    description: str = "no credentials (anonymous access)"
    is_sas: bool = False

    async def authorize(self, request: Request) -> None:
        return None


@dataclass
class SasCredential(_NothingToClose):
    sas: str
    description: str = "SAS token from the URL"
    is_sas: bool = True
    in_url: bool = False  # the user wrote it into the URL: theirs to send, a copy's destination included

    async def authorize(self, request: Request) -> None:
        request.sas = self.sas


def _canonical_headers(headers: Mapping[str, str]) -> str:
    xms = sorted((k.lower(), v.strip()) for k, v in headers.items() if k.lower().startswith("x-ms-"))
    return "".join(f"{k}:{v}\n" for k, v in xms)


def _canonical_resource(account: str, path: str, query: list[tuple[str, str]]) -> str:
    out = f"/{account}{path}"
    if query:
        grouped: dict[str, list[str]] = {}
        for name, value in query:
            grouped.setdefault(name.lower(), []).append(value)
        for name in sorted(grouped):
            out += f"\n{name}:{','.join(sorted(grouped[name]))}"
    return out


@dataclass
class SharedKeyCredential(_NothingToClose):
    """Shared Key authorization as the Azure REST reference specifies (service version 2015-02-21+)."""

    account: str
    key: str
    description: str = "account key"
    is_sas: bool = False
    _key_bytes: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            self._key_bytes = base64.b64decode(self.key, validate=True)
        except ValueError as exc:
            raise UsageError(f"the account key for {self.account!r} is not valid base64") from exc
        register_secret(self.key)

    def string_to_sign(self, request: Request) -> str:
        h = {k.lower(): v for k, v in request.headers.items()}
        length = h.get("content-length", "")
        if length == "0":
            length = ""
        parts = [
            request.method.upper(),
            h.get("content-encoding", ""),
            h.get("content-language", ""),
            length,
            h.get("content-md5", ""),
            h.get("content-type", ""),
            "",  # Date: we send x-ms-date instead
            h.get("if-modified-since", ""),
            h.get("if-match", ""),
            h.get("if-none-match", ""),
            h.get("if-unmodified-since", ""),
            h.get("range", ""),
        ]
        return (
            "\n".join(parts)
            + "\n"
            + _canonical_headers(request.headers)
            + _canonical_resource(self.account, request.path, request.query)
        )

    async def authorize(self, request: Request) -> None:
        request.headers["Authorization"] = f"SharedKey {self.account}:{self._sign(self.string_to_sign(request))}"

    def _sign(self, text: str) -> str:
        digest = hmac.new(self._key_bytes, text.encode("utf-8"), hashlib.sha256)
        return base64.b64encode(digest.digest()).decode("ascii")

    def read_sas(self, container: str, blob: str, lifetime: float = READ_SAS_LIFETIME) -> str:
        """A service SAS that lets its bearer read one blob for `lifetime` seconds (a copy source's service)."""
        expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + lifetime))
        # The fields signed, in the order the Azure REST reference gives for versions 2020-12-06 and later: sp, st,
        # se, resource, si, sip, spr, sv, sr, snapshot, ses, rscc, rscd, rsce, rscl, rsct.
        fields = ["r", "", expiry, f"/blob/{self.account}/{container}/{blob}", "", "", "https,http", SAS_VERSION,
                  "b", "", "", "", "", "", "", ""]
        query = {"sv": SAS_VERSION, "spr": "https,http", "se": expiry, "sr": "b", "sp": "r",
                 "sig": self._sign("\n".join(fields))}
        sas = urlencode(query, quote_via=quote, safe="")
        register_secret(sas)
        return sas


class _TokenSource(Protocol):
    async def get_token(self, *scopes: str) -> Any: ...


@dataclass
class TokenCredential:
    """Azure AD bearer tokens from an azure-identity async credential, refreshed before they expire.

    One fetch at a time, shared by every request that needs it (64 cold requests ask once: IMDS and Entra ID
    throttle a burst), and the source is closed with the store."""

    source: _TokenSource
    description: str = "Azure AD (DefaultAzureCredential)"
    is_sas: bool = False
    owned: bool = True  # made here (DefaultAzureCredential): closed with the store
    _refreshed: float = field(default=0.0, init=False, repr=False)
    _token: str | None = field(default=None, init=False, repr=False)
    _expires_on: float = field(default=0.0, init=False, repr=False)
    _fetching: asyncio.Lock | None = field(default=None, init=False, repr=False)

    def _fresh(self) -> bool:
        return self._token is not None and self._expires_on - time.time() >= 300

    async def authorize(self, request: Request) -> None:
        if not self._fresh():
            self._fetching = self._fetching or asyncio.Lock()
            async with self._fetching:
                if not self._fresh():  # another request fetched it while this one waited
                    await self._fetch()
        request.headers["Authorization"] = f"Bearer {self._token}"

    async def _fetch(self) -> None:
        trust_store.load()  # an azure-identity async credential verifies with aiohttp's default context
        try:
            token = await self.source.get_token(STORAGE_SCOPE)
        except Exception as exc:  # azure-identity raises its own tree; name it for the user
            raise AuthError(
                f"could not get an Azure AD token: {type(exc).__name__}",
                hint="run 'az login', set AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET, "
                "or use a SAS URL or AZURE_STORAGE_KEY",
            ) from exc
        self._token = str(token.token)
        self._expires_on = float(token.expires_on)
        register_secret(self._token)

    async def refresh(self, refused: Request) -> bool:
        """A token the service refused (revoked, clock skew): fetch anew, at most once a minute."""
        if self._token is not None and refused.headers.get("Authorization") != f"Bearer {self._token}":
            return True  # a newer token came since this request was signed
        if time.time() - self._refreshed < 60:
            return False
        self._refreshed = time.time()
        self._token = None
        return True

    async def close(self) -> None:
        if not self.owned:
            return  # the caller's credential object: closing it is theirs
        closer = getattr(self.source, "close", None)
        if closer is not None:
            await closer()


class SasProvider:
    """A SAS from a callable (sync or async) that returns a fresh one: asked at first use and again whenever the
    service refuses the current one (expired), so a long job goes on at block level with the new SAS."""

    description = "SAS from the credential provider"
    is_sas = True

    def __init__(self, provider: Callable[[], str | Awaitable[str]]) -> None:
        self._provider = provider
        self._sas: str | None = None
        self._fetching: asyncio.Lock | None = None

    async def _fetch(self) -> str:
        got = self._provider()
        if inspect.isawaitable(got):
            got = await got
        if not isinstance(got, str) or "sig=" not in got:
            raise AuthError("the SAS provider returned no SAS (a query string with sig=)")
        sas = got.lstrip("?")
        register_secret(sas)
        for part in sas.split("&"):
            if part.startswith("sig="):
                register_secret(part[4:])
        return sas

    async def authorize(self, request: Request) -> None:
        if self._sas is None:
            self._fetching = self._fetching or asyncio.Lock()
            async with self._fetching:
                if self._sas is None:
                    self._sas = await self._fetch()
        request.sas = self._sas

    async def refresh(self, refused: Request) -> bool:
        self._fetching = self._fetching or asyncio.Lock()
        async with self._fetching:
            if self._sas != refused.sas:  # renewed since this request was signed (another refusal asked first)
                return True
            self._sas = await self._fetch()
        return self._sas != refused.sas

    async def close(self) -> None:
        return None


class _AzureSas(_NothingToClose):
    """azure-core's AzureSasCredential: its signature read at every request (the owner may update() it)."""

    description = "AzureSasCredential"
    is_sas = True

    def __init__(self, source: Any) -> None:
        self._source = source
        self._used: str | None = None

    async def authorize(self, request: Request) -> None:
        self._used = str(self._source.signature).lstrip("?")
        register_secret(self._used)
        request.sas = self._used

    async def refresh(self, refused: Request) -> bool:
        return str(self._source.signature).lstrip("?") != refused.sas


class _SyncTokens:
    """A synchronous azure-identity credential behind the async get_token the signer awaits."""

    def __init__(self, source: Any) -> None:
        self._source = source

    async def get_token(self, *scopes: str) -> Any:
        return await asyncio.to_thread(self._source.get_token, *scopes)


def check_copy_reader(source: BlobLocation, credential: Credential, reader: str, trusted: tuple[str, ...]) -> None:
    """Whether the source's credential may be handed to the service at `reader` (a copy's destination host), which
    reads the source with it. A SAS the user wrote into the source URL goes wherever they copy it (AzCopy's rule);
    what blobsync found or was given for the source's account (an environment SAS, a read SAS signed with a key, a
    token, a Client's credential) goes only where a key or token may: the source's own host, loopback, a trusted
    suffix. Else a usage error, before anything is sent."""
    if isinstance(credential, AnonymousCredential) or (isinstance(credential, SasCredential) and credential.in_url):
        return
    host = reader.lower().rstrip(".")
    if host == source.host or is_loopback_host(host) or is_trusted_host(host, trusted):
        return
    raise UsageError(
        f"{host} is not an Azure Storage host: the copy's destination service would read the source with its "
        f"credential ({credential.description}), so nothing was sent",
        hint=f"if this host is yours, allow it with --trusted-microsoft-suffixes '{host}', copy through this "
        "machine with --s2s-via-client, or put a read SAS in the source URL")


async def read_grant(credential: Credential, account: str, container: str, blob: str
                     ) -> tuple[str | None, dict[str, str]]:
    """What lets another service read `blob` for a copy: a SAS for its URL, or headers (a bearer token goes in
    x-ms-copy-source-authorization); (None, {}) for a public source."""
    if isinstance(credential, SharedKeyCredential):
        return credential.read_sas(container, blob), {}  # the key itself never leaves this machine
    request = Request("GET", f"/{account}/{container}/{blob}", [], {})
    await credential.authorize(request)
    bearer = request.headers.get("Authorization", "")
    return request.sas, ({"x-ms-copy-source-authorization": bearer} if bearer.startswith("Bearer ") else {})


def credential_from(obj: object, loc: BlobLocation, env: Mapping[str, str], trusted: tuple[str, ...] = ()
                    ) -> Credential:
    """The credential a caller passed (Client(credential=...)): a SAS or connection string (text), an azure-core
    AzureSasCredential or AzureNamedKeyCredential, an azure-identity TokenCredential (sync or async), or a
    callable returning a fresh SAS. Keys and tokens go to trusted hosts only, as the environment's do."""
    if isinstance(obj, str):
        text = obj.strip()
        if re.search(r"(?i)(^|;)\s*(accountkey|sharedaccesssignature|blobendpoint|usedevelopmentstorage)=", text):
            cred = _from_connection_string(loc, text)
            if cred is None:
                raise UsageError(f"the connection string given as credential is not for account {loc.account!r}")
            return _check_trusted(loc, cred, trusted, _endpoint_host(text))
        if "sig=" not in text:
            if _looks_like_key(text):
                raise UsageError("the credential text looks like an account key, which is not a SAS",
                                 hint="pass AzureNamedKeyCredential(account, key) or a connection string "
                                 "'AccountName=<account>;AccountKey=<key>' as the credential")
            raise UsageError("credential text is neither a SAS (a query string with sig=) nor a connection string")
        register_secret(text.lstrip("?"))
        return SasCredential(text.lstrip("?"), description="SAS given as credential")
    if hasattr(obj, "named_key"):
        name, key = obj.named_key
        return _check_trusted(loc, SharedKeyCredential(str(name), str(key), description="AzureNamedKeyCredential"),
                              trusted, None)
    if hasattr(obj, "signature") and hasattr(obj, "update"):
        return _AzureSas(obj)
    if hasattr(obj, "get_token"):
        if loc.scheme != "https" and not loc.is_loopback:
            raise UsageError(f"{loc.display} is plain http: an Azure AD token is sent over HTTPS only")
        source = obj if inspect.iscoroutinefunction(obj.get_token) else _SyncTokens(obj)
        return _check_trusted(loc, TokenCredential(source, description=f"Azure AD ({type(obj).__name__})",
                                                   owned=False), trusted, None)
    if callable(obj):
        return SasProvider(obj)
    raise UsageError(f"invalid credential={type(obj).__name__}: a SAS or connection string, AzureSasCredential, "
                     "AzureNamedKeyCredential, a TokenCredential, or a function returning a SAS")


def _looks_like_key(text: str) -> bool:
    """An account key: 64 bytes in base64 (88 characters ending in '==')."""
    try:
        return len(base64.b64decode(text, validate=True)) == 64
    except ValueError:
        return False


def parse_connection_string(text: str) -> dict[str, str]:
    """Split 'Key=Value;Key2=Value2' (values may contain '='); keys are matched case-insensitively."""
    out: dict[str, str] = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise UsageError("AZURE_STORAGE_CONNECTION_STRING is malformed: expected Key=Value;Key=Value")
        out[key.strip().lower()] = value.strip()
    return out


def _from_connection_string(loc: BlobLocation, text: str) -> Credential | None:
    cs = parse_connection_string(text)
    if cs.get("usedevelopmentstorage", "").lower() == "true":
        if loc.account == EMULATOR_ACCOUNT:
            return SharedKeyCredential(
                EMULATOR_ACCOUNT, EMULATOR_KEY, description="emulator key (UseDevelopmentStorage=true)"
            )
        return None
    account = cs.get("accountname")
    if account is None and "blobendpoint" in cs:
        # An explicit BlobEndpoint names the account in its host or (emulator style) its path.
        from blobsync.backends.azure.location import parse_location

        try:
            account = parse_location(cs["blobendpoint"].rstrip("/") + "/x").account
        except UsageError:
            account = None
    if account is not None and account != loc.account:
        return None
    if "accountkey" in cs and account is not None:
        return SharedKeyCredential(
            account, cs["accountkey"], description="account key from AZURE_STORAGE_CONNECTION_STRING"
        )
    if "sharedaccesssignature" in cs:
        return SasCredential(
            cs["sharedaccesssignature"].lstrip("?"),
            description="SAS from AZURE_STORAGE_CONNECTION_STRING",
        )
    return None


def _default_azure_credential() -> Credential | None:
    try:
        from azure.identity.aio import DefaultAzureCredential
    except ImportError:
        return None
    try:
        return TokenCredential(DefaultAzureCredential())
    except ValueError as exc:  # azure-identity refuses what it reads from the environment (an empty AZURE_CLIENT_ID)
        raise AuthError(f"Azure AD credentials from the environment are not usable: {exc}",
                        hint="set AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET together (or unset "
                             "them), or use a SAS URL or AZURE_STORAGE_KEY") from None


# Where AzCopy sends tokens and keys by default (its --trusted-microsoft-suffixes): the public and national
# clouds' storage endpoints. A key or a token of the storage.azure.com scope opens every account it reaches, so
# a URL on any other host gets neither unless the user names that host's domain.
TRUSTED_SUFFIXES = ("core.windows.net", "core.chinacloudapi.cn", "core.cloudapi.de", "core.usgovcloudapi.net",
                    "storage.azure.net")


def is_trusted_host(host: str, extra: tuple[str, ...] = ()) -> bool:
    """Whether a key or token may be sent to `host`: a name under a trusted suffix, on a label boundary; an IP
    address only when named whole."""
    host = host.lower().rstrip(".").removeprefix("[").removesuffix("]")
    try:
        return str(ipaddress.ip_address(host)) in {s.strip("[]") for s in extra}
    except ValueError:
        pass
    for suffix in (*TRUSTED_SUFFIXES, *extra):
        suffix = suffix.lower().strip().lstrip("*").lstrip(".").rstrip(".")
        if suffix and (host == suffix or host.endswith("." + suffix)):
            return True
    return False


def _check_trusted(loc: BlobLocation, credential: Credential, trusted: tuple[str, ...], endpoint_host: str | None
                   ) -> Credential:
    """The credential, if it may go to this URL's host: loopback, a trusted suffix, or the host the connection
    string itself names; else a usage error that says how to allow it."""
    if loc.is_loopback or is_trusted_host(loc.host, trusted) or (endpoint_host and endpoint_host == loc.host):
        return credential
    raise UsageError(
        f"{loc.host} is not an Azure Storage host: blobsync sends credentials ({credential.description}) only to "
        f"*.{', *.'.join(TRUSTED_SUFFIXES)} and loopback, so nothing was sent",
        hint=f"if this host is yours, allow it with --trusted-microsoft-suffixes '{loc.host}' (or its domain), "
        "or put a SAS in the URL")


def resolve_credential(loc: BlobLocation, env: Mapping[str, str], trusted: tuple[str, ...] = ()) -> Credential:
    """Pick credentials for `loc`: SAS in the URL, then the environment, then the emulator key, then Azure AD.
    Only a SAS in the URL goes to any host; keys and tokens go to trusted hosts (`trusted`: more suffixes)."""
    if loc.sas:
        return SasCredential(loc.sas, in_url=True)
    conn = env.get("AZURE_STORAGE_CONNECTION_STRING")
    if conn:
        cred = _from_connection_string(loc, conn)
        if cred is not None:
            return _check_trusted(loc, cred, trusted, _endpoint_host(conn))
    key = env.get("AZURE_STORAGE_KEY")
    account = env.get("AZURE_STORAGE_ACCOUNT")
    if key and (account is None or account == loc.account):
        return _check_trusted(loc, SharedKeyCredential(loc.account, key, description="account key from "
                                                       "AZURE_STORAGE_KEY"), trusted, None)
    if loc.account == EMULATOR_ACCOUNT and loc.is_loopback:
        return SharedKeyCredential(EMULATOR_ACCOUNT, EMULATOR_KEY, description="emulator key")
    if not loc.is_loopback:
        if loc.scheme != "https":
            raise UsageError(f"{loc.display} is plain http: an Azure AD token is sent over HTTPS only",
                             hint="use the https:// URL, or a SAS or account key")
        cred = _default_azure_credential()
        if cred is not None:
            return _check_trusted(loc, cred, trusted, None)
    return AnonymousCredential()


def account_url_from_env(env: Mapping[str, str]) -> str | None:
    """The account a filesystem given no URL works in, as adlfs finds it: AZURE_STORAGE_CONNECTION_STRING's
    BlobEndpoint (or its AccountName and EndpointSuffix), else AZURE_STORAGE_ACCOUNT; None where neither is set."""
    conn = env.get("AZURE_STORAGE_CONNECTION_STRING")
    if conn:
        cs = parse_connection_string(conn)
        if cs.get("blobendpoint"):
            return cs["blobendpoint"].rstrip("/")
        if cs.get("usedevelopmentstorage", "").lower() == "true":
            return f"http://127.0.0.1:10000/{EMULATOR_ACCOUNT}"
        if cs.get("accountname"):
            scheme = cs.get("defaultendpointsprotocol", "https")
            return f"{scheme}://{cs['accountname']}.blob.{cs.get('endpointsuffix', 'core.windows.net')}"
    account = env.get("AZURE_STORAGE_ACCOUNT")
    return f"https://{account}.blob.core.windows.net" if account else None


def _endpoint_host(conn: str) -> str | None:
    """The host of a connection string's BlobEndpoint: the user named it, so its own credential may go there."""
    from urllib.parse import urlsplit

    endpoint = parse_connection_string(conn).get("blobendpoint")
    try:
        return (urlsplit(endpoint).hostname or None) if endpoint else None
    except ValueError:
        return None


_warned_plain_http = False


def warn_if_plain_http(loc: BlobLocation, credential: Credential) -> None:
    """A SAS or an account key signs requests anyone on the path can replay over plain http: say so, once."""
    global _warned_plain_http
    if loc.scheme == "http" and not loc.is_loopback and not isinstance(credential, AnonymousCredential) \
            and not _warned_plain_http:
        _warned_plain_http = True
        log.warning("%s is plain http: the %s travels unencrypted and can be replayed; use https://",
                    loc.display, "SAS" if credential.is_sas else "signed request")
