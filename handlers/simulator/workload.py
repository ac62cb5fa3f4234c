"""Pollux workloads as job submissions, and a whole workload run with a static policy.

The static run is the baseline every brain policy is measured against: each job keeps the
GPUs and batch size it asked for, jobs are admitted first come first served, and a job
starts only when all of its replicas fit (strict FIFO: a big job at the head waits for room
and the jobs behind it wait too). It drives the same JobSimulator the virtual operator uses,
jumping from event to event (arrivals, completions) instead of ticking.
"""

from __future__ import annotations

import csv
import io
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from handlers.simulator.cluster import Cluster, GiB
from handlers.simulator.job import (
    DEFAULT_ORIGIN,
    DEFAULT_RESTART_DELAY,
    JobPhase,
    JobSimulator,
    memory_model,
)
from handlers.simulator.throughput import load_application, pollux_dir
from schemas.jobs import JobMeta, JobSubmitted, RoleSpec

_SUBMISSION_NAMESPACE = uuid.UUID("0b7f4c52-2d0e-4b8e-8a43-8f1f0f3f6a11")

#: A bound on event-loop turns: each turn completes a job or admits an arrival, so a run
#: that needs more is stuck, and failing beats spinning.
_TURNS_PER_JOB = 8


@dataclass(frozen=True, slots=True)
class Submission:
    """A job of a workload and the second (from the workload's start) it arrives."""

    time: float
    event: JobSubmitted

    @property
    def name(self) -> str:
        return self.event.job.name


def workload_path(
    name: str = "workload-6", folder: str = "workloads", root: Path | None = None
) -> Path:
    return (root or pollux_dir()) / folder / f"{name}.csv"


def parse_workload(
    text: str,
    *,
    env: str = "sim",
    origin: datetime = DEFAULT_ORIGIN,
    root: Path | None = None,
) -> list[Submission]:
    """Submissions from a workload CSV (name,time,application,num_replicas,batch_size).

    Each job asks for one GPU per replica and the host memory its application needs at the
    local batch its batch size gives (job.MEMORY_MODELS), so the baseline never OOMs. Its
    batch limits are what the traces measured (from the smallest traced global batch, the
    one the application was tuned at, to the largest; the traced local batch range), for a
    scheduler that re-chooses the batch (adaptive, as Pollux); the static run ignores them.
    """
    submissions = []
    for row in csv.DictReader(io.StringIO(text)):
        name, app_name = row["name"], row["application"]
        replicas, batch_size = int(row["num_replicas"]), int(row["batch_size"])
        app = load_application(app_name, root)
        local_bsz, _ = app.split_batch(batch_size, replicas)
        time = float(row["time"])
        # The artifact runs ncf under Pollux at its workload batch on one GPU (its
        # training is a few minutes at any size): a fixed job, as there.
        fixed = app_name == "ncf"
        event = JobSubmitted(
            env=env,
            event_id=uuid.uuid5(_SUBMISSION_NAMESPACE, f"{env}/{name}"),
            occurred_at=origin + timedelta(seconds=time),
            source="pollux-workload",
            job=JobMeta(uuid=name, name=name, app=app_name, scenario=app_name),
            application=app_name,
            batch_size=batch_size,
            # Pollux trains from the application's initial batch, whatever the baseline's
            min_batch_size=batch_size if fixed else min(app.init_batch_size, batch_size),
            max_batch_size=batch_size if fixed else app.max_batch_size,
            min_local_batch_size=app.min_local_bsz,
            max_local_batch_size=app.max_local_bsz,
            adaptive_batch_size=not fixed,
            roles={
                "worker": RoleSpec(
                    replicas=replicas,
                    max_replicas=replicas if fixed else None,
                    gpu_num=1,
                    memory=memory_model(app_name).need(local_bsz),
                )
            },
        )
        submissions.append(Submission(time, event))
    submissions.sort(key=lambda s: s.time)  # stable: ties keep file order
    return submissions


