"""`tail`: follow env topics live. The parsing and formatting here are pure; the CLI
adapter in ``cli/tail.py`` wires them to a group-less consumer.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import orjson

from dlrover_events.domain.units import human_bytes, parse_duration
from schemas.cluster import CapacityReported, PlatformCapabilities
from schemas.codec import CodecError, decode, encode
from schemas.config import ConfigChange
from schemas.dlq import DeadLetter
from schemas.envelope import Event
from schemas.evaluation import EvaluationReport
from schemas.jobs import JobEvent, JobSubmitted, NodeEvent, NodeOOM, RuntimeSample
from schemas.lockstep import Barrier, BarrierAck
from schemas.plans import (
    NodeGroupResource,
    NodeResource,
    OptimizePlan,
    ScalePlan,
    ScaleResult,
    TrainingApplied,
    TrainingRescaled,
)
from schemas.requests import JobRequest, JobRequestResult


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """An ISO 8601 time, or a duration ago (``10m``, ``2h``, ``1.5d``, seconds: the one
    syntax of `parse_duration`); ValueError says which is wanted."""
    now = now or datetime.now(UTC)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        pass
    else:
        return when if when.tzinfo else when.replace(tzinfo=UTC)
    try:
        return now - timedelta(seconds=parse_duration(text))
    except (ValueError, OverflowError):
        raise ValueError(
            f"--since {text!r}: expected a duration like 30s, 10m, 2h, 1d or an ISO time "
            "like 2026-11-21T09:00:00Z"
        ) from None


@dataclass(frozen=True)
class Filter:
    job: str | None = None
    type_pattern: str | None = None  # glob: node.*, job.runtime_sample

    def accepts(self, event: Event) -> bool:
        if self.job is not None and event.key != self.job:
            return False
        return self.type_pattern is None or fnmatch.fnmatchcase(event.type, self.type_pattern)


@dataclass(frozen=True)
class Line:
    """One tailed message: the event, or why it could not be read."""

    topic: str
    partition: int
    offset: int
    event: Event | None
    error: str | None
    raw: bytes | None


def read_line(topic: str, partition: int, offset: int, raw: bytes | None) -> Line:
    try:
        return Line(topic, partition, offset, decode(raw), None, raw)
    except CodecError as err:
        return Line(topic, partition, offset, None, str(err), raw)


def summary(event: Event) -> str:
    """A short human account of an event, by type."""
    if isinstance(event, RuntimeSample):
        return (
            f"step={event.global_step} speed={event.speed:.3g}/s "
            f"samples/s={event.samples_per_s:.4g} nodes={len(event.nodes)}"
        )
    if isinstance(event, NodeOOM):
        return f"{event.node.type}-{event.node.id} OOM ({event.kind.value})"
    if isinstance(event, NodeEvent):
        return f"{event.node.type}-{event.node.id}"
    if isinstance(event, OptimizePlan):
        groups = "; ".join(
            f"{role}: {change}"
            for role, g in event.resource.node_group_resources.items()
            if (change := _group_change(g))
        )
        return f"[{event.optimizer}] {event.reason}" + (f" ({groups})" if groups else "")
    if isinstance(event, ScalePlan):
        groups = "; ".join(
            f"{role}: {change}"
            for role, g in event.node_group_resources.items()
            if (change := _group_change(g))
        )
        return (
            f"plan={event.plan_id} launch={len(event.launch_nodes)} "
            f"remove={len(event.remove_nodes)} migrate={len(event.migrate_nodes)}"
            + (" suspend" if event.suspend else "")
            + (f" ({groups})" if groups else "")
        )
    if isinstance(event, ScaleResult):
        return f"plan={event.plan_id} {event.status.value} {event.reason}".strip()
    if isinstance(event, DeadLetter):
        return f"{event.original_topic}[{event.partition}]@{event.offset} {event.error}"
    if isinstance(event, JobSubmitted):
        return "; ".join(
            f"{role}: {_group_change(_submitted(s.replicas, s.cpu, s.memory, s.gpu_num))}"
            for role, s in event.roles.items()
        )
    if isinstance(event, TrainingApplied):
        knobs = " ".join(f"{k}={v}" for k, v in sorted(event.training.items()))
        return f"plan={event.plan_id} {knobs} from step {event.global_step}"
    if isinstance(event, TrainingRescaled):
        before = f"{event.world_size_before}->" if event.world_size_before else ""
        took = f" in {event.phases.total_s:.3g} s" if event.phases.total_s is not None else ""
        return f"world size {before}{event.world_size} ({event.mode.value}){took}"
    if isinstance(event, EvaluationReport):
        values = " ".join(f"{k}={v:.4g}" for k, v in sorted(event.metrics.items()))
        return f"{event.evaluator}: jobs={event.jobs} {values}".rstrip()
    if isinstance(event, ConfigChange):
        return f"{event.op} {event.name} v{event.version}"
    if isinstance(event, Barrier):
        return f"tick={event.tick} ends {event.sim_at.isoformat()}"
    if isinstance(event, JobRequest):
        owner = f" for {event.owner}" if event.owner else ""
        why = f": {event.reason}" if event.reason else ""
        return f"request={event.request_id} job={event.name} from {event.source}{owner}{why}"
    if isinstance(event, JobRequestResult):
        return f"request={event.request_id} {event.status.value} {event.reason}".strip()
    if isinstance(event, BarrierAck):
        return f"tick={event.tick} decided"
    if isinstance(event, CapacityReported):
        return _capacity(event)
    return ""


def _capacity(report: CapacityReported) -> str:
    """What the platform has and what it can apply, as a user checks a plan against it."""
    if report.hosts_counted:
        ready = sum(h.schedulable for h in report.hosts)
        hosts = f"{report.gpus} GPUs on {ready} of {len(report.hosts)} hosts"
    else:
        hosts = "hosts not counted"
    caps = report.capabilities
    return f"{report.platform}: {hosts}" + ("" if caps is None else f"; {_capabilities(caps)}")


def _capabilities(caps: PlatformCapabilities) -> str:
    said = {
        "GPU types": caps.gpu_types,
        "spares": caps.spares,
        "suspend": caps.suspend,
        "migrates nodes": caps.migrates_nodes,
        "replaces the rendezvous host": caps.replaces_rendezvous_host,
    }
    can = ", ".join(k for k, v in said.items() if v) or "nothing more"
    cannot = ", ".join(k for k, v in said.items() if not v)
    return f"can: {can}" + (f"; cannot: {cannot}" if cannot else "")


def _submitted(replicas: int, cpu: float, memory: int, gpus: int) -> NodeGroupResource:
    return NodeGroupResource(
        count=replicas, node_resource=NodeResource(cpu=cpu, memory=memory, gpu_num=gpus)
    )


def _group_change(group: NodeGroupResource) -> str:
    """What a plan changes for a role; zero fields mean "unchanged" and are not shown."""
    r = group.node_resource
    parts = [f"{group.count} replicas" if group.count else ""]
    parts += [
        f"cpu {r.cpu:g}" if r.cpu else "",
        f"memory {human_bytes(r.memory)}" if r.memory else "",
    ]
    parts += [f"{r.gpu_num} GPUs" if r.gpu_num else ""]
    return ", ".join(p for p in parts if p)


def format_text(line: Line) -> str:
    where = f"{line.topic}[{line.partition}]@{line.offset}"
    if line.event is None:
        return f"{where} UNREADABLE {line.error}"
    e = line.event
    job = e.job.uuid if isinstance(e, JobEvent) else (e.key or "-")
    ts = e.occurred_at.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3]
    return f"{ts} {where} {e.type} {job} {summary(e)}".rstrip()


def format_json(line: Line) -> bytes:
    """One JSON object per line: the event, or the failure with the raw bytes (base64)."""
    if line.event is not None:
        return encode(line.event)
    return orjson.dumps(
        {
            "topic": line.topic,
            "partition": line.partition,
            "offset": line.offset,
            "error": line.error,
            "raw": DeadLetter.b64(line.raw),
        }
    )
