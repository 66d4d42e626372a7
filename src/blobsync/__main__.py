"""`python -m blobsync`: the same as the `blobsync` command."""

from blobsync.cli.entry import main

if __name__ == "__main__":
    main()
