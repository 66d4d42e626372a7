"""A long flat listing split by name, where the store can start a listing at any name (Azure's startFrom): after
SPLIT_AFTER objects, probes find names further on, and the ranges between them are listed side by side, each ending
at the name the next one starts with. No name is missed: each range but the last ends only on meeting a name the service
listed, and a range that never meets it (that blob deleted meanwhile, or a service ordering names otherwise) goes on
to the end, listing names twice into an index that keeps one entry per name."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from blobsync.backends.base import BlobProperties
from blobsync.errors import BlobsyncError

if TYPE_CHECKING:
    from blobsync.engine.listing import RemoteLister

log = logging.getLogger("blobsync")

# The characters probed after a name's common part: what names are made of, and a few beyond ASCII.
ALPHABET = sorted(set("!#$%&'()+,-.0123456789;=@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]^_`abcdefghijklmnopqrstuvwxyz{}~")
                  | {"\u00c0", "\u0400", "\u3000", "\ue000", "\U00010000"})
DEPTH = 64  # characters after the prefix looked at for where the names still to come part from the last one seen
# Ranges of one listing at once: each holds a page of 5,000 (its body, its records and the next body asked for
# ahead, ~11 MB). A no-op sync of 10^6 objects in one folder here: 4 ranges 17.1 s and 118 MiB, 8 ranges 16.6 s and
# 162 MiB, 16 ranges 18.9 s and 193 MiB. On Azure (a page in 0.2-0.5 s) 6 ranges list ~60,000-150,000 objects a
# second, about what one core parses.
RANGES_MAX = 6
# Objects a range lists before it tries to split, then twice as many...: a listing of a few pages is not worth the
# probes (on an emulator each costs what listing the prefix does: a 50,000-file sync took 7 s, with splits at
# 5,000 objects 50 s).
SPLIT_AFTER = 20_000


def _kind(c: str) -> int:
    return 0 if c.isdigit() else 1 if c.isalpha() and c.isascii() else 2


def _spread(items: list[str], count: int) -> list[str]:
    """`count` of `items`, evenly spread (all of them if there are no more)."""
    if count <= 0:
        return []
    if len(items) <= count:
        return items
    return [items[i * len(items) // count] for i in range(count)]


def _successor(c: str) -> str:
    """The next character (past the surrogates, which no name holds)."""
    code = ord(c) + 1
    return chr(0xE000 if 0xD800 <= code <= 0xDFFF else min(code, 0x10FFFF))


def part_probes(prefix: str, after: str) -> list[str]:
    """For each position after the prefix, the least name above every name that shares `after` up to and
    including that position: the first of them a probe finds names at is where the names still to come part."""
    end = min(len(after), len(prefix) + DEPTH)
    return [after[:i] + _successor(after[i]) for i in range(len(prefix), end)]


def split_probes(after: str, position: int, count: int) -> list[str]:
    """Up to `count` names to probe at `position`: `after` up to it, then characters above its own there (those of
    its own kind first, digits after a digit, letters after a letter; then a spread of the rest)."""
    here = after[position] if position < len(after) else ""
    above = [c for c in ALPHABET if c > here]
    same = [c for c in above if here and _kind(c) == _kind(here)]
    other = [c for c in above if c not in same]
    picked = _spread(same, count) + _spread(other, count - min(count, len(same)))
    return [after[:position] + c for c in sorted(picked)]


async def list_in_ranges(lister: RemoteLister, prefix: str, ranges: int,
                         expected: Callable[[], int | None] | None = None) -> None:
    """Every object under `prefix` into the lister's index: one listing, which splits what it has still to list by
    name after SPLIT_AFTER objects, then after twice as many..., while fewer than `ranges` run (each split taking
    half of what is left), the ranges side by side; `expected` shapes the first one's last page, as for one
    listing. The first failure stops them all."""
    free = [ranges - 1]
    try:
        async with asyncio.TaskGroup() as group:

            async def span(start: str, stop: str | None) -> None:
                batch: list[Any] = []
                taken, next_try = 0, SPLIT_AFTER
                listing = lister.store.list_objects(prefix, request=lister.request, start=start,
                                                    expected=None if start else expected)
                try:
                    async for props in listing:
                        if props.name == stop:
                            break
                        lister.take(props, batch)
                        taken += 1
                        if len(batch) >= 1000:
                            lister.add(batch)
                            batch = []
                        if taken == next_try and free[0] > 0:
                            next_try *= 2
                            stop = await split(props.name, stop)
                finally:  # a range that met its end drops the page it asked for ahead
                    close = getattr(listing, "aclose", None)
                    if close is not None:
                        await close()
                lister.add(batch)

            async def split(after: str, stop: str | None) -> str | None:
                """Ranges started for what lies between `after` and `stop`; the end of this one now."""
                want = max(1, free[0] // 2)
                free[0] -= want
                anchors = await _anchors(lister, prefix, after, want, stop)
                free[0] += want - len(anchors)
                if not anchors:
                    return stop
                for begin, end in zip(anchors, [*anchors[1:], stop], strict=True):
                    group.create_task(span(begin, end))
                return anchors[0]

            await span("", None)
    except BaseExceptionGroup as failed:  # the first failure, as itself (an AuthError stays one)
        raise failed.exceptions[0] from None


async def _anchors(lister: RemoteLister, prefix: str, after: str, count: int, stop: str | None) -> list[str]:
    """Up to `count` names between `after` and `stop`, spread over the names there: probes first for where those
    part from `after`, then for names at that position. A probe's failure: no split (the one listing goes on)."""
    try:
        position = await _parting(lister, prefix, after)
        if position is None:
            return []
        found = await _probe(lister, prefix, split_probes(after, position, 2 * count))
    except BlobsyncError as exc:  # a service without startFrom (an older version, an emulator): no split
        log.info("listing %r in one range: %s", prefix, exc)
        return []
    names = sorted({name for _, name in found
                    if name is not None and after < name and (stop is None or name < stop) and name.startswith(prefix)})
    return _spread(names, count)


