"""What a simulated job says: its events, stamped as a real job's would be.

Event ids and timestamps derive from the job, a per-job sequence number and the
simulated clock, so the same inputs give the same events; the sequence number is the one
piece of state here and is part of the job's snapshot. The job (job.py) decides what
happens; this only says it, in the order it is asked to.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from handlers.simulator.cluster import PodRequest
from schemas.jobs import (
    JobCompleted,
    JobEvent,
    JobFailed,
    JobHeld,
    JobMeta,
    JobStarted,
    NodeExited,
    NodeOOM,
    NodeRef,
    NodeStarted,
    OOMKind,
    RuntimeSample,
)
from schemas.plans import TrainingApplied

#: Simulated time 0; fixed so that two runs of the same input give equal timestamps.
DEFAULT_ORIGIN = datetime(2021, 1, 1, tzinfo=UTC)

#: The exit code of a pod the platform stopped (SIGTERM, 128 + 15), as Kubernetes reports it.
TERMINATED_EXIT_CODE = 143

_EVENT_NAMESPACE = uuid.UUID("6f1c1d3e-4b5a-4f0e-9a7c-5d8e2b1a0c93")


class JobVoice:
    """The envelope of everything one job says: who (env, job, source), when (origin plus
    the simulated clock) and a deterministic id (the job, its count of events, the kind)."""

    def __init__(self, env: str, job: JobMeta, source: str, origin: datetime, seq: int = 0) -> None:
        self.env = env
        self.job = job
        self.source = source
        self.origin = origin
        self.seq = seq

    def meta(self, kind: str, clock: float) -> dict[str, Any]:
        self.seq += 1
        return {
            "env": self.env,
            "job": self.job,
            "source": self.source,
            "event_id": uuid.uuid5(_EVENT_NAMESPACE, f"{self.job.uuid}/{self.seq}/{kind}"),
            "occurred_at": self.origin + timedelta(seconds=clock),
        }

    def node(self, pod: PodRequest) -> NodeRef:
        return NodeRef(
            type=pod.role,
            id=pod.index,
            name=f"{self.job.name or self.job.uuid}-{pod.role}-{pod.index}",
        )

    def started(self, pods: Iterable[PodRequest], clock: float) -> list[JobEvent]:
        return [NodeStarted(**self.meta("node.started", clock), node=self.node(p)) for p in pods]

    def exited(self, pods: Iterable[PodRequest], clock: float) -> list[JobEvent]:
        """Pods the platform stopped (a suspend, a gang given up)."""
        return [
            NodeExited(
                **self.meta("node.exited", clock),
                node=self.node(pod),
                exit_code=TERMINATED_EXIT_CODE,
            )
            for pod in pods
        ]

    def out_of_memory(
        self, kind: OOMKind, need: int | None, pods: Iterable[PodRequest], clock: float
    ) -> list[JobEvent]:
        """Replicas out of memory: the GPU's (the process fails, exit code 1) or the
        pod's (OOMKilled, 137, with what a replica needed)."""
        if kind is OOMKind.GPU_MEMORY:
            return [
                NodeOOM(
                    **self.meta("node.oom", clock),
                    node=self.node(pod),
                    kind=OOMKind.GPU_MEMORY,
                    exit_code=1,
                )
                for pod in pods
            ]
        return [
            NodeOOM(
                **self.meta("node.oom", clock),
                node=self.node(pod),
                kind=OOMKind.HOST_MEMORY,
                memory=need,
                exit_code=137,
            )
            for pod in pods
        ]

    def sample(self, measured: dict[str, Any], clock: float) -> RuntimeSample:
        return RuntimeSample(**self.meta("sample", clock), **measured)

    def training_applied(
        self,
        plan_id: str,
        pod: PodRequest,
        local_bsz: int,
        accumulation: int,
        global_step: int,
        clock: float,
    ) -> TrainingApplied:
        """Said by the first training replica, for all of them, at the step it starts from."""
        return TrainingApplied(
            **self.meta("training.applied", clock),
            plan_id=plan_id,
            node=self.node(pod),
            training={"local_batch_size": local_bsz, "accumulation_steps": accumulation},
            global_step=global_step,
        )

    def job_started(self, clock: float) -> JobStarted:
        return JobStarted(**self.meta("job.started", clock))

    def job_completed(self, clock: float) -> JobCompleted:
        return JobCompleted(**self.meta("job.completed", clock))

    def job_held(self, held: bool, plan_id: str, reason: str, clock: float) -> JobHeld:
        """The job held by its owner or released (what a cluster scheduler reads)."""
        return JobHeld(**self.meta("job.held", clock), held=held, plan_id=plan_id, reason=reason)

    def job_failed(self, reason: str, clock: float) -> JobFailed:
        return JobFailed(**self.meta("failed", clock), reason=reason)


__all__ = ["DEFAULT_ORIGIN", "TERMINATED_EXIT_CODE", "JobVoice"]
