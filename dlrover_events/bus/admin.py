"""Topic administration: an env's topics are created and deleted together."""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from dlrover_events.bus.kafka_client import kafka_connection, start_kafka_client
from dlrover_events.bus.topics import (
    CONTROL_SPEC,
    CONTROL_TOPIC,
    ENV_TOPICS,
    TopicSpec,
    topic,
    topic_configs,
)
from dlrover_events.errors import TopicsMissing
from dlrover_events.lifecycle import AsyncResource
from dlrover_events.settings import Settings

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36
_UNKNOWN_TOPIC = 3


class TopicAdmin(AsyncResource):
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._client = AIOKafkaAdminClient(
            **kafka_connection(settings),
            client_id=f"{settings.client_id}-admin",
            request_timeout_ms=settings.request_timeout_ms,
        )

    async def start(self) -> None:
        await start_kafka_client(self._client, self._settings)

    async def stop(self) -> None:
        await self._client.close()

    async def list_topics(self) -> list[str]:
        topics: list[str] = await self._client.list_topics()
        return sorted(topics)

    async def ensure_control_topic(self) -> None:
        await self._ensure([(CONTROL_SPEC, CONTROL_TOPIC, 1)])

    async def ensure_env_topics(self, env: str, partitions: int) -> list[str]:
        """Create the env's topics that do not exist yet; returns the full names."""
        wanted = [(t, topic(env, t.name), partitions) for t in ENV_TOPICS]
        await self._ensure(wanted)
        return [name for _, name, _ in wanted]

    async def delete_env_topics(self, env: str) -> None:
        if not self._settings.create_topics:
            log.warning(
                "env %s: its topics are left as they are (DLROVER_EVENTS_CREATE_TOPICS=false: "
                "whoever made them deletes them, e.g. its KafkaTopic resources)",
                env,
            )
            return
        existing = set(await self.list_topics())
        names = [topic(env, t.name) for t in ENV_TOPICS if topic(env, t.name) in existing]
        if not names:
            return
        resp = await self._client.delete_topics(names)
        for name, code in resp.topic_error_codes:
            if code not in (0, _UNKNOWN_TOPIC):
                raise KafkaError(f"deleting topic {name} failed with error code {code}")

    async def _ensure(self, wanted: list[tuple[TopicSpec, str, int]]) -> None:
        """Create what is missing, with its configs; with `create_topics` off only check
        that it all exists, and say which are missing."""
        if not self._settings.create_topics:
            existing = set(await self.list_topics())
            missing = [name for _, name, _ in wanted if name not in existing]
            if missing:
                raise TopicsMissing(
                    f"topics missing: {', '.join(missing)} (DLROVER_EVENTS_CREATE_TOPICS=false: "
                    "create them first, e.g. `dlrover-events env topics ENV --strimzi`)"
                )
            return
        rf = self._settings.replication_factor
        await self._create(
            [
                NewTopic(name, partitions, rf, topic_configs=topic_configs(spec, self._settings))
                for spec, name, partitions in wanted
            ]
        )

    async def _create(self, topics: list[NewTopic]) -> None:
        resp = await self._client.create_topics(topics)
        for name, code, message in resp.topic_errors:
            if code not in (0, _TOPIC_ALREADY_EXISTS):
                raise KafkaError(f"creating topic {name} failed ({code}): {message}")