def read_workload(
    path: Path,
    *,
    env: str = "sim",
    origin: datetime = DEFAULT_ORIGIN,
    root: Path | None = None,
) -> list[Submission]:
    """parse_workload on a file: the workloads are trace files, read whole at load."""
    return parse_workload(path.read_text(), env=env, origin=origin, root=root)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    name: str
    application: str
    replicas: int
    batch_size: int
    submitted: float
    started: float | None
    completed: float | None
    state: JobPhase

    @property
    def jct(self) -> float | None:
        """Job completion time: from submission to completion, queueing included."""
        return None if self.completed is None else self.completed - self.submitted


@dataclass(frozen=True, slots=True)
class WorkloadResult:
    jobs: tuple[JobOutcome, ...]

    @property
    def all_completed(self) -> bool:
        return all(j.completed is not None for j in self.jobs)

    @property
    def average_jct(self) -> float:
        jcts = [j.jct for j in self.jobs if j.jct is not None]
        return sum(jcts) / len(jcts) if jcts else float("nan")

    @property
    def makespan(self) -> float:
        return max((j.completed for j in self.jobs if j.completed is not None), default=0.0)


def run_static(
    submissions: Sequence[Submission],
    num_nodes: int = 16,
    gpus_per_node: int = 4,
    *,
    memory_per_node: int = 256 * GiB,
    restart_delay: float = DEFAULT_RESTART_DELAY,
    root: Path | None = None,
) -> WorkloadResult:
    """Run a workload to the end with fixed requests, strict FIFO and gang admission."""
    cluster = Cluster(num_nodes, gpus_per_node, memory_per_node=memory_per_node)
    arrivals = deque(sorted(submissions, key=lambda s: s.time))
    queue: deque[JobSimulator] = deque()
    active: list[JobSimulator] = []
    jobs: list[JobSimulator] = []
    for _ in range(_TURNS_PER_JOB * max(len(submissions), 1)):
        if not (arrivals or queue or active):
            break
        etas = [eta for eta in (j.eta() for j in active) if eta is not None]
        now = min([*etas, *([arrivals[0].time] if arrivals else [])], default=None)
        if now is None:
            raise RuntimeError(f"stuck: {len(queue)} jobs queued and nothing running")
        for job in (*active, *queue):
            job.advance(max(0.0, now - job.clock))
        active = [j for j in active if j.state not in (JobPhase.COMPLETED, JobPhase.FAILED)]
        while arrivals and arrivals[0].time <= now:
            sub = arrivals.popleft()
            app = load_application(sub.event.application, root)
            job = JobSimulator(
                sub.event,
                app,
                cluster,
                clock=sub.time,
                restart_delay=restart_delay,
                sample_interval=None,
            )
            job.advance(now - sub.time)
            queue.append(job)
            jobs.append(job)
        while queue:
            queue[0].try_admit()
            if queue[0].state is JobPhase.PENDING:
                break
            head = queue.popleft()
            if head.state is not JobPhase.FAILED:
                active.append(head)
    else:
        raise RuntimeError("the workload did not finish within its bound on event-loop turns")
    return WorkloadResult(tuple(_outcome(j) for j in jobs))


def _outcome(job: JobSimulator) -> JobOutcome:
    status = job.status()
    return JobOutcome(
        name=job.job.name,
        application=job.app.name,
        replicas=status.replicas,
        batch_size=status.batch_size,
        submitted=job.submitted_at,
        started=status.started_at,
        completed=status.completed_at,
        state=status.state,
    )


def summarize(result: WorkloadResult) -> Iterable[str]:
    """Lines a person reads: totals first, then per application."""
    done = sum(j.completed is not None for j in result.jobs)
    yield f"jobs: {len(result.jobs)}, completed: {done}"
    yield f"average JCT: {result.average_jct:.1f} s, makespan: {result.makespan:.1f} s"
    for app in sorted({j.application for j in result.jobs}):
        jcts = [j.jct for j in result.jobs if j.application == app and j.jct is not None]
        if jcts:
            yield f"  {app}: {len(jcts)} jobs, average JCT {sum(jcts) / len(jcts):.1f} s"
