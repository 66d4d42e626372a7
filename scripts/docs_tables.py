"""Write the manual's generated tables into their pages: the transfer flags (docs/cli.md, from TransferConfig's
Flag declarations), AzCopy's flags (docs/azcopy.md, from blobsync/cli/azcopy.py) and the errors a caller can meet
(docs/library.md, from blobsync's exports and the classes' docstrings).

    .venv/bin/python scripts/docs_tables.py          # rewrite them
    .venv/bin/python scripts/docs_tables.py --check  # exit 1 if a page is stale (the suite runs this)
"""

from __future__ import annotations

import sys
from pathlib import Path

from blobsync.cli.azcopy import compatibility_table
from blobsync.cli.config_flags import flag_table

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _between(text: str, begin: str, end: str, table: str) -> str:
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def _azcopy(text: str) -> str:
    start = text.index("| AzCopy flag | commands | blobsync |")
    end = text.find("\n\n", start)
    return text[:start] + compatibility_table() + (text[end:] if end != -1 else "\n")


def error_table() -> str:
    """Every error class `blobsync` exports: what it derives from, its exit code, how far it reaches, and why."""
    import inspect

    import blobsync
    from blobsync.errors import BlobsyncError

    rows = ["| Error | Is a | Exit code | Reach | Raised when |", "|---|---|---|---|---|"]
    classes = [getattr(blobsync, n) for n in sorted(blobsync.__all__)]
    for cls in (c for c in classes if inspect.isclass(c) and issubclass(c, BlobsyncError)):
        parents = ", ".join(f"`{b.__name__}`" for b in cls.__bases__)
        doc = " ".join((cls.__doc__ or "").split())
        rows.append(f"| `{cls.__name__}` | {parents} | {int(cls.exit_code)} | {cls.scope.name.lower()} | {doc} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    pages = {DOCS / "cli.md": lambda t: _between(t, "<!-- flags:begin -->", "<!-- flags:end -->", flag_table()),
             DOCS / "azcopy.md": _azcopy,
             DOCS / "library.md": lambda t: _between(t, "<!-- errors:begin -->", "<!-- errors:end -->",
                                                     error_table())}
    stale = []
    for path, make in pages.items():
        text = path.read_text(encoding="utf-8")
        made = make(text)
        if made != text:
            stale.append(path.name)
            if "--check" not in argv:
                path.write_text(made, encoding="utf-8")
    if stale and "--check" in argv:
        print(f"stale tables in docs/{', docs/'.join(stale)}: run scripts/docs_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
