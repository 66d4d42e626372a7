"""Which files a transfer takes, as AzCopy chooses them: name globs, paths, regexes, times, a source wildcard."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from blobsync.errors import UsageError
from blobsync.regex import Matcher, compile_regex


def _split(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (text or "").split(";") if p.strip())


def _glob(pattern: str, flag: str) -> re.Pattern[str]:
    if "/" in pattern:
        raise UsageError(f"invalid {flag} {pattern!r}: patterns match file names, which have no '/' "
                         f"(use --{'include' if 'include' in flag else 'exclude'}-path or -regex for paths)")
    return re.compile(fnmatch.translate(pattern), re.S)




def _prefix(path: str, flag: str) -> str:
    given = path
    path = path.replace("\\", "/").strip("/")
    if not path or any(part in ("", ".", "..") for part in path.split("/")):
        raise UsageError(f"invalid {flag} {given!r}: a path relative to the source, without '.' or '..' segments")
    # An exclude path is a string prefix, as AzCopy has it ('sub' also excludes 'sub.pt' and 'subway/'); a
    # trailing '/' given by the user keeps it to the folder.
    return path + "/" if flag == "--exclude-path" and given.replace("\\", "/").endswith("/") else path


LISTED_LINE_MAX = 16 * 1024  # bytes: a path is at most 4 KiB on any file system, a blob name 1 KiB


def _listed(path: str | None) -> tuple[str, ...]:
    """The relative paths a --list-of-files file names, one per line (blank lines and '#' comments skipped), read
    as a stream: a line longer than any path, or bytes that are not UTF-8 text, stop it at once with one line."""
    if not path:
        return ()
    paths = []
    try:
        with open(path, "rb") as lines:
            for number, raw in enumerate(iter(lambda: lines.readline(LISTED_LINE_MAX + 1), b""), 1):
                line = _listed_line(path, number, raw)
                if line and not line.startswith("#"):
                    paths.append(_prefix(line, "--list-of-files"))
    except OSError as exc:
        raise UsageError(f"cannot read --list-of-files {path!r}: {exc.strerror or exc}") from None
    if not paths:
        raise UsageError(f"--list-of-files {path!r} names nothing: one relative path per line")
    return tuple(paths)


def _listed_line(path: str, number: int, raw: bytes) -> str:
    if len(raw) > LISTED_LINE_MAX:
        raise UsageError(f"--list-of-files {path!r}: line {number} is longer than {LISTED_LINE_MAX} bytes, which no "
                         "path is: give a text file of relative paths, one per line")
    try:
        text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError:
        text = "\x00"
    if "\x00" in text:
        raise UsageError(f"--list-of-files {path!r}: line {number} is not UTF-8 text (a binary file?): give a text "
                         "file of relative paths, one per line")
    return text.strip()


def wildcard(pattern: str) -> re.Pattern[str]:
    """A source wildcard (the last segment of a cp source, e.g. '*.pt'): only '*' is special, as in AzCopy, and it
    never crosses a '/'."""
    return re.compile("[^/]*".join(re.escape(part) for part in pattern.split("*")) + r"\Z", re.S)


def parse_time(text: str, flag: str) -> float:
    """An ISO 8601 date or date-time (UTC unless it says otherwise) as a POSIX timestamp."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise UsageError(f"invalid {flag} {text!r}: use ISO 8601, e.g. 2026-11-30 or 2026-11-30T12:00:00Z") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


