"""Blob Batch: many signed sub-requests in one multipart/mixed POST, and the answers split back out in order."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_BOUNDARY = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)


@dataclass(frozen=True)
class SubRequest:
    method: str
    target: str  # path and query (the SAS too, when that is the credential)
    headers: Mapping[str, str]  # signed


@dataclass(frozen=True)
class SubResponse:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes


def batch_body(parts: Sequence[SubRequest]) -> tuple[str, bytes]:
    """The Content-Type and body of a batch of `parts`."""
    boundary = f"batch_{uuid.uuid4()}"
    out: list[str] = []
    for i, part in enumerate(parts):
        for value in (part.target, *part.headers.values()):
            if "\r" in value or "\n" in value:  # never: names are percent-encoded; a header must not split
                raise ValueError("a sub-request header holds a line break")
        out += [f"--{boundary}", "Content-Type: application/http", f"Content-ID: {i}",
                "Content-Transfer-Encoding: binary", "", f"{part.method} {part.target} HTTP/1.1"]
        out += [f"{name}: {value}" for name, value in part.headers.items() if name.lower() != "content-length"]
        out += ["Content-Length: 0", "", ""]
    out.append(f"--{boundary}--")
    return f"multipart/mixed; boundary={boundary}", ("\r\n".join(out) + "\r\n").encode("latin-1")


def parse_batch(content_type: str | None, body: bytes, expected: int) -> list[SubResponse]:
    """The sub-responses, in the order of the sub-requests (the service may leave Content-ID out of an error's
    part, so order is what maps them). ValueError if the answer is not a batch of `expected` parts."""
    found = _BOUNDARY.search(content_type or "")
    if found is None:
        raise ValueError(f"not a batch response (Content-Type {content_type!r})")
    delimiter = b"--" + found.group(1).encode("latin-1")
    chunks = body.split(delimiter)[1:]  # what precedes the first delimiter is a preamble
    responses = []
    for chunk in chunks:
        if chunk.startswith(b"--"):  # the closing delimiter
            break
        responses.append(_part(chunk))
    if len(responses) != expected:
        raise ValueError(f"a batch of {expected} sub-requests got {len(responses)} answers")
    return responses


def _part(chunk: bytes) -> SubResponse:
    # A part: its MIME headers, a blank line, then the embedded HTTP response (status line, headers, body).
    # An empty-bodied answer may end at the delimiter without its own blank line.
    _, _, http = chunk.lstrip(b"\r\n").partition(b"\r\n\r\n")
    head, _, rest = http.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/") or not status_line[1].isascii() \
            or not status_line[1].isdigit():
        raise ValueError(f"bad status line in a batch answer: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return SubResponse(int(status_line[1]), headers, rest.rstrip(b"\r\n"))
