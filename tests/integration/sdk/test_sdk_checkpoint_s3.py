"""Checkpoints on object storage (issue 36, item 3): a 2-rank torchrun job (gloo, CPU) saves
to ``s3://`` on moto's S3 server (its server mode: the S3 API over HTTP, on 127.0.0.1,
started by the test), the checkpoints are listed and loaded by the next run, and an
upload that fails for a while (the server stopped, then started again) is retried
behind training, which never stops, and commits once the server is back."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk.torch import list_checkpoints
from tests.conftest import REPO
from tests.integration.sdk.test_sdk_checkpoint_torchrun import command, environ, lines, one, run

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

BUCKET = "checkpoints"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class S3:
    """moto's server on a port of its own, stopped and started again at will (its
    buckets live in this process: they outlive a restart, as a real store's would)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server: Any = None

    def start(self) -> None:
        self.server = moto_server.ThreadedMotoServer(
            ip_address="127.0.0.1", port=self.port, verbose=False
        )
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    store = S3()
    store.start()
    boto3.client("s3", endpoint_url=store.endpoint).create_bucket(Bucket=BUCKET)
    try:
        yield store
    finally:
        store.stop()


def test_save_list_load_and_an_outage_on_s3(s3: S3) -> None:
    root = f"s3://{BUCKET}/jobs/job-1"
    options = {"endpoint_url": s3.endpoint}
    # botocore retries a refused connection for seconds itself (s3fs then about 2 s
    # more): one try of botocore's, so the outage reaches the checkpoint's own retries
    s3fs = {"endpoint_url": s3.endpoint, "config_kwargs": {"retries": {"max_attempts": 1}}}
    env = {**CREDENTIALS, "FSSPEC_S3": json.dumps(s3fs)}
    first = run(2, f"--root={root}", "--every=2", "--until=4", env=env)
    assert [m.step for m in list_checkpoints(root, options)] == [4, 2]
    saved = one(first, "exit")

    # the next run loads it, then the store goes away for a while mid-training
    proc = subprocess.Popen(
        command(2, f"--root={root}", "--every=4", "--until=40", "--step-sleep-s=0.1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environ(env),
        cwd=REPO,
    )
    seen: list[tuple[float, str]] = []
    reader = threading.Thread(
        target=lambda: seen.extend((time.monotonic(), line) for line in proc.stdout or []),
        daemon=True,
    )
    reader.start()

    def steps_since(t: float) -> list[int]:
        return [e["step"] for at, line in list(seen) if at >= t for e in lines(line)
                if e["event"] == "loss"]  # fmt: skip

    try:
        deadline = time.monotonic() + 180
        while not steps_since(0):
            assert proc.poll() is None, "".join(line for _, line in seen)[-3000:]
            assert time.monotonic() < deadline, "the job did not start training"
            time.sleep(0.05)
        down_at = time.monotonic()
        s3.stop()
        time.sleep(6.0)
        during = steps_since(down_at)
        s3.start()
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    reader.join(10)
    out = "".join(line for _, line in seen)
    assert proc.returncode == 0, out[-3000:]
    events = lines(out)
    back = one(events, "resumed")
    assert back["step"] == 4 and back["digest"] == saved["digest"]  # loaded from S3
    assert len(during) >= 10, during  # training went on while no upload could
    end = one(events, "exit")
    assert end["persist_failures"] >= 1 and end["given_up"] == 0, end
    committed = [m.step for m in list_checkpoints(root, options)]
    assert committed[0] == 40 and committed[-2:] == [4, 2]
    # the save that met the outage was committed after it, not lost
    assert any(min(during) <= s <= max(during) + 4 for s in committed), (committed, during)
