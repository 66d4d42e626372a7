"""`python -m blobsync`: the same as the `blobsync` command."""

from blobsync.cli.main import main

if __name__ == "__main__":
    main()
