"""Starting an aiokafka client and asking what partitions a topic has: the two things
every producer and reader of the project does first, in one place, so a broker that is
away is one error a user understands, whoever meets it."""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from dlrover_events.errors import BusUnavailable
from dlrover_events.settings import Settings


def _unavailable(settings: Settings, err: Exception) -> BusUnavailable:
    return BusUnavailable(
        f"cannot reach Kafka at {settings.bootstrap_servers} ({err}); start the embedded "
        "stack with `dlrover-events up` or set DLROVER_EVENTS_BOOTSTRAP_SERVERS"
    )


async def start_kafka_client(client: Any, settings: Settings) -> None:
    """Start an aiokafka client; if the broker cannot be reached, release the client and
    raise the one error a user sees for it."""
    try:
        await client.start()
    except KafkaError as err:
        stop = getattr(client, "stop", None) or client.close
        await stop()
        raise _unavailable(settings, err) from None


async def topic_partitions(consumer: AIOKafkaConsumer, topic_name: str) -> list[TopicPartition]:
    """The partitions of a topic as the broker knows them now (empty: no such topic).

    A group-less consumer only learns metadata for what it is assigned, so refresh first.
    """
    await consumer._client.force_metadata_update()
    ids = consumer.partitions_for_topic(topic_name) or set()
    return [TopicPartition(topic_name, p) for p in sorted(ids)]


__all__ = ["start_kafka_client", "topic_partitions"]
