"""A real S3 API on loopback for the archive's tests: moto's server (Flask, in a thread of the
test process), reached over HTTP by boto3 in the tests and in broker processes alike. There is
no S3 server in this machine's package registries; moto's implements the calls the archive makes
(put with Content-MD5, get with ranges, head, list) and checks what a client sends."""

import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

# Credentials moto accepts; set for this process and handed to broker processes (``env``).
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "tidemq-test",
    "AWS_SECRET_ACCESS_KEY": "tidemq-test-secret",
    "AWS_REGION": "us-east-1",
}


@dataclass(frozen=True)
class S3Archive:
    endpoint_url: str
    bucket: str
    prefix: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach it (credentials, region, endpoint)."""
        return {**S3_ENV, "AWS_ENDPOINT_URL": self.endpoint_url}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    # moto takes about a second to import: only tests that use S3 pay for it.
    from moto.server import ThreadedMotoServer  # noqa: PLC0415

    for k, v in S3_ENV.items():
        os.environ.setdefault(k, v)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_archive(s3_endpoint: str) -> S3Archive:
    """A new bucket for one test."""
    import boto3  # noqa: PLC0415

    bucket = f"archive-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(
        Bucket=bucket
    )
    return S3Archive(s3_endpoint, bucket, "tidemq/broker-a")
