"""Topic administration: an env's topics are created and deleted together."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from dlrover_events.kafka_client import kafka_connection, start_kafka_client
from dlrover_events.lifecycle import AsyncResource
from dlrover_events.settings import Settings
from dlrover_events.topics import CONTROL_TOPIC, ENV_TOPICS, topic

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
        await self._create(
            [
                NewTopic(
                    CONTROL_TOPIC, 1, self._settings.replication_factor, topic_configs=_compact()
                )
            ]
        )

    async def ensure_env_topics(self, env: str, partitions: int) -> list[str]:
        """Create the env's topics that do not exist yet; returns the full names."""
        rf = self._settings.replication_factor
        new = [
            NewTopic(
                topic(env, t.name),
                partitions,
                rf,
                topic_configs=_compact() if t.compacted else {},
            )
            for t in ENV_TOPICS
        ]
        await self._create(new)
        return [n.name for n in new]

    async def delete_env_topics(self, env: str) -> None:
        existing = set(await self.list_topics())
        names = [topic(env, t.name) for t in ENV_TOPICS if topic(env, t.name) in existing]
        if not names:
            return
        resp = await self._client.delete_topics(names)
        for name, code in resp.topic_error_codes:
            if code not in (0, _UNKNOWN_TOPIC):
                raise KafkaError(f"deleting topic {name} failed with error code {code}")

    async def _create(self, topics: list[NewTopic]) -> None:
        resp = await self._client.create_topics(topics)
        for name, code, message in resp.topic_errors:
            if code not in (0, _TOPIC_ALREADY_EXISTS):
                raise KafkaError(f"creating topic {name} failed ({code}): {message}")


def _compact() -> dict[str, str]:
    return {"cleanup.policy": "compact"}
