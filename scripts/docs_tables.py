"""Write the manual's generated tables into their pages: the transfer flags (docs/cli.md, from TransferConfig's
Flag declarations) and AzCopy's flags (docs/azcopy.md, from blobsync/cli/azcopy.py).

    .venv/bin/python scripts/docs_tables.py          # rewrite them
    .venv/bin/python scripts/docs_tables.py --check  # exit 1 if a page is stale (the suite runs this)
"""

from __future__ import annotations

import sys
from pathlib import Path

from blobsync.cli.azcopy import compatibility_table
from blobsync.cli.options import flag_table

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _between(text: str, begin: str, end: str, table: str) -> str:
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def _azcopy(text: str) -> str:
    start = text.index("| AzCopy flag | commands | blobsync |")
    end = text.find("\n\n", start)
    return text[:start] + compatibility_table() + (text[end:] if end != -1 else "\n")


def main(argv: list[str]) -> int:
    pages = {DOCS / "cli.md": lambda t: _between(t, "<!-- flags:begin -->", "<!-- flags:end -->", flag_table()),
             DOCS / "azcopy.md": _azcopy}
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
