"""Everything of the brain that knows faust's and aiokafka's insides, in one place.

faust runs the group membership, rebalances and the producer of the brain; the brain
overrides some of faust's private members to take the fetched records straight from
faust's fetcher (faust's own path from fetcher to agent cost more per record than
deciding it) and to set a fetch wait faust has no setting for, and it reads where the
consumer stands on each partition (for the merge of its inputs) and commits offsets
through faust. None of that is public API, so it lives here alone, faust is pinned to
the minor version it was tested with (pyproject.toml), and `RELIES_ON` lists every
private member used: tests/unit/brain/runtime/test_faust_glue.py fails loudly, naming the
member, when an upgrade moves one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, cast

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.consumer.subscription_state import TopicPartitionState
from faust.sensors import Sensor
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_kafka
from faust.types import TP

from streams.brain.core.merge import Fetch

#: tansu answers a fetch when its wait is over, not as soon as data arrives, so this wait
#: is the floor of the plan latency (faust itself fixes it at 1500 ms: about 0.4 s per
#: event measured at low rates); an idle brain pays with a fetch every 10 ms.
FETCH_MAX_WAIT_MS = 10

#: (owner, member): the private members of faust, mode and aiokafka this module uses,
#: overrides and reads; an attribute set in __init__ is named on the instance's class
#: by its __init__ source (checked by the test).
RELIES_ON: tuple[tuple[type, str], ...] = (
    (faust_kafka.AIOKafkaConsumerThread, "_create_worker_consumer"),
    (faust_kafka.AIOKafkaConsumerThread, "_consumer"),
    (faust_kafka.Consumer, "_new_consumer_thread"),
    (faust_kafka.Consumer, "_commit_offsets"),
    (faust_consumer.Consumer, "_drain_messages"),
    (faust_consumer.Consumer, "_wait_next_records"),
    (faust_consumer.Consumer, "_read_offset"),
    (faust_consumer.Consumer, "_stopped"),
    (faust_consumer.Consumer, "consumer_stopped_errors"),
    (faust_consumer.ThreadDelegateConsumer, "_thread"),
    (faust.App, "_new_transport"),
    (faust.App, "on_init_dependencies"),
    (AIOKafkaConsumer, "_fetch_max_wait_ms"),
    (AIOKafkaConsumer, "_subscription"),
    (TopicPartitionState, "has_valid_position"),
    (TopicPartitionState, "position"),
    (TopicPartitionState, "highwater"),
)


def broker_credentials(connection: Mapping[str, Any]) -> faust.auth.Credentials | None:
    """faust's credentials object for the aiokafka arguments every client of the project
    connects with (`dlrover_events.bus.kafka_client.kafka_connection`): the same TLS context
    and SASL user, so the brain connects as the other services do."""
    protocol = connection["security_protocol"]
    if protocol == "SSL":
        return faust.SSLCredentials(connection["ssl_context"])
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        return faust.SASLCredentials(
            username=connection["sasl_plain_username"],
            password=connection["sasl_plain_password"],
            mechanism=connection["sasl_mechanism"],
            # faust picks SASL_SSL when given a context, SASL_PLAINTEXT without one
            ssl_context=connection.get("ssl_context"),
        )
    return None


class _ConsumerThread(faust_kafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = getattr(self.app, "fetch_max_wait_ms", FETCH_MAX_WAIT_MS)
        return consumer


RecordSink = Callable[[list[Any]], Awaitable[None]]


class _Consumer(faust_kafka.Consumer):
    def _new_consumer_thread(self) -> Any:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _drain_messages(self, fetcher: Any) -> None:
        """Hand each fetched batch to the app's record sink (aiokafka's ConsumerRecords,
        partition by partition in offset order), waiting for it before fetching on."""
        sink: RecordSink | None = getattr(self.app, "record_sink", None)
        if sink is None:
            await super()._drain_messages(fetcher)
            return
        consumer_stopped = self._stopped.is_set
        fetcher_stopped = fetcher._stopped.is_set
        read_offset = self._read_offset
        # faust's livelock check reads when records last reached a stream, from its Monitor
        inbound = self.app.monitor.stream_inbound_time
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                records, active = await self._wait_next_records(1.0)
                if not records:
                    # the sink may hold records that may go now: a partition it waited
                    # for was found read to its end, or waited too long
                    await asyncio.shield(sink([]))
                    continue
                # Even with a rebalance begun: the fetcher's position has moved past
                # these, so a batch dropped here would be lost until the next seek. The
                # sink keeps what is still ours and skips by offset what it has decided.
                batch: list[Any] = []
                now = time.monotonic()
                for tp, items in records.items():
                    if items and (active is None or tp in active):
                        batch.extend(items)
                        read_offset[tp] = items[-1].offset
                        inbound[tp] = now
                if batch:
                    # a rebalance cancels the fetcher: the batch is still decided and its
                    # plans published (the revocation waits for it), never half of it
                    await asyncio.shield(sink(batch))
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise


class _Transport(faust_kafka.Transport):
    Consumer = _Consumer


class BrainApp(faust.App):
    """faust's App with a fetch wait of our choosing (faust has no setting for it) and
    without the sensor of its web view."""

    fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS
    #: where fetched records go, in batches; None: through faust's agents and streams
    record_sink: RecordSink | None = None
    #: faust's Monitor sensor keeps per-event statistics for its web view, which the
    #: brain does not serve: four calls per event for nothing.
    monitored: bool = False

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)

    def on_init_dependencies(self) -> Any:
        dependencies = super().on_init_dependencies()
        if not self.monitored:
            self.sensors.remove(self.monitor)
            self.sensors.add(_RebalanceSensor())
        return dependencies


class _RebalanceSensor(Sensor):
    """Does nothing per event; it only gives faust's rebalance bookkeeping a state, which
    it warns about at every rebalance when no sensor is left."""

    def on_rebalance_start(self, app: Any) -> dict[str, Any]:
        return {"brain": True}


def fetch_progress(
    app: faust.App, partitions: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], Fetch]:
    """Where the app's aiokafka consumer stands on each of `partitions`: the position it
    handed records up to, and the log's end as its last fetch saw it. Nothing while
    the consumer is not started or between assignments."""
    consumer = getattr(getattr(app.consumer, "_thread", None), "_consumer", None)
    subscription = getattr(getattr(consumer, "_subscription", None), "subscription", None)
    if subscription is None:
        return {}
    assignment = subscription.assignment
    out: dict[tuple[str, int], Fetch] = {}
    for tp in partitions:
        state = assignment.state_value(TopicPartition(*tp))
        if state is not None:
            position = state.position if state.has_valid_position else None
            out[tp] = Fetch(position, state.highwater)
    return out


async def commit(app: faust.App, offsets: Mapping[TP, int]) -> None:
    """Commit `offsets` to the group through faust's consumer (no Event to ack: the
    brain takes records past faust's streams)."""
    await cast(Any, app.consumer)._commit_offsets(offsets)
