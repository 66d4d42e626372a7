"""Makes text safe to show or store: secrets (SAS signatures, account keys, tokens) removed, names escaped."""

from __future__ import annotations

import logging
import re

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # SAS signature in a query string or a bare token: sig=<base64, maybe percent-encoded>
    (re.compile(r"(?i)(\bsig=)[^&\s'\";)]+"), r"\1REDACTED"),
    # Connection-string parts
    (re.compile(r"(?i)(AccountKey=)[^;\s'\"]+"), r"\1REDACTED"),
    (re.compile(r"(?i)(SharedAccessSignature=)[^;\s'\"]+"), r"\1REDACTED"),
    # Authorization headers
    (re.compile(r"(?i)(SharedKey(?:Lite)? [^:\s]+:)[A-Za-z0-9+/=]+"), r"\1REDACTED"),
    (re.compile(r"(?i)(Bearer )[A-Za-z0-9._~+/=-]+"), r"\1REDACTED"),
    # A password in a URL's user info: scheme://user:password@host
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@'\"]*:)[^/\s@'\"]*@"), r"\1REDACTED@"),
)

# Process-wide on purpose: a secret any part has seen (a key, a token, a proxy password) must be hidden by every
# part, and errors are redacted when they are made, far from whoever registered it.
_extra: set[str] = set()


def register_secret(secret: str) -> None:
    """Remember a secret value (an account key, a token) so it is redacted even where no pattern matches."""
    if len(secret) >= 8:
        _extra.add(secret)


def redact(text: str) -> str:
    """Return `text` with every known secret replaced by REDACTED."""
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    for secret in _extra:
        if secret in text:
            text = text.replace(secret, "REDACTED")
    return text


def printable(text: str) -> str:
    """`text` as it may be shown on one line: undecodable bytes of a file name as \\xNN, control characters
    (a newline in a name would split the line) as escapes; everything else as it is."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def strip_query(url: str) -> str:
    """Return `url` without its query string: the form that may be logged or journaled."""
    return redact(url.split("?", 1)[0])


class RedactingFilter(logging.Filter):
    """A logging filter that redacts (and escapes) the fully formatted message of every record, at every level."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = printable(redact(message))
        if cleaned != message or record.args:
            record.msg = cleaned
            record.args = None
        return True
