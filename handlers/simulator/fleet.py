"""Every job of a virtual env on one simulated cluster and one clock.

The virtual operator only moves messages; what happens between its inputs (submissions,
plans) and its outputs (events) is decided here, without I/O, so it is tested without a
broker and gives the same events for the same inputs at the same clock readings. Time moves
from event to event: a job that finishes frees its GPUs at the moment it finishes, and a
waiting gang starts at that moment, not at the next wake-up of whatever drives the clock.
"""

from __future__ import annotations

import heapq
import itertools
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, cast

from handlers.simulator.cluster import Cluster
from handlers.simulator.job import (
    DEFAULT_ORIGIN,
    DEFAULT_RESTART_DELAY,
    Admission,
    JobSimulator,
    PlanOutcome,
)
from handlers.simulator.measured import MeasuredApplication, measure
from handlers.simulator.throughput import Application, TraceDataError, load_application
from schemas.codec import decode, encode
from schemas.jobs import JobCompleted, JobEvent, JobFailed, JobSubmitted, RuntimeSample
from schemas.plans import ScalePlan, ScaleStatus

#: The smallest step of the clock. A completion estimate that float error leaves a hair
#: behind the clock would otherwise pin the clock in place forever.
MIN_STEP = 1e-3

_FLEET_NAMESPACE = uuid.UUID("3a0f9d5e-8c1b-4e27-9d64-0b5f2c7e1a48")

Loader = Callable[[str], Application]


