"""blobsync for PyTorch training (`pip install blobsync[torch]`): Distributed Checkpoint storage on Blob
(BlobStorageWriter, BlobStorageReader), checkpoints kept and found again (Checkpoints), and datasets of blobs for
DataLoader workers (BlobDataset, IterableBlobDataset)."""

from blobsync.torch.checkpoints import Checkpoints
from blobsync.torch.datasets import BlobDataset, IterableBlobDataset
from blobsync.torch.dcp import BlobStorageReader, BlobStorageWriter, IncompleteCheckpointError

__all__ = ["BlobDataset", "BlobStorageReader", "BlobStorageWriter", "Checkpoints", "IncompleteCheckpointError",
           "IterableBlobDataset"]
