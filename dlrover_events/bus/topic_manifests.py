"""Strimzi `KafkaTopic` resources for envs' topics: the alternative to topics the app
creates (`DLROVER_EVENTS_CREATE_TOPICS=false`), for clusters where Strimzi's Topic
Operator owns topics. Made from the same specs and configs as `env create` uses
(`ENV_TOPICS`, `topic_configs`), so both ways give the same topics."""

from __future__ import annotations

from typing import Any

from dlrover_events.bus.topics import CONTROL_SPEC, ENV_TOPICS, TopicSpec, topic, topic_configs
from dlrover_events.settings import Settings

STRIMZI_API_VERSION = "kafka.strimzi.io/v1beta2"
#: the label by which Strimzi's Topic Operator knows which Kafka cluster a topic is for
CLUSTER_LABEL = "strimzi.io/cluster"


def kafka_topics(
    envs: list[str],
    settings: Settings,
    *,
    partitions: int,
    replicas: int,
    cluster: str,
    namespace: str | None = None,
    control: bool = True,
) -> list[dict[str, Any]]:
    """One KafkaTopic per topic of each env (and, with `control`, the bus's one
    dlrover.control topic), named as the topic (env and topic names are valid resource
    names)."""
    wanted: list[tuple[TopicSpec, str, int, str | None]] = []
    if control:
        wanted.append((CONTROL_SPEC, CONTROL_SPEC.name, 1, None))
    for env in envs:
        wanted.extend((spec, topic(env, spec.name), partitions, env) for spec in ENV_TOPICS)
    return [
        _resource(name, parts, replicas, topic_configs(spec, settings), cluster, namespace, env)
        for spec, name, parts, env in wanted
    ]


def _resource(
    name: str,
    partitions: int,
    replicas: int,
    configs: dict[str, str],
    cluster: str,
    namespace: str | None,
    env: str | None,
) -> dict[str, Any]:
    labels = {CLUSTER_LABEL: cluster, "app.kubernetes.io/part-of": "dlrover-events"}
    if env is not None:
        labels["dlrover-events.io/env"] = env
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if namespace:
        metadata["namespace"] = namespace
    spec: dict[str, Any] = {"topicName": name, "partitions": partitions, "replicas": replicas}
    if configs:
        spec["config"] = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in configs.items()}
    return {
        "apiVersion": STRIMZI_API_VERSION,
        "kind": "KafkaTopic",
        "metadata": metadata,
        "spec": spec,
    }


__all__ = ["CLUSTER_LABEL", "STRIMZI_API_VERSION", "kafka_topics"]