@dataclass(frozen=True)
class Filters:
    """Which relative paths take part in a transfer. Build with `Filters.parse(...)` (validates everything)."""

    include_patterns: tuple[re.Pattern[str], ...] = ()
    exclude_patterns: tuple[re.Pattern[str], ...] = ()
    include_paths: tuple[str, ...] = ()
    exclude_paths: tuple[str, ...] = ()
    include_regexes: tuple[Matcher, ...] = ()
    exclude_regexes: tuple[Matcher, ...] = ()
    include_after: float | None = None
    include_before: float | None = None
    top: re.Pattern[str] | None = None  # a source wildcard: the first segment of a relative path must match it
    recursive: bool = True  # False: only files at the top of the source folder or prefix
    text: dict[str, object] = field(default_factory=dict, compare=False)  # the options as given, for the journal
    listed: tuple[str, ...] = ()  # the include paths --list-of-files named (each must match something)

    @classmethod
    def parse(
        cls,
        *,
        include_pattern: str | None = None,
        exclude_pattern: str | None = None,
        include_path: str | None = None,
        exclude_path: str | None = None,
        include_regex: str | None = None,
        exclude_regex: str | None = None,
        include_after: str | None = None,
        include_before: str | None = None,
        source_wildcard: str | None = None,
        recursive: bool = True,
        list_of_files: str | None = None,
    ) -> Filters:
        """Validate the options as the flags give them (';'-separated lists); any bad one is a UsageError.
        `list_of_files` names a file of relative paths, one per line (files, or folders with all below them),
        taken with the include paths."""
        given: dict[str, object] = {k: v for k, v in locals().items() if k not in ("cls", "recursive") and v}
        if not recursive:
            given["recursive"] = False
        after = parse_time(include_after, "--include-after") if include_after else None
        before = parse_time(include_before, "--include-before") if include_before else None
        if after is not None and before is not None and after > before:
            raise UsageError("--include-after must not be later than --include-before")
        return cls(
            tuple(_glob(p, "--include-pattern") for p in _split(include_pattern)),
            tuple(_glob(p, "--exclude-pattern") for p in _split(exclude_pattern)),
            tuple(_prefix(p, "--include-path") for p in _split(include_path)) + (listed := _listed(list_of_files)),
            tuple(_prefix(p, "--exclude-path") for p in _split(exclude_path)),
            tuple(compile_regex(p, "--include-regex") for p in _split(include_regex)),
            tuple(compile_regex(p, "--exclude-regex") for p in _split(exclude_regex)),
            after,
            before,
            wildcard(source_wildcard) if source_wildcard else None,
            recursive,
            given,
            listed,
        )

    def narrowed(self, *, source_wildcard: str | None = None, recursive: bool | None = None,
                 list_of_files: str | None = None) -> Filters:
        """These filters with a source wildcard, the recursion or a --list-of-files (read here, once) set: nothing
        parsed before is read again."""
        text = dict(self.text)
        top, listed = self.top, _listed(list_of_files)
        if list_of_files:
            if "list_of_files" in text:
                raise UsageError("one list of files at a time: the filters given name one already")
            text["list_of_files"] = list_of_files
        if source_wildcard:
            text["source_wildcard"] = source_wildcard
            top = wildcard(source_wildcard)
        if recursive is not None:
            text.pop("recursive", None)
            if not recursive:
                text["recursive"] = False
        return dataclasses.replace(self, top=top, recursive=self.recursive if recursive is None else recursive,
                                   text=text, include_paths=self.include_paths + listed, listed=self.listed + listed)

    @classmethod
    def from_journal(cls, text: object) -> Filters:
        """The filters a journaled job was started with (`text` as `Filters.text` recorded it)."""
        return cls.parse(**text) if isinstance(text, dict) else cls()

    @functools.cached_property
    def active(self) -> bool:
        return bool(self.include_patterns or self.exclude_patterns or self.include_paths or self.exclude_paths
                    or self.include_regexes or self.exclude_regexes or self.include_after is not None
                    or self.include_before is not None or self.top is not None or not self.recursive)

    def enters(self, folder: str) -> bool:
        """Whether a walk need look inside `folder` (relative, no trailing '/'): False only when nothing under
        it could match, so a pruned walk takes exactly the files an unpruned one would."""
        if not self.recursive:
            return False
        if self.top is not None and not self.top.match(folder.split("/", 1)[0]):
            return False
        if any((folder + "/").startswith(p) for p in self.exclude_paths):
            return False  # every path below starts with the excluded prefix
        return not self.include_paths or folder in self._path_ancestors or self._under_included(folder)

    def matches(self, rel: str, mtime: float | None = None) -> bool:
        """True when `rel` (a '/'-separated relative path) takes part; excludes win over includes."""
        if not self.active:
            return True
        if not self.recursive and "/" in rel:
            return False
        if self.top is not None and not self.top.match(rel.split("/", 1)[0]):
            return False
        name = rel.rsplit("/", 1)[-1]
        return not self._excluded(rel, name) and self._included(rel, name) and self._in_time(mtime)

    def _excluded(self, rel: str, name: str) -> bool:
        return (any(p.match(name) for p in self.exclude_patterns) or any(rel.startswith(p) for p in self.exclude_paths)
                or any(r.search(rel) for r in self.exclude_regexes))

    def _included(self, rel: str, name: str) -> bool:
        """Every kind of include given takes it (a kind not given takes everything)."""
        return ((not self.include_patterns or any(p.match(name) for p in self.include_patterns))
                and (not self.include_paths or self._under_included(rel, record=True))
                and (not self.include_regexes or any(r.search(rel) for r in self.include_regexes)))

    @functools.cached_property
    def _included_set(self) -> frozenset[str]:
        return frozenset(self.include_paths)

    @functools.cached_property
    def _path_ancestors(self) -> frozenset[str]:
        """Every folder above an include path (a walk must enter them to reach it)."""
        return frozenset(p[:i] for p in self.include_paths for i, c in enumerate(p) if c == "/")

    def _under_included(self, rel: str, *, record: bool = False) -> bool:
        """`rel` is an include path or lies below one: a lookup per level, however many paths (--list-of-files
        may name thousands). With `record`, the path it is under counts as found."""
        included = self._included_set
        if not (record and self.listed):
            return rel in included or any(rel[:i] in included for i, c in enumerate(rel) if c == "/")
        hits = [rel[:i] for i, c in enumerate(rel) if c == "/" and rel[:i] in included]
        hits += [rel] if rel in included else []
        self._found.update(hits)
        return bool(hits)

    @functools.cached_property
    def _found(self) -> set[str]:
        return set()

    def unmatched(self) -> list[str]:
        """The --list-of-files paths no file or blob matched (so far): each is reported as missing."""
        return [p for p in self.listed if p not in self._found]

    def _in_time(self, mtime: float | None) -> bool:
        if mtime is None:
            return True
        if self.include_after is not None and mtime < self.include_after:
            return False
        return self.include_before is None or mtime <= self.include_before  # "before or on", as AzCopy
