"""Replay a workload trace (job arrivals) into an env, at a chosen speed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import topic_of
from dlrover_events.domain.workloads import read_trace
from dlrover_events.settings import Settings
from schemas.codec import encode
from streams.replay.copier import CopyProgress, ReplayReport
from streams.replay.core import Pacer


async def replay_trace(
    settings: Settings,
    path: Path,
    target: str,
    *,
    adapter: str = "pollux",
    pacer: Pacer = Pacer(None),
    progress: CopyProgress | None = None,
    stop: asyncio.Event | None = None,
) -> ReplayReport:
    """Publish the trace's events at their (scaled) times; the caller checked the file."""
    timed = read_trace(path, target, adapter)  # (a TraceError: one line)
    report = ReplayReport()
    loop = asyncio.get_running_loop()
    wall0 = loop.time()
    first = timed[0][0] if timed else 0.0
    async with Producer(settings) as producer:
        for seconds, event in timed:
            if stop is not None and stop.is_set():
                break
            delay = wall0 + pacer.due_s(int(first * 1000), int(seconds * 1000)) - loop.time()
            if delay > 0:
                await producer.flush()
                await asyncio.sleep(delay)
            key = event.key.encode() if event.key is not None else None
            await producer.enqueue(topic_of(event), encode(event), key)
            report.read += 1
            report.copied += 1
            report.per_topic[type(event).topic] = report.per_topic.get(type(event).topic, 0) + 1
            if progress is not None:
                progress(report.read, len(timed))
        await producer.flush()
    return report