class VirtualCluster:
    """The jobs of one virtual env, admitted greedily in submission order: whenever
    capacity may have changed, each waiting gang that fits starts, even if an earlier and
    bigger one still waits (no job blocks the queue behind it).

    With ``admission="brain"`` a cluster scheduler in the brain owns admission: a job
    waits until a plan gives it replicas, and freed capacity starts only gangs some plan
    asked for (job.Admission)."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        origin: datetime | None = DEFAULT_ORIGIN,
        restart_delay: float = DEFAULT_RESTART_DELAY,
        sample_interval: float | None = 30.0,
        source: str = "virtual-operator",
        loader: Loader = load_application,
        admission: Admission = "cluster",
    ) -> None:
        self.cluster = cluster
        self.admission: Admission = admission
        self.origin = origin
        self.restart_delay = restart_delay
        self.sample_interval = sample_interval
        self.source = source
        self._loader = loader
        self._clock = 0.0
        self._jobs: dict[str, JobSimulator] = {}
        # Submissions stamped later than the clock: they arrive at their own time, so a
        # trace fed all at once still arrives as the trace says.
        # Ties in time go by job id, not by the order the submissions were read in.
        self._arrivals: list[tuple[float, str, int, JobSubmitted]] = []
        self._arriving: set[str] = set()
        self._seq = itertools.count()
        # Without an origin the clock has not started: submissions wait here, and start()
        # puts time zero at the earliest of them, whatever order they were read in.
        self._held: list[JobSubmitted] = []
        self._unsimulable: dict[str, str] = {}
        # What jobs measured in the real env this one is fed from, and the models of the
        # arrived jobs simulated from them (their application has no traces).
        self._measurements: dict[str, list[RuntimeSample]] = {}
        self._measured: dict[str, MeasuredApplication] = {}
        # Outcomes of applied plans: a plan re-delivered before its effect was recorded
        # elsewhere gets the answer it got the first time, not "already applied".
        self._outcomes: dict[str, PlanOutcome] = {}

    @property
    def clock(self) -> float:
        return self._clock

    # -- snapshots ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The whole simulated cluster, JSON-able: jobs, their pods and progress, the
        clock, the submissions still to arrive and the answers plans got. ``restore`` of
        it says, from then on, exactly what this one would have said."""
        return {
            "cluster": self.cluster.snapshot(),
            "origin": None if self.origin is None else self.origin.isoformat(),
            "restart_delay": self.restart_delay,
            "sample_interval": self.sample_interval,
            "admission": self.admission,
            "clock": self._clock,
            "jobs": [job.snapshot() for job in self._jobs.values()],
            "arrivals": [[at, key, seq, _text(e)] for at, key, seq, e in self._arrivals],
            "arriving": sorted(self._arriving),
            "held": [_text(e) for e in self._held],
            "unsimulable": dict(self._unsimulable),
            "measured": {k: v.snapshot() for k, v in sorted(self._measured.items())},
            "outcomes": {k: v.snapshot() for k, v in self._outcomes.items()},
        }

    @classmethod
    def restore(
        cls,
        state: Mapping[str, Any],
        *,
        source: str = "virtual-operator",
        loader: Loader = load_application,
    ) -> VirtualCluster:
        """The cluster a snapshot describes; TraceDataError when an application's traces
        are gone (its jobs could not go on)."""
        origin = None if state["origin"] is None else datetime.fromisoformat(state["origin"])
        fleet = cls(
            Cluster.restore(state["cluster"]),
            origin=origin,
            restart_delay=state["restart_delay"],
            sample_interval=state["sample_interval"],
            source=source,
            loader=loader,
            # (absent from a snapshot made before it existed: the cluster admitted)
            admission=_admission(state.get("admission", "cluster")),
        )
        fleet._clock = state["clock"]
        # (absent from a snapshot made before measured jobs existed: none)
        fleet._measured = {
            k: MeasuredApplication.restore(v) for k, v in state.get("measured", {}).items()
        }
        for raw in state["jobs"]:
            assert origin is not None, "jobs run only once the clock has started"
            measured = fleet._measured.get(raw["job"]["uuid"])
            application = _simulated(measured) if measured else loader(raw["application"])
            job = JobSimulator.restore(
                raw, application, fleet.cluster, origin=origin, source=source
            )
            fleet._jobs[job.job.uuid] = job
        fleet._arrivals = [
            (at, key, seq, _submission(text)) for at, key, seq, text in state["arrivals"]
        ]
        heapq.heapify(fleet._arrivals)
        fleet._seq = itertools.count(max((a[2] for a in fleet._arrivals), default=-1) + 1)
        fleet._arriving = set(state["arriving"])
        fleet._held = [_submission(text) for text in state["held"]]
        fleet._unsimulable = dict(state["unsimulable"])
        fleet._outcomes = {k: PlanOutcome.restore(v) for k, v in state["outcomes"].items()}
        return fleet

    @property
    def started(self) -> bool:
        return self.origin is not None

    def start(self, origin: datetime | None = None) -> list[JobEvent]:
        """Start the clock: time zero at ``origin``, else at the earliest held submission
        (a backlog read in any order gives the same origin, hence the same run: the jobs
        that arrive at once are admitted in the order of their ids, not of the reading)."""
        if self.origin is not None:
            return []
        held = sorted(self._held, key=lambda e: (e.occurred_at, e.job.uuid))
        self._held = []
        self.origin = origin or min((e.occurred_at for e in held), default=DEFAULT_ORIGIN)
        self._arriving.clear()
        events: list[JobEvent] = []
        for event in held:
            events.extend(self.submit(event))
        return events

    def at(self, clock: float | None = None) -> datetime:
        """The wall-clock reading events carry for a simulated second."""
        assert self.origin is not None, "the clock has not started"
        return self.origin + timedelta(seconds=self._clock if clock is None else clock)

    def job(self, job_uuid: str) -> JobSimulator | None:
        return self._jobs.get(job_uuid)

    def jobs(self) -> tuple[JobSimulator, ...]:
        return tuple(self._jobs.values())

    # -- inputs ---------------------------------------------------------------------------

    def submit(self, event: JobSubmitted) -> list[JobEvent]:
        """A new job joins the queue at its submission time (now, if that has passed) and
        starts if its gang fits. A job seen before is left as it is: submissions are
        re-delivered after a restart of the consumer."""
        key = event.job.uuid
        if key in self._jobs or key in self._unsimulable or key in self._arriving:
            return []
        if self.origin is None:
            self._held.append(event)
            self._arriving.add(key)
            return []
        arrives = (event.occurred_at - self.origin).total_seconds()
        if arrives > self._clock + MIN_STEP:
            heapq.heappush(self._arrivals, (arrives, key, next(self._seq), event))
            self._arriving.add(key)
            return []
        return self._arrive(event)

    def measured(self, samples: Iterable[RuntimeSample]) -> None:
        """Samples that jobs measured in the real env this one is fed from: a job whose
        application has no traces is simulated from its own (handlers.simulator.measured)
        when it arrives. The models of jobs that arrived are in the snapshot; samples of
        jobs still to arrive are given again to a restored cluster."""
        for sample in samples:
            self._measurements.setdefault(sample.job.uuid, []).append(sample)

    def _application(self, event: JobSubmitted) -> Application:
        """The job's traced application, else the model of its own measurements;
        TraceDataError says why neither exists."""
        name = event.application or event.job.app
        try:
            if not name:
                raise TraceDataError("the submission names no application")
            return self._loader(name)
        except TraceDataError as untraced:
            samples = self._measurements.get(event.job.uuid)
            if not samples:
                raise TraceDataError(f"no measured samples ({untraced})") from None
            measured = measure(event, samples)
            self._measured[event.job.uuid] = measured
            return _simulated(measured)

    def _arrive(self, event: JobSubmitted) -> list[JobEvent]:
        assert self.origin is not None, "jobs arrive only once the clock has started"
        key = event.job.uuid
        try:
            application = self._application(event)
        except TraceDataError as e:
            # Without measurements the simulator could only guess; the job fails loudly.
            reason = f"not simulable: {e}"
            self._unsimulable[key] = reason
            return [
                JobFailed(
                    env=event.env,
                    job=event.job,
                    source=self.source,
                    event_id=uuid.uuid5(_FLEET_NAMESPACE, f"{key}/unsimulable"),
                    occurred_at=self.at(),
                    reason=reason,
                )
            ]
        self._jobs[key] = JobSimulator(
            event,
            application,
            self.cluster,
            clock=self._clock,
            origin=self.origin,
            restart_delay=self.restart_delay,
            sample_interval=self.sample_interval,
            source=self.source,
            admission=self.admission,
            memory=measured.memory if (measured := self._measured.get(key)) else None,
        )
        return self._admit()

    def apply(self, plan: ScalePlan) -> PlanOutcome:
        """The plan becomes its job's desired state now; its events are in the outcome."""
        key = plan.job.uuid
        job = self._jobs.get(key)
        if job is None:
            if key in self._unsimulable:
                return PlanOutcome(ScaleStatus.REJECTED, f"job {key!r} {self._unsimulable[key]}")
            return PlanOutcome(
                ScaleStatus.REJECTED,
                f"unknown job {key!r}: no job.submitted for it has reached this env's operator",
            )
        earlier = self._outcomes.get(plan.plan_id)
        if earlier is not None:
            return replace(earlier, events=[])
        outcome = job.update(plan)
        if outcome.status not in (ScaleStatus.APPLIED, ScaleStatus.PARTIAL):
            return outcome
        self._outcomes[plan.plan_id] = replace(outcome, events=[])
        # A smaller gang may have left room for jobs that wait.
        return replace(outcome, events=[*outcome.events, *self._admit()])

    def observed(self, job_uuid: str) -> dict[str, dict[str, int]]:
        job = self._jobs.get(job_uuid)
        return job.observed() if job is not None else {}

    # -- time -----------------------------------------------------------------------------

    def next_event_at(self) -> float | None:
        """When the next job says or the next submission arrives, if no input comes;
        None: nothing will happen."""
        if self.origin is None:
            return None
        times = [t for t in (job.next_event_at() for job in self._jobs.values()) if t is not None]
        if self._arrivals:
            times.append(self._arrivals[0][0])
        return min(times, default=None)

    @property
    def waiting_arrivals(self) -> int:
        return len(self._arrivals)

    def advance_to(self, clock: float) -> list[JobEvent]:
        """Move to ``clock`` (never back), stopping at every event on the way so that what
        one job frees is taken by another at the moment it is freed."""
        if self.origin is None:
            return []
        events: list[JobEvent] = []
        while (upcoming := self.next_event_at()) is not None and upcoming <= clock:
            events.extend(self._step_to(max(upcoming, self._clock + MIN_STEP)))
        if clock > self._clock:
            events.extend(self._step_to(clock))
        return events

    def step(self) -> list[JobEvent] | None:
        """Jump to the next event (as fast as possible); None when only an input can make
        anything happen."""
        upcoming = self.next_event_at()
        if upcoming is None:
            return None
        return self._step_to(max(upcoming, self._clock + MIN_STEP))

    def _step_to(self, clock: float) -> list[JobEvent]:
        events: list[JobEvent] = []
        for job in self._jobs.values():
            events.extend(job.advance(max(0.0, clock - job.clock)))
        self._clock = clock
        if any(isinstance(e, JobCompleted | JobFailed) for e in events):
            events.extend(self._admit())  # only an ending job frees capacity
        while self._arrivals and self._arrivals[0][0] <= clock + MIN_STEP:
            *_, submission = heapq.heappop(self._arrivals)
            self._arriving.discard(submission.job.uuid)
            events.extend(self._arrive(submission))
        return events

    def _admit(self) -> list[JobEvent]:
        events: list[JobEvent] = []
        for job in self._jobs.values():
            events.extend(job.try_admit())
        return events


def _admission(value: object) -> Admission:
    if value == "cluster" or value == "brain":
        return value
    raise ValueError(f"admission is 'cluster' or 'brain', not {value!r}")


def _simulated(measured: MeasuredApplication) -> Application:
    """A measured model where JobSimulator's signature says Application: it implements
    throughput.SimulatedApplication, all that JobSimulator uses of one. (Goes once
    JobSimulator takes a SimulatedApplication.)"""
    return cast(Application, measured)


def _text(event: JobSubmitted) -> str:
    return encode(event).decode()


def _submission(text: str) -> JobSubmitted:
    event = decode(text.encode())
    if not isinstance(event, JobSubmitted):
        raise ValueError(f"a snapshot's submission is a {event.type}")
    return event


__all__ = ["MIN_STEP", "Loader", "VirtualCluster"]
