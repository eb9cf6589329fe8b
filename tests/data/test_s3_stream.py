"""s3:// streams through streaming's S3 client, against a local S3-compatible server (moto)."""
from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from cplm_megatron.data.config import BatchShape, DataConfig
from cplm_megatron.data.loader import build_train_loader
from cplm_megatron.data.manifest import DatasetError
from tests.data_fixtures import numbered_docs, write_synthetic_dataset

pytestmark = pytest.mark.usefixtures("isolated_streaming")
SEQ = 16
BUCKET = "cplm-test-data"


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 and the environment streaming/boto3 read to reach it."""
    server_mod = pytest.importorskip("moto.server")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("S3_ENDPOINT_URL", endpoint)
    try:
        yield endpoint
    finally:
        server.stop()


def upload(endpoint: str, directory: Path, prefix: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    for file in sorted(directory.iterdir()):
        client.upload_file(str(file), BUCKET, f"{prefix}/{file.name}")


def keys_of(cfg: DataConfig, count: int) -> list[tuple[int, ...]]:
    loader = build_train_loader(cfg, BatchShape(SEQ, 3, 3), 0, 1)
    return [tuple(row.tolist()) for _ in range(count) for row in next(loader)["tokens"]]


def test_s3_stream_reads_the_same_samples_as_the_local_copy(s3_endpoint: str, tmp_path: Path) -> None:
    local = tmp_path / "ds"
    write_synthetic_dataset(local, numbered_docs(24, SEQ, doc_len=21), SEQ, shard_size_limit=1 << 9)
    upload(s3_endpoint, local, "datasets/ds")
    common = {"seed": 5}
    from_s3 = keys_of(DataConfig(streams=[{"path": f"s3://{BUCKET}/datasets/ds", "name": "remote"}],
                                 cache_dir=str(tmp_path / "cache"), **common), 10)
    from_disk = keys_of(DataConfig(streams=[{"path": str(local)}], **common), 10)
    assert from_s3 == from_disk and len(set(from_s3[:24])) == 24
    cached = list((tmp_path / "cache").glob("train-remote-*/shard.*.mds"))
    assert len(cached) == len(list(local.glob("shard.*.mds.zstd")))


def test_missing_remote_dataset_names_the_url(s3_endpoint: str, tmp_path: Path) -> None:
    import boto3

    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=BUCKET)
    cfg = DataConfig(streams=[{"path": f"s3://{BUCKET}/nothing-here"}], cache_dir=str(tmp_path / "c"))
    with pytest.raises(DatasetError, match=rf"cannot read s3://{BUCKET}/nothing-here/manifest\.json"):
        build_train_loader(cfg, BatchShape(SEQ, 1, 1), 0, 1)
