"""Mistakes a pipeline author makes; mypy --strict must report every line marked `# expect-error`."""

import blobsync
from blobsync import DeleteMode, TransferConfig

URL = "https://acct.blob.core.windows.net/cont"

blobsync.sync("./src", URL, raise_on_eror=True)  # expect-error
blobsync.copy("./src", URL, concurency=4)  # expect-error
blobsync.sync("./src", URL, subscribers=print)  # expect-error
blobsync.sync("./src", URL, delete="yes")  # expect-error
blobsync.sync("./src", URL, compare="newest")  # expect-error
blobsync.watch("./src", URL, settle="2s")  # expect-error
blobsync.resume("job", concurrency=4)  # expect-error
blobsync.remove(URL, recursive="yes")  # expect-error
blobsync.list_blobs(URL, max_retry=3)  # expect-error
TransferConfig(concurrency="lots")  # expect-error
TransferConfig(block_size_mb=4)  # expect-error

client = blobsync.Client(URL)
client.copy("./src", URL, raise_on_eror=True)  # expect-error
client.sync("./src", URL, delete="yes")  # expect-error
client.put("text", "name")  # expect-error
client.submit(client.aio.put, b"x", "n", concurency=4)  # expect-error
data: bytes = client.get("n", into=bytearray(4))  # expect-error

# What is right passes.
blobsync.sync("./src", URL, delete=False, compare="md5", dry_run=True)
blobsync.sync("./src", URL, delete=DeleteMode.TRUE, max_delete="5%")
blobsync.copy("./src", URL, TransferConfig(concurrency="auto", recursive=True), subscribers=[blobsync.BaseSubscriber()])
with blobsync.Client(URL) as c:
    c.sync("./src", c.url_for("run7"), delete=False)
    view: memoryview = c.get("n", into=bytearray(4))
    whole: bytes = c.get("n")
    c.submit(c.aio.put, b"x", "n").result()

# The docs' error handling passes as written: a job's failure always carries its report.
try:
    blobsync.sync("./src", URL, raise_on_error=True)
except blobsync.TransferFailedError as failed:
    print(failed.exit_code, failed.report.failures)
except (blobsync.NetworkError, blobsync.ConflictError, blobsync.DroppedError) as other:
    print(other.exit_code)
