"""The store contract (tests/store_conformance.py) on every store blobsync ships: in memory and Azure (Azurite)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator

import pytest

from blobsync.backends import memory
from blobsync.backends.base import Store
from blobsync.backends.registry import open_store
from blobsync.config import TransferConfig
from store_conformance import CASES, Case, ReadBack


@pytest.fixture(params=["memory", "azurite"])
def opened(request: pytest.FixtureRequest) -> Iterator[tuple[str, ReadBack]]:
    """(URL of an empty container, independent reader of its objects) for each store."""
    if request.param == "memory":
        name = f"conf-{uuid.uuid4().hex[:12]}"
        memory.container(name)
        yield f"memory://{name}", lambda blob: memory.container(name, create=False).objects[blob].data
        memory.drop(name)
        return
    container = request.getfixturevalue("container")
    yield container.url, container.download


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_store_keeps_the_contract(opened: tuple[str, ReadBack], case: Case) -> None:
    url, read_back = opened

    async def run() -> None:
        store: Store = open_store(url, TransferConfig(), os.environ)
        try:
            await case(store, read_back)
        finally:
            await store.close()

    asyncio.run(run())
