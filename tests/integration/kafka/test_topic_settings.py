"""Topics from settings on the real broker: `env create` sends retention by kind of topic,
compaction and min.insync.replicas; with DLROVER_EVENTS_CREATE_TOPICS=false it creates
nothing, says which topics are missing, and leaves them at a delete.

tansu stores the configs it is given and returns them (DescribeConfigs); whether it
enforces a retention is its business, not what is checked here."""

from __future__ import annotations

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from dlrover_events.bus.admin import TopicAdmin
from dlrover_events.bus.kafka_client import kafka_connection
from dlrover_events.bus.topics import ENV_TOPICS, env_topics, topic
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import TopicsMissing
from dlrover_events.settings import Settings
from schemas.control import EnvMode
from tests.conftest import unique_env

pytestmark = pytest.mark.integration


async def described(settings: Settings, names: list[str]) -> dict[str, dict[str, str]]:
    admin = AIOKafkaAdminClient(**kafka_connection(settings))
    await admin.start()
    try:
        answers = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
        )
    finally:
        await admin.close()
    return {
        resource[3]: {entry[0]: entry[1] for entry in resource[4]}
        for answer in answers
        for resource in answer.resources
    }


async def test_env_create_gives_each_kind_of_topic_its_retention(
    settings: Settings, pg_dsn: str
) -> None:
    configured = settings.with_overrides(
        retention_metrics_ms=3_600_000,
        retention_events_ms=7_200_000,
        retention_plans_ms=-1,
        retention_results_ms=86_400_000,
        retention_eval_ms=172_800_000,
        retention_dlq_ms=1_209_600_000,
        min_insync_replicas=1,
    )
    registry = EnvRegistry(configured, pg_dsn)
    env = unique_env("ret")
    await registry.create(env, EnvMode.VIRTUAL, partitions=1)
    try:
        configs = await described(configured, env_topics(env))
    finally:
        await registry.delete(env, force=True)
    want = {
        "job.metrics": "3600000",
        "job.events": "7200000",
        "brain.plans": "-1",
        "scale.plans": "-1",
        "job.requests": "-1",
        "experiments": "-1",
        "trial.metrics": "3600000",
        "trial.decisions": "-1",
        "checkpoints": "7200000",
        "scale.results": "86400000",
        "eval.reports": "172800000",
        "dlq": "1209600000",
    }
    for spec in ENV_TOPICS:
        got = configs[topic(env, spec.name)]
        assert got.get("min.insync.replicas") == "1", spec.name
        if spec.compacted:
            assert got.get("cleanup.policy") == "compact" and "retention.ms" not in got
        else:
            assert got.get("retention.ms") == want[spec.name], spec.name


async def test_without_create_topics_missing_topics_are_named_and_kept(
    settings: Settings, pg_dsn: str
) -> None:
    env = unique_env("own")
    hands_off = settings.with_overrides(create_topics=False)
    registry = EnvRegistry(hands_off, pg_dsn)
    with pytest.raises(TopicsMissing) as missing:
        await registry.create(env, EnvMode.VIRTUAL, partitions=1)
    text = str(missing.value)
    assert text.startswith("topics missing: ") and "DLROVER_EVENTS_CREATE_TOPICS=false" in text
    for name in env_topics(env):
        assert name in text
    assert env not in [e.name for e in await registry.list()], "nothing half made"
    # whoever owns the topics makes them (here: an admin allowed to); then the env is made
    async with TopicAdmin(settings) as admin:
        await admin.ensure_env_topics(env, 1)
    await registry.create(env, EnvMode.VIRTUAL, partitions=1)
    await registry.delete(env, force=True)
    async with TopicAdmin(settings) as admin:
        left = set(await admin.list_topics())
        assert set(env_topics(env)) <= left, "a delete leaves topics it did not make"
        await admin.delete_env_topics(env)
