"""What the checkpoint tests share: an S3 server of their own (moto's server mode, the S3
API over HTTP on 127.0.0.1), checkpoints written to it as a job writes them (a folder of
a manifest and one file per rank), and the CheckpointCommitted a job publishes for each."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
import s3fs
from moto.server import ThreadedMotoServer

from schemas.checkpoints import CheckpointCommitted
from schemas.jobs import JobMeta

BUCKET = "ckpts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3:
    """The test's S3 server, and a client of the test's own (no instance or listing cache
    shared with the service's)."""

    def __init__(self, url: str, options: dict[str, dict[str, Any]], port: int) -> None:
        self.url = url
        self.port = port
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        #: fsspec's storage options by protocol, as the checkpoints service takes them
        self.options = options
        self.fs = s3fs.S3FileSystem(
            skip_instance_cache=True, use_listings_cache=False, **options["s3"]
        )

    def write_checkpoint(self, path: str, ranks: int = 2) -> int:
        """A checkpoint folder as torch.distributed.checkpoint leaves it; its size."""
        files = {f"{BUCKET}/{path}/__{r}_0.distcp": bytes([r]) * 1000 for r in range(ranks)}
        files[f"{BUCKET}/{path}/.metadata"] = b"manifest"
        self.fs.pipe(files)
        return sum(len(v) for v in files.values())

    def stop(self) -> None:
        """The server gone (its buckets stay in this process's moto state)."""
        self.server.stop()

    def start(self) -> None:
        """The server back on its port, with what it held."""
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def exists(self, path: str) -> bool:
        self.fs.invalidate_cache()
        return bool(self.fs.exists(f"{BUCKET}/{path}/.metadata"))


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    options = {
        "s3": {
            "endpoint_url": url,
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"region_name": "us-west-2"},
        }
    }
    store = S3(url, options, port)
    store.server.start()
    store.fs.mkdir(BUCKET)
    try:
        yield store
    finally:
        store.server.stop()


def committed(
    env: str,
    job: str,
    step: int,
    *,
    url: str,
    size: int = 3000,
    experiment: str | None = None,
    trial: int | None = None,
    metrics: dict[str, float] | None = None,
    plan_id: str | None = None,
    world_size: int = 2,
) -> CheckpointCommitted:
    """What a job's rank 0 publishes once a checkpoint is complete on its storage."""
    return CheckpointCommitted(
        env=env,
        source="test-job",
        job=JobMeta(uuid=f"uid-{job}", name=job),
        checkpoint_id=f"{job}-{step}",
        url=url,
        step=step,
        experiment=experiment,
        trial=trial,
        world_size=world_size,
        plan_id=plan_id,
        metrics=metrics or {},
        size_bytes=size,
        blocking_s=0.05,
        persist_s=1.5,
    )
