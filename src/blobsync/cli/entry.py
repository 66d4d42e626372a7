"""The `blobsync` command's entry point: the garbage collector, the allocator and the CA store set for a short-lived
process."""

from __future__ import annotations

import gc


def main() -> None:
    # Loading the command's modules builds ~100,000 objects that live as long as the process; at the default
    # gen-0 threshold (700) the collector ran over them dozens of times while they loaded (~15 ms of a ~0.2 s
    # start). The command turns it back on, tuned for a transfer, once they are in (cli.main.main).
    gc.disable()
    from blobsync.local.platform import tune_malloc

    tune_malloc()
    from blobsync.local.child import own_process

    own_process()
    from blobsync.backends import trust_store

    trust_store.defer()
    from blobsync.cli.main import main as command

    command()
