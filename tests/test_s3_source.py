"""S3 as a copy's source (issue 30, part 4): s3://bucket/prefix read through this machine from a real S3
emulator (moto's server) with the usual AWS variables, SigV4-signed, into Azurite: filters, the MD5 check against
the object's ETag, content type and metadata carried, resume after a kill, and refusals with one line. Every blob
checked with an SDK download; the source seeded and read with boto3."""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from awscrt.checksums import crc64nvme

from blobsync.backends.s3.sigv4 import AwsCredentials, sign
from blobsync.config import MiB
from conftest import ContainerHandle
from support.azurite import Azurite
from support.cli import kill_when_held, run
from support.proxy import FaultProxy
from support.s3 import MotoS3


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    with MotoS3() as server:
        yield server


def test_sigv4_signs_as_botocore_does() -> None:
    import calendar
    import time

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest("GET", "http://127.0.0.1:9000/bucket/dir/a%20b%2Bc.txt?list-type=2&prefix=dir%2Fa%20b",
                         headers={"Range": "bytes=0-9"})
    S3SigV4Auth(Credentials("AKIDEXAMPLE", "secret/key+x", "token=="), "s3", "eu-west-1").add_auth(request)
    when = calendar.timegm(time.strptime(request.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))  # botocore's moment
    ours = sign(AwsCredentials("AKIDEXAMPLE", "secret/key+x", "token=="), "eu-west-1", "GET", "127.0.0.1:9000",
                "/bucket/dir/a b+c.txt", {"list-type": "2", "prefix": "dir/a b"}, {"Range": "bytes=0-9"}, now=when)
    assert ours["Authorization"] == request.headers["Authorization"]


def _seed(s3: MotoS3, bucket: str, objects: dict[str, bytes], **extra: object) -> None:
    client = s3.client()
    client.create_bucket(Bucket=bucket)
    for key, data in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=data, **extra)


def test_a_prefix_of_a_bucket_is_copied_through_this_machine_with_its_checks(
        s3: MotoS3, container: ContainerHandle, azurite: Azurite, tmp_path: Path) -> None:
    objects = {"models/a.pt": os.urandom(2000), "models/sub/b.pt": os.urandom(9 * MiB + 5),
               "models/skip.tmp": b"no", "other/c.pt": b"not under models/"}
    _seed(s3, "mlmodels", objects, ContentType="application/x-model", Metadata={"owner": "team", "x-team": "a"})
    env = {**s3.env, "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    out = run(["cp", "s3://mlmodels/models", container.url, "-r", "--exclude-pattern", "*.tmp", "--block-size-mb", "4",
               "--journal", str(tmp_path / "j.db")], env=env)
    assert out.returncode == 0, out.stderr
    assert container.blob_names() == ["models/a.pt", "models/sub/b.pt"]
    for key in ("models/a.pt", "models/sub/b.pt"):
        assert container.download(key) == objects[key]
    props = container.client.get_blob_client("models/sub/b.pt").get_blob_properties()
    big = objects["models/sub/b.pt"]
    crc = struct.pack("<Q", crc64nvme(big, 0)).hex() + hashlib.md5(big).hexdigest()  # blobsync's own, of these bytes
    assert props.content_settings.content_type == "application/x-model"
    assert props.metadata == {"owner": "team", "blobsynccrc64": crc}
    assert bytes(props.content_settings.content_md5) == hashlib.md5(objects["models/sub/b.pt"]).digest()
    assert s3.env["AWS_SECRET_ACCESS_KEY"] not in out.stdout + out.stderr


def test_a_killed_s3_copy_resumes_with_only_the_blocks_not_staged(
        s3: MotoS3, container: ContainerHandle, azurite: Azurite, proxy: FaultProxy, tmp_path: Path) -> None:
    data = os.urandom(20 * MiB)
    _seed(s3, "bigone", {"x.bin": data})
    env = {**s3.env, "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string_via(proxy.endpoint())}
    url = f"{proxy.endpoint()}/{container.name}/x.bin"
    args = ["cp", "s3://bigone/x.bin", url, "--block-size-mb", "2", "--concurrency", "4",
            "--journal", str(tmp_path / "j.db")]
    proxy.hold_after("put_block", 5)
    kill_when_held(args, proxy, env)
    assert proxy.stats.ok("put_block") == 5
    proxy.reset_stats()
    out = run(args, env=env)
    assert out.returncode == 0, out.stderr
    assert proxy.stats.ok("put_block") == 10 - 5  # the blocks the first run staged are not sent again
    assert container.download("x.bin") == data


def test_s3_mistakes_get_one_line(s3: MotoS3, container: ContainerHandle, azurite: Azurite, tmp_path: Path) -> None:
    env = {**s3.env, "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    journal = ["--journal", str(tmp_path / "j.db")]
    for args, words, code in (
            (["cp", "s3://no-such-bucket-x/a", container.url], "bucket does not exist", 1),
            (["cp", "s3://Bad_Bucket/a", container.url], "invalid bucket name", 2),
            (["cp", container.url + "/a", "s3://somebucket/a"], "source only", 2)):
        out = run([*args, *journal], env=env)
        assert out.returncode == code and words in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
    half = {k: v for k, v in env.items() if k != "AWS_SECRET_ACCESS_KEY"}  # moto checks no signature: the pair
    out = run(["cp", "s3://lockedone/k", container.url, *journal], env=half)  # is checked before any request
    assert out.returncode == 2 and "go together" in out.stderr and "Traceback" not in out.stderr
    assert container.blob_names() == []


def test_answers_an_s3_service_should_not_send_are_errors_not_tracebacks() -> None:
    from blobsync.backends.s3.store import _listed, _props_from_headers
    from blobsync.errors import ServiceError

    with pytest.raises(ServiceError, match="not a number"):
        _listed(b"<ListBucketResult><Contents><Key>a</Key><Size>-1</Size></Contents></ListBucketResult>")
    with pytest.raises(ServiceError, match="not well-formed XML"):
        _listed(b"<ListBucketResult><Contents>")
    with pytest.raises(ServiceError, match="not a number"):
        _props_from_headers("k", {"content-length": "1e9"})
    assert _props_from_headers("k", {"content-length": "5", "last-modified": "yesterday"}).last_modified.year == 1970
