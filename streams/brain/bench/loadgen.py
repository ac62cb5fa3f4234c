"""The latency phase of `bench brain`, run in a process of its own.

It publishes a workload's next events at a controlled rate and times each ScalePlan from
the publication of the event it names as its cause (a ScalePlan's id is derived from that
event) to the ScalePlan's publication (its record's create time, set by the brain's
producer: the issue's measure), and to its arrival here on `<env>.scale.plans` (what a
reader of the plans sees, one more fetch later). All on this machine's wall clock, and
none of the measuring on the brain's CPU. Usage:
`python -m streams.brain.bench.loadgen '<json spec>'`; prints a JSON line of how many
it has sent as it starts sending and every 0.1 s meanwhile (it may send slower than its
rate), one when it has sent everything (the bench reads the brain's backlog then), and
its measures as the last JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from dlrover_events.bus.kafka_client import kafka_connection, stop_consumer
from dlrover_events.bus.topics import JOB_EVENTS, JOB_METRICS, SCALE_PLANS, topic, topic_of
from dlrover_events.settings import load_settings
from schemas.codec import CodecError, decode, encode
from schemas.plans import ScalePlan
from streams.brain.bench.run import Workload
from streams.brain.core.planner import plan_id
from streams.brain.runtime.app import FETCH_MAX_WAIT_MS


def say(progress: dict[str, Any]) -> None:
    """A line of progress for the bench, which times the brain's backlog by them."""
    print(json.dumps(progress), flush=True)


async def measure(spec: dict[str, Any], drain_s: float = 5.0) -> dict[str, Any]:
    # the bench's broker, with the security settings of this process's environment
    connection = kafka_connection(load_settings(bootstrap_servers=spec["bootstrap_servers"]))
    env = spec["env"]
    workload = Workload(
        env,
        spec["jobs"],
        seed=spec["seed"],
        start=datetime.fromisoformat(spec["start"]),
        steps=list(spec["steps"]),
    )
    rate = float(spec["rate"])
    count = int(rate * float(spec["seconds"]))
    events = workload.round_robin(count, int(spec["oom_every"]))
    payloads = [(topic_of(e), encode(e), (e.key or "").encode(), e) for e in events]

    plans_topic = topic(env, SCALE_PLANS)
    # tansu answers a fetch only when its wait is over: keep the wait out of the timing
    consumer = AIOKafkaConsumer(
        **connection, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=5
    )
    # the bus's own delay, as the brain's fetch sees it: the tail the brain cannot beat
    bus = AIOKafkaConsumer(
        **connection,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
    )
    producer = AIOKafkaProducer(**connection, linger_ms=0, acks="all")
    await consumer.start()
    await bus.start()
    await producer.start()
    published: dict[str, float] = {}  # plan id -> cause published, wall clock in ms
    latencies: list[float] = []
    seen: list[float] = []
    delivered: list[float] = []
    since = time.time() * 1000
    stop = asyncio.Event()

    async def receive_events() -> None:
        while not stop.is_set():
            batch = await bus.getmany(timeout_ms=20)
            now = time.time() * 1000
            # tansu's end offsets lag by a batch: the seek to the end may land before
            # records of the preload, which were not published in this phase
            delivered.extend(
                now - r.timestamp
                for records in batch.values()
                for r in records
                if r.timestamp >= since
            )

    async def receive() -> None:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=20)
            now = time.time() * 1000
            for records in batch.values():
                for record in records:
                    try:
                        plan = decode(record.value)
                    except CodecError:
                        continue
                    sent = published.get(plan.plan_id) if isinstance(plan, ScalePlan) else None
                    if sent is not None:
                        latencies.append(record.timestamp - sent)
                        seen.append(now - sent)

    try:
        for reader, names in (
            (consumer, [plans_topic]),
            (bus, [topic(env, JOB_METRICS), topic(env, JOB_EVENTS)]),
        ):
            await reader._client.force_metadata_update()
            parts = [
                TopicPartition(name, p)
                for name in names
                for p in sorted(reader.partitions_for_topic(name) or ())
            ]
            reader.assign(parts)
            await reader.seek_to_end(*parts)
            for tp in parts:
                await reader.position(tp)
        receivers = [asyncio.create_task(receive()), asyncio.create_task(receive_events())]
        futures = []
        say({"sending": 0})
        t0 = said_at = time.perf_counter()
        for n, (name, value, key, event) in enumerate(payloads):
            now = time.perf_counter()
            delay = t0 + n / rate - now
            if delay > 0:
                await asyncio.sleep(delay)
            if now - said_at >= 0.1:  # how far it got: it may send slower than its rate
                say({"sending": n})
                said_at = now
            published[plan_id(key.decode(), str(event.event_id), "scale")] = time.time() * 1000
            futures.append(await producer.send(name, value, key=key))
        elapsed = time.perf_counter() - t0
        say({"sent": count})  # (the bench reads the brain's backlog now)
        await asyncio.gather(*futures)
        await asyncio.sleep(drain_s)
        stop.set()
        await asyncio.gather(*receivers)
        return {
            "sent": count,
            "send_rate": count / elapsed,
            "latencies_ms": latencies,
            "seen_ms": seen,
            "bus_ms": delivered,
        }
    finally:
        await producer.stop()
        await stop_consumer(consumer)
        await bus.stop()


def main(argv: list[str]) -> None:
    result = asyncio.run(measure(json.loads(argv[0])))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
