"""Names a local file system takes as one: case-insensitive (macOS, Windows) and normalising (NFC/NFD) ones."""

from __future__ import annotations

import contextlib
import os
import secrets
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

Fold = Callable[[str], str]


@dataclass(frozen=True)
class Folding:
    """What the file system at a folder ignores in a name: case, Unicode normalisation, or both."""

    case: bool = False
    unicode: bool = False

    @property
    def active(self) -> bool:
        return self.case or self.unicode

    def key(self, rel: str) -> str:
        name = unicodedata.normalize("NFC", rel) if self.unicode else rel
        return name.casefold() if self.case else name

    def describe(self) -> str:
        both = " and ".join(w for w, on in (("ignores case", self.case), ("normalises Unicode", self.unicode)) if on)
        return f"this file system {both}"


def probe(folder: Path, env: Mapping[str, str] | None = None) -> Folding:
    """Ask the file system at `folder` (created if missing): a probe file is made under one spelling and looked
    up under the others. BLOBSYNC_NAME_FOLDING ('case', 'unicode', 'case,unicode' or 'none') overrides it."""
    env = os.environ if env is None else env
    forced = env.get("BLOBSYNC_NAME_FOLDING")
    if forced is not None:
        words = {w.strip().lower() for w in forced.split(",")}
        return Folding("case" in words, "unicode" in words)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return Folding()
    stem = f".blobsync-probe-{secrets.token_hex(4)}-A\u00e9"  # A + e-acute, composed (NFC)
    path = folder / stem
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        return Folding()
    os.close(fd)
    try:
        case = os.path.lexists(folder / stem.replace("-A", "-a"))
        unicode = os.path.lexists(folder / unicodedata.normalize("NFD", stem))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return Folding(case, unicode)


@dataclass
class NameClaims:
    """The local names of one job so far, folded as the file system folds them: the second blob that would land
    on a name already taken is refused, instead of the two overwriting each other."""

    folding: Folding
    _taken: dict[str, str] = field(default_factory=dict)

    def claim(self, rel: str) -> str | None:
        """None if `rel` is free (now taken), else the name it collides with."""
        if not self.folding.active:
            return None
        other = self._taken.setdefault(self.folding.key(rel), rel)
        return None if other == rel else other

    def claim_all(self, rels: Iterable[str]) -> None:
        for rel in rels:
            self.claim(rel)

    def message(self, rel: str, other: str) -> str:
        return (f"{rel!r} and {other!r} are one file name here ({self.folding.describe()}): {rel!r} is not "
                "downloaded; rename one of the blobs, or download to a case-sensitive file system")
