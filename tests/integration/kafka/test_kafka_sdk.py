"""The SDK in a training process configured as a pod is (DLROVER_EVENTS_* only): it publishes
its samples over SASL_SSL and over mutual TLS; with a wrong password it says why in one
line and training goes on to its end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import JOB_METRICS, topic
from dlrover_events.settings import Settings
from schemas.codec import decode
from schemas.jobs import RuntimeSample
from tests.integration.kafka.conftest import Pki, environ, sasl, secure_settings, tls
from tests.integration.kafka.front import KafkaFront
from tests.integration.kafka.test_kafka_tls import an_env

pytestmark = pytest.mark.integration

POD = Path(__file__).with_name("sdk_pod.py")
REPO = Path(__file__).resolve().parents[3]


def run_pod(settings: Settings, env: str, steps: int = 200) -> tuple[dict[str, Any], list[str]]:
    """The job's process; returns its reporter's stats and the lines of its log."""
    pod_env = {
        **environ(settings),
        "DLROVER_EVENTS_ENV": env,
        "DLROVER_EVENTS_JOB_ID": "job-secure",
        "DLROVER_EVENTS_ROLE": "worker",
        "DLROVER_EVENTS_RANK": "0",
        "DLROVER_EVENTS_REPORT_INTERVAL_S": "0.1",
        "DLROVER_EVENTS_FOLLOW_REAL": "never",
        "PYTHONPATH": str(REPO),
    }
    pod_env.pop("DLROVER_EVENTS_PG_DSN", None)  # a pod has no database
    done = subprocess.run(
        [sys.executable, str(POD), str(steps)],
        env=pod_env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.getcwd(),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr.splitlines()


def during_training(log: list[str]) -> list[str]:
    """The pod's log before its reporter's summary at close (what was dropped, and the
    closing line), which every job prints."""
    closing = ("dlrover-events: dropped ", "dlrover-events reporter closed")
    return [line for line in log if not any(c in line for c in closing)]


async def published(settings: Settings, env: str) -> list[RuntimeSample]:
    records = await read_topic(settings, topic(env, JOB_METRICS), timeout_s=10)
    return [e for r in records if isinstance(e := decode(r.value), RuntimeSample)]


async def test_a_pod_reports_over_sasl_ssl(
    sasl_ssl_front: KafkaFront, pki: Pki, pg_dsn: str, tmp_path: Path
) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret-trainer")
    settings = secure_settings(
        sasl_ssl_front.bootstrap_servers,
        pg_dsn,
        **tls(pki)
        | sasl("SCRAM-SHA-256", "trainer", security_protocol="SASL_SSL", sasl_password=None),
        sasl_password_file=password,
    )
    async with an_env(settings) as env:
        stats, log = run_pod(settings, env)
        assert stats["samples"] > 0 and stats["published"] == stats["queued"], stats
        assert stats["dropped"] == 0 and log == [], log
        samples = await published(settings, env)
    assert len(samples) == stats["samples"]
    assert {s.job.uuid for s in samples} == {"job-secure"}


async def test_a_pod_reports_over_mutual_tls(mtls_front: KafkaFront, pki: Pki, pg_dsn: str) -> None:
    settings = secure_settings(
        mtls_front.bootstrap_servers,
        pg_dsn,
        **tls(pki, ssl_certfile=pki.client_cert, ssl_keyfile=pki.client_key),
    )
    async with an_env(settings) as env:
        stats, log = run_pod(settings, env, steps=50)
        assert stats["published"] == stats["queued"] > 0 and log == [], (stats, log)
        assert len(await published(settings, env)) == stats["samples"]


async def test_a_wrong_password_is_one_warning_and_training_goes_on(
    sasl_front: KafkaFront, pg_dsn: str
) -> None:
    good = secure_settings(sasl_front.bootstrap_servers, pg_dsn, **sasl(user="trainer"))
    async with an_env(good) as env:
        wrong = good.with_overrides(sasl_password="yesterday's password")
        stats, log = run_pod(wrong, env, steps=200)
        assert await published(good, env) == []
    # the steps all ran: the job finished its training
    assert stats["steps"] == 200 and stats["published"] == 0 and stats["samples"] > 0
    assert stats["last_error"].startswith(
        f"BusRefused: Kafka at {sasl_front.bootstrap_servers} refused user 'trainer'"
    )
    warnings = during_training(log)
    assert len(warnings) == 1, "\n".join(log)
    assert warnings[0].startswith(
        "WARNING dlrover_events.sdk.reporter: dlrover-events: cannot publish to Kafka: "
        f"Kafka at {sasl_front.bootstrap_servers} refused user 'trainer' (SCRAM-SHA-512): "
        "wrong username or password"
    )
    assert "training goes on" in warnings[0]


async def test_invalid_settings_in_a_pod_are_one_warning_and_training_goes_on(
    sasl_front: KafkaFront, pg_dsn: str
) -> None:
    good = secure_settings(sasl_front.bootstrap_servers, pg_dsn, **sasl(user="trainer"))
    async with an_env(good) as env:
        # SASL asked for, the password forgotten
        forgot = good.model_copy(update={"sasl_password": None})
        stats, log = run_pod(forgot, env, steps=100)
    assert stats["steps"] == 100 and stats["published"] == 0
    warnings = during_training(log)
    assert len(warnings) == 1, "\n".join(log)
    assert (
        "cannot publish to Kafka: invalid settings: DLROVER_EVENTS_SECURITY_PROTOCOL="
        "SASL_PLAINTEXT needs DLROVER_EVENTS_SASL_PASSWORD" in warnings[0]
    )
