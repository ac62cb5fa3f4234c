"""Topic configs from settings (retention by kind of topic, compaction, min.insync.replicas)
and the Strimzi KafkaTopic resources rendered from the same specs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dlrover_events.bus.topic_manifests import CLUSTER_LABEL, kafka_topics
from dlrover_events.bus.topics import (
    CONFIG_CHANGES,
    CONTROL_SPEC,
    ENV_TOPICS,
    JOB_METRICS,
    SCALE_PLANS,
    topic_configs,
)
from dlrover_events.settings import Settings

SPECS = {t.name: t for t in ENV_TOPICS}


@pytest.fixture(autouse=True)
def _no_settings_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "none.toml"  # (a config file named must be there)
    empty.write_text("")
    monkeypatch.setenv("DLROVER_EVENTS_CONFIG", str(empty))


def test_every_deleted_topic_has_a_retention_setting_and_compacted_ones_none() -> None:
    for spec in (*ENV_TOPICS, CONTROL_SPEC):
        if spec.compacted:
            assert spec.retention is None, spec.name
        else:
            assert spec.retention is not None, spec.name
            assert f"retention_{spec.retention}_ms" in Settings.model_fields, spec.name


def test_configs_follow_the_settings() -> None:
    assert topic_configs(SPECS[JOB_METRICS], Settings()) == {}, "unset: the broker's default"
    settings = Settings(
        retention_metrics_ms=3_600_000, retention_plans_ms=-1, min_insync_replicas=2
    )
    assert topic_configs(SPECS[JOB_METRICS], settings) == {
        "retention.ms": "3600000",
        "min.insync.replicas": "2",
    }
    assert topic_configs(SPECS[SCALE_PLANS], settings)["retention.ms"] == "-1"
    # compacted topics stay compacted, whatever the retention settings say
    assert topic_configs(SPECS[CONFIG_CHANGES], settings) == {
        "cleanup.policy": "compact",
        "min.insync.replicas": "2",
    }
    assert topic_configs(CONTROL_SPEC, settings)["cleanup.policy"] == "compact"


def test_kafka_topics_cover_every_env_topic_and_the_control_topic_once() -> None:
    settings = Settings(retention_dlq_ms=1_209_600_000)
    resources = kafka_topics(
        ["prod", "standby"], settings, partitions=6, replicas=3, cluster="kafka", namespace="ns"
    )
    names = [r["spec"]["topicName"] for r in resources]
    assert names.count("dlrover.control") == 1
    for env in ("prod", "standby"):
        assert {f"{env}.{t.name}" for t in ENV_TOPICS} <= set(names)
    assert len(names) == 1 + 2 * len(ENV_TOPICS)
    for r in resources:
        assert r["apiVersion"] == "kafka.strimzi.io/v1beta2" and r["kind"] == "KafkaTopic"
        assert r["metadata"]["name"] == r["spec"]["topicName"]
        assert r["metadata"]["labels"][CLUSTER_LABEL] == "kafka"
        assert r["metadata"]["namespace"] == "ns"
        assert r["spec"]["replicas"] == 3
    by_name = {r["spec"]["topicName"]: r for r in resources}
    assert by_name["dlrover.control"]["spec"]["partitions"] == 1
    assert by_name["prod.job.metrics"]["spec"]["partitions"] == 6
    assert by_name["prod.dlq"]["spec"]["config"] == {"retention.ms": 1_209_600_000}
    assert by_name["prod.config.changes"]["spec"]["config"] == {"cleanup.policy": "compact"}
    assert by_name["standby.dlq"]["metadata"]["labels"]["dlrover-events.io/env"] == "standby"
    assert "config" not in by_name["prod.job.events"]["spec"]
    without = kafka_topics(["prod"], settings, partitions=1, replicas=1, cluster="k", control=False)
    assert "dlrover.control" not in [r["spec"]["topicName"] for r in without]


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from dlrover_events.cli.app import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def test_env_topics_strimzi_prints_resources_to_apply(tmp_path: Path) -> None:
    done = _cli(
        "env",
        "topics",
        "prod",
        "--strimzi",
        "--cluster",
        "my-cluster",
        "--replicas",
        "3",
        DLROVER_EVENTS_CONFIG=str(tmp_path / "none.toml"),  # (the fixture's empty file)
        DLROVER_EVENTS_RETENTION_METRICS_MS="86400000",
        DLROVER_EVENTS_PARTITIONS="12",
    )
    assert done.returncode == 0, done.stderr
    resources = list(yaml.safe_load_all(done.stdout))
    assert resources == kafka_topics(
        ["prod"],
        Settings(retention_metrics_ms=86_400_000),
        partitions=12,
        replicas=3,
        cluster="my-cluster",
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["prod", "--strimzi"], "error: --strimzi needs --cluster NAME"),
        (
            ["Prod", "--strimzi", "--cluster", "k"],
            "error: Invalid value for 'ENVS': env name 'Prod' must match",
        ),
    ],
)
def test_env_topics_mistakes_are_one_line(args: list[str], line: str) -> None:
    done = _cli("env", "topics", *args)
    assert done.returncode == 2
    assert done.stderr.startswith(line) and done.stderr.count("\n") == 1, done.stderr
