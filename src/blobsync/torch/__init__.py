"""blobsync for PyTorch training (`pip install blobsync[torch]`): Distributed Checkpoint storage on Blob
(BlobStorageWriter, BlobStorageReader), checkpoints kept and found again (Checkpoints), and datasets of blobs for
DataLoader workers (BlobDataset, IterableBlobDataset), and a DCP checkpoint as one whole state (consolidate)."""

from blobsync.torch.checkpoints import Checkpoints, Saved
from blobsync.torch.consolidate import consolidate
from blobsync.torch.datasets import BlobDataset, IterableBlobDataset
from blobsync.torch.dcp import BlobStorageReader, BlobStorageWriter, IncompleteCheckpointError

__all__ = ["BlobDataset", "BlobStorageReader", "BlobStorageWriter", "Checkpoints", "IncompleteCheckpointError",
           "IterableBlobDataset", "Saved", "consolidate"]