async def _parting(lister: RemoteLister, prefix: str, after: str) -> int | None:
    """The first position after the prefix where names after `after` part from it (None: there are none), by
    bisection: where a probe finds names, every later position's finds some too (its probe is a lesser name). A
    few probes one after another, not one per position at once: an emulator (Azurite) sorts every name under the
    prefix for each probe."""
    probes = part_probes(prefix, after)
    low, high = 0, len(probes)  # the answer's index in probes lies in [low, high]; high: none
    while low < high:
        middle = (low + high) // 2
        (_, name), = await _probe(lister, prefix, [probes[middle]])
        if name is not None and name > after:
            high = middle
        else:
            low = middle + 1
    return len(prefix) + low if low < len(probes) else None


async def _probe(lister: RemoteLister, prefix: str, starts: list[str]) -> list[tuple[str, str | None]]:
    """Each start with the first name under `prefix` at or after it (None: none), all asked at once."""

    def first(start: str) -> Coroutine[Any, Any, tuple[list[BlobProperties], str]]:
        return lister.request(functools.partial(lister.store.list_range, prefix, start, "", 1))

    # Every probe waited for, the first failure raised after: none is left running behind a failed one.
    answers = await asyncio.gather(*(first(s) for s in starts), return_exceptions=True)
    names: list[tuple[str, str | None]] = []
    for start, answer in zip(starts, answers, strict=True):
        if isinstance(answer, BaseException):
            raise answer
        page, _ = answer
        names.append((start, page[0].name if page else None))
    return names


def budget(prefixes: int, in_flight: int) -> int:
    """The ranges each of `prefixes` flat listings may split into, `in_flight` listings in all and RANGES_MAX at
    most."""
    return max(1, min(RANGES_MAX, in_flight // max(1, prefixes)))
