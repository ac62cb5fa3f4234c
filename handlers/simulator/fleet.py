"""Every job of a virtual env on one simulated cluster and one clock.

The virtual operator only moves messages; what happens between its inputs (submissions,
plans) and its outputs (events) is decided here, without I/O, so it is tested without a
broker and gives the same events for the same inputs at the same clock readings. Time moves
from event to event: a job that finishes frees its GPUs at the moment it finishes, and a
waiting gang starts at that moment, not at the next wake-up of whatever drives the clock.

A plan may come before its job has arrived on the simulated clock: a brain on event time
reads a trace fed all at once, ahead of the clock. The plan is kept and takes effect at
the job's arrival, as the job's desired state would have had it arrived already.

Jobs asked for on the bus (a JobRequest: an experiment's trials) join the same queue
(``request``); a trial among them trains along a learning curve to the budgets its
searcher's decisions give it (trial.py, ``decide``). The fleet keeps each requested job's
document by name, so its operator answers a request or a deletion by the same rules as the
reconciler's.
"""

from __future__ import annotations

import heapq
import itertools
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from handlers.simulator.cluster import Cluster
from handlers.simulator.curves import LearningCurve, ParametricCurve
from handlers.simulator.job import (
    DEFAULT_ORIGIN,
    DEFAULT_RESTART_DELAY,
    Admission,
    JobSimulator,
    PlanOutcome,
)
from handlers.simulator.measured import MeasuredApplication, measure
from handlers.simulator.throughput import (
    Application,
    SimulatedApplication,
    TraceDataError,
    load_application,
)
from handlers.simulator.trial import Reporting, TrialJob, TrialSpec
from schemas.codec import decode, encode
from schemas.experiments import (
    DecisionKind,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
    trial_job_name,
)
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
        in_place_delay: float | None = None,
        sample_interval: float | None = 30.0,
        source: str = "virtual-operator",
        loader: Loader = load_application,
        admission: Admission = "cluster",
        curve: LearningCurve | None = None,
        reporting: Reporting = Reporting(),
    ) -> None:
        self.cluster = cluster
        #: what the trials measure (curves.py), and how often they say it
        self.curve: LearningCurve = curve if curve is not None else ParametricCurve()
        self.reporting = reporting
        self.admission: Admission = admission
        self.origin = origin
        self.restart_delay = restart_delay
        #: jobs rescale in place at this cost (None: they restart; see JobSimulator)
        self.in_place_delay = in_place_delay
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
        # Plans for jobs whose submission is here but has not arrived on the clock, in the
        # order to apply them at its arrival (see _kept_with).
        self._early: dict[str, list[ScalePlan]] = {}
        # Jobs asked for on the bus: their documents by name (as created), and the
        # trials among them by job uuid.
        self._requested: dict[str, dict[str, Any]] = {}
        self._trials: dict[str, TrialSpec] = {}
        # Experiments seen: their metric, and whether they are done.
        self._experiments: dict[str, dict[str, Any]] = {}
        # Per experiment, the seq of the last decision taken (a decision delivered again
        # is taken once); decisions about trials whose job is not here yet, by job name.
        self._decided: dict[str, int] = {}
        self._undelivered: dict[str, list[TrialDecision]] = {}
        # What the trials reported and nobody has taken yet (take_reports), in order.
        self._reports: list[TrialMetrics] = []

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
            "in_place_delay": self.in_place_delay,
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
            "early": {k: [_text(p) for p in v] for k, v in sorted(self._early.items())},
            "requested": dict(sorted(self._requested.items())),
            "trials": {k: v.snapshot() for k, v in sorted(self._trials.items())},
            "experiments": dict(sorted(self._experiments.items())),
            "decided": dict(sorted(self._decided.items())),
            "undelivered": {k: [_text(d) for d in v] for k, v in sorted(self._undelivered.items())},
        }

    @classmethod
    def restore(
        cls,
        state: Mapping[str, Any],
        *,
        source: str = "virtual-operator",
        loader: Loader = load_application,
        curve: LearningCurve | None = None,
        reporting: Reporting = Reporting(),
    ) -> VirtualCluster:
        """The cluster a snapshot describes (its trials following ``curve``, which is not
        in the snapshot: the operator's settings give it); TraceDataError when an
        application's traces are gone (its jobs could not go on)."""
        origin = None if state["origin"] is None else datetime.fromisoformat(state["origin"])
        fleet = cls(
            Cluster.restore(state["cluster"]),
            origin=origin,
            restart_delay=state["restart_delay"],
            in_place_delay=state.get("in_place_delay"),  # (absent before it existed)
            sample_interval=state["sample_interval"],
            source=source,
            loader=loader,
            # (absent from a snapshot made before it existed: the cluster admitted)
            admission=_admission(state.get("admission", "cluster")),
            curve=curve,
            reporting=reporting,
        )
        fleet._clock = state["clock"]
        # (absent from a snapshot made before measured jobs existed: none)
        fleet._measured = {
            k: MeasuredApplication.restore(v) for k, v in state.get("measured", {}).items()
        }
        for raw in state["jobs"]:
            assert origin is not None, "jobs run only once the clock has started"
            measured = fleet._measured.get(raw["job"]["uuid"])
            application = measured if measured else loader(raw["application"])
            job = (
                TrialJob.restore_trial(
                    raw,
                    application,
                    fleet.cluster,
                    origin=origin,
                    source=source,
                    curve=fleet.curve,
                    reporting=reporting,
                    reports=fleet._reports,
                )
                if "trial" in raw
                else JobSimulator.restore(
                    raw, application, fleet.cluster, origin=origin, source=source
                )
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
        # (absent from a snapshot made before plans were kept for jobs to arrive: none)
        fleet._early = {k: [_plan(t) for t in v] for k, v in state.get("early", {}).items()}
        # (absent from a snapshot made before requested jobs and trials existed: none)
        fleet._requested = dict(state.get("requested", {}))
        fleet._trials = {k: TrialSpec.restore(v) for k, v in state.get("trials", {}).items()}
        fleet._experiments = dict(state.get("experiments", {}))
        fleet._decided = dict(state.get("decided", {}))
        fleet._undelivered = {
            k: [_decision(t) for t in v] for k, v in state.get("undelivered", {}).items()
        }
        fleet._reports.extend(_report(t) for t in state.get("reports", []))
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

    def _application(
        self, event: JobSubmitted
    ) -> tuple[SimulatedApplication, MeasuredApplication | None]:
        """The job's traced application, else the model of its own measurements (also
        returned: the snapshot keeps it); TraceDataError says why neither exists."""
        name = event.application or event.job.app
        try:
            if not name:
                raise TraceDataError("the submission names no application")
            return self._loader(name), None
        except TraceDataError as untraced:
            samples = self._measurements.get(event.job.uuid)
            if not samples:
                raise TraceDataError(f"no measured samples ({untraced})") from None
            measured = measure(event, samples)
            return measured, measured

    def _simulator(
        self,
        event: JobSubmitted,
        application: SimulatedApplication,
        measured: MeasuredApplication | None,
        cluster: Cluster,
    ) -> JobSimulator:
        common: dict[str, Any] = {
            "clock": self._clock,
            "origin": self.origin or DEFAULT_ORIGIN,
            "restart_delay": self.restart_delay,
            "in_place_delay": self.in_place_delay,
            "sample_interval": self.sample_interval,
            "source": self.source,
            "admission": self.admission,
            "memory": measured.memory if measured is not None else None,
        }
        spec = self._trials.get(event.job.uuid)
        if spec is None:
            return JobSimulator(event, application, cluster, **common)
        known = self._experiments.get(spec.experiment, {})
        return TrialJob(
            event,
            application,
            cluster,
            spec=spec,
            curve=self.curve,
            reporting=self.reporting,
            metric=known.get("metric"),
            reports=self._reports,
            **common,
        )

    def _arrive(self, event: JobSubmitted) -> list[JobEvent]:
        assert self.origin is not None, "jobs arrive only once the clock has started"
        key = event.job.uuid
        early = self._early.pop(key, [])
        try:
            application, measured = self._application(event)
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
        if measured is not None:
            self._measured[key] = measured
        job = self._jobs[key] = self._simulator(event, application, measured, self.cluster)
        # The plans kept for it take effect now, as if it had been here when they came;
        # each was rehearsed on the job as it arrives (_keep), and is taken as it was then.
        events: list[JobEvent] = []
        for plan in early:
            events.extend(job.update(plan).events)
        if isinstance(job, TrialJob):
            for decision in self._undelivered.pop(job.job.name, []):
                events.extend(job.decide(decision))
        return [*events, *self._admit()]

    def apply(self, plan: ScalePlan) -> PlanOutcome:
        """The plan becomes its job's desired state now; its events are in the outcome."""
        key = plan.job.uuid
        job = self._jobs.get(key)
        if job is None and key in self._unsimulable:
            return PlanOutcome(ScaleStatus.REJECTED, f"job {key!r} {self._unsimulable[key]}")
        earlier = self._outcomes.get(plan.plan_id)
        if earlier is not None:
            return replace(earlier, events=[])
        if job is None:
            submission = self._to_arrive(key)
            if submission is None:
                return PlanOutcome(
                    ScaleStatus.REJECTED,
                    f"unknown job {key!r}: no job.submitted for it has reached this env's operator",
                )
            return self._keep(submission, plan)
        outcome = job.update(plan)
        if outcome.status not in (ScaleStatus.APPLIED, ScaleStatus.PARTIAL):
            return outcome
        self._outcomes[plan.plan_id] = replace(outcome, events=[])
        # A smaller gang may have left room for jobs that wait.
        return replace(outcome, events=[*outcome.events, *self._admit()])

    def _to_arrive(self, key: str) -> JobSubmitted | None:
        """The submission of a job that has not arrived yet, if the fleet holds one."""
        if key not in self._arriving:
            return None
        waiting = (e for *_, e in self._arrivals) if self.origin is not None else self._held
        return next((e for e in waiting if e.job.uuid == key), None)

    def _keep(self, submission: JobSubmitted, plan: ScalePlan) -> PlanOutcome:
        """A plan for a job still to arrive: kept, to take effect at its arrival.

        It is rehearsed now on the job as it will arrive (alone on an empty cluster of
        this shape, the plans kept before it applied first): a plan the job would refuse
        is refused now, and one it would take is answered as it would be then (its knobs
        await the job's confirmation), the reason saying when the job arrives. Nothing a
        plan is refused for (the cluster's shape, the job's pods) changes by then, so
        the kept plans are taken at the arrival as they were in the rehearsal.
        """
        key = submission.job.uuid
        plans = _kept_with(self._early.get(key, []), plan)
        try:
            application, measured = self._application(submission)
        except TraceDataError as e:
            return PlanOutcome(ScaleStatus.REJECTED, f"job {key!r} not simulable: {e}")
        n, gpus, cpu, memory = self.cluster.shape
        empty = Cluster(n, gpus, cpu_per_node=cpu, memory_per_node=memory)
        rehearsal = self._simulator(submission, application, measured, empty)
        for kept in plans[:-1]:
            rehearsal.update(kept)
        outcome = rehearsal.update(plan)
        if outcome.status not in (ScaleStatus.APPLIED, ScaleStatus.PARTIAL):
            return outcome  # (the plans kept before it stay as they were)
        self._early[key] = plans
        answer = PlanOutcome(
            outcome.status,
            f"waiting for the job's arrival at {submission.occurred_at.isoformat()}",
            [],
            outcome.not_applied,
        )
        self._outcomes[plan.plan_id] = answer
        return answer

    def kept_plans(self, job_uuid: str) -> tuple[str, ...]:
        """The ids of the plans kept for the job's arrival, in the order they apply."""
        return tuple(p.plan_id for p in self._early.get(job_uuid, ()))

    def observed(self, job_uuid: str) -> dict[str, dict[str, int]]:
        job = self._jobs.get(job_uuid)
        return job.observed() if job is not None else {}

    # -- requested jobs and trials ----------------------------------------------------------

    def request(
        self, event: JobSubmitted, document: Mapping[str, Any], trial: TrialSpec | None = None
    ) -> list[JobEvent]:
        """A job asked for on the bus joins the queue now (``event`` stamped with the
        fleet's time): its ``document`` kept by name, a trial simulated along its curve."""
        self._requested[event.job.name] = dict(document)
        if trial is not None:
            self._trials[event.job.uuid] = trial
        return self.submit(event)

    def requested(self, name: str) -> Mapping[str, Any] | None:
        """The document job ``name`` was created from by a request, if one created it."""
        return self._requested.get(name)

    def job_named(self, name: str) -> JobSimulator | None:
        """The job of that name that has arrived, if any (a requested job's name is its
        own; a replayed job's, the name its submission gives)."""
        return next((j for j in self._jobs.values() if j.job.name == name), None)

    @property
    def has_reports(self) -> bool:
        return bool(self._reports)

    def take_reports(self) -> list[TrialMetrics]:
        """What the trials reported since the last call, in the order they reported it
        (for ``<env>.trial.metrics``; the job events go their own way, on other topics).
        Taken, they are the caller's: a snapshot keeps none, so take them before it."""
        taken, self._reports[:] = list(self._reports), []
        return taken

    def trials(self) -> tuple[TrialJob, ...]:
        return tuple(j for j in self._jobs.values() if isinstance(j, TrialJob))

    def experiment(self, event: ExperimentSubmitted) -> None:
        """An experiment's metric, for its trials' reports. Submitted again: kept as first
        seen (an experiment's spec never changes under its trials)."""
        if event.experiment in self._experiments:
            return
        metric = event.spec.searcher.metric
        self._experiments[event.experiment] = {"metric": metric, "done": False}
        for trial in self.trials():
            if trial.spec.experiment == event.experiment:
                trial.metric = metric

    def decide(self, decision: TrialDecision) -> list[JobEvent]:
        """A searcher's decision: the trial it names acts on it (trial.py), ``done`` ends
        the experiment's trials that have not ended (those left held at a rung: their
        experiment will not resume them). Each (experiment, seq) is taken once."""
        experiment = decision.experiment
        if decision.seq <= self._decided.get(experiment, -1):
            return []
        self._decided[experiment] = decision.seq
        if decision.decision is DecisionKind.DONE:
            self._experiments.setdefault(experiment, {"metric": None})["done"] = True
            ended: list[JobEvent] = []
            for trial in self.trials():
                if trial.spec.experiment == experiment and not trial.ended:
                    ended.extend(trial.end())
            return [*ended, *self._admit()] if ended else []
        assert decision.trial is not None  # (only done names no trial)
        name = trial_job_name(experiment, decision.trial)
        job = self.job_named(name)
        if not isinstance(job, TrialJob):
            if decision.decision is not DecisionKind.CREATE:
                self._undelivered.setdefault(name, []).append(decision)
            return []
        events = job.decide(decision)
        return [*events, *self._admit()] if job.ended else events

    def delete(self, name: str) -> list[JobEvent]:
        """Job ``name`` deleted (its owner's JobDeletion): its pods stop, and it is gone
        from the cluster, as a deleted TrainingJob is (no event says it ended)."""
        self._requested.pop(name, None)
        events: list[JobEvent] = []
        job = self.job_named(name)
        if job is not None:
            events.extend(job.stop_pods())
            del self._jobs[job.job.uuid]
            self._trials.pop(job.job.uuid, None)
        arriving = [a for a in self._arrivals if a[3].job.name == name]
        if arriving:
            self._arrivals = [a for a in self._arrivals if a[3].job.name != name]
            heapq.heapify(self._arrivals)
        for *_, submission in arriving:
            self._arriving.discard(submission.job.uuid)
            self._trials.pop(submission.job.uuid, None)
        held = [e for e in self._held if e.job.name == name]
        self._held = [e for e in self._held if e.job.name != name]
        for submission in held:
            self._arriving.discard(submission.job.uuid)
            self._trials.pop(submission.job.uuid, None)
        return [*events, *self._admit()] if events else events

    def active_experiments(self) -> tuple[str, ...]:
        """Experiments seen and not done, or with a trial that has not ended: while there
        are any, the searcher's decisions shape what the cluster does next."""
        live = {n for n, e in self._experiments.items() if not e.get("done")}
        live |= {t.spec.experiment for t in self.trials() if not t.ended}
        live |= {s.experiment for k, s in self._trials.items() if k not in self._jobs}
        return tuple(sorted(live))

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


def _sets_pods(plan: ScalePlan) -> bool:
    """Whether the plan says anything of the job's pods (their number, resources,
    nodes, a suspend), not only of its training knobs."""
    return bool(
        plan.node_group_resources
        or plan.placement
        or plan.suspend
        or plan.launch_nodes
        or plan.remove_nodes
        or plan.migrate_nodes
    )


def _knobs_of(plan: ScalePlan) -> ScalePlan:
    """The plan with its knobs alone (same id: the job confirms them under it)."""
    return plan.model_copy(
        update={
            "node_group_resources": {},
            "placement": {},
            "suspend": False,
            "launch_nodes": [],
            "remove_nodes": [],
            "migrate_nodes": [],
        }
    )


def _kept_with(kept: list[ScalePlan], plan: ScalePlan) -> list[ScalePlan]:
    """The plans to apply at a job's arrival once ``plan`` joins those ``kept``.

    The latest plan that sets the job's pods wins: a job that has not started has no
    pods to move, and the gangs of the plans it supersedes would only start to stop at
    once. The knobs of every plan keep their order, as they would have applied one
    after the other (a rebatch after a placement must not take the placement back)."""
    if not _sets_pods(plan):
        return [*kept, plan]
    return [_knobs_of(p) if _sets_pods(p) else p for p in kept if p.training] + [plan]


def _text(event: JobSubmitted | ScalePlan | TrialDecision | TrialMetrics) -> str:
    return encode(event).decode()


def _submission(text: str) -> JobSubmitted:
    event = decode(text.encode())
    if not isinstance(event, JobSubmitted):
        raise ValueError(f"a snapshot's submission is a {event.type}")
    return event


def _decision(text: str) -> TrialDecision:
    event = decode(text.encode())
    if not isinstance(event, TrialDecision):
        raise ValueError(f"a snapshot's decision is a {event.type}")
    return event


def _report(text: str) -> TrialMetrics:
    event = decode(text.encode())
    if not isinstance(event, TrialMetrics):
        raise ValueError(f"a snapshot's trial report is a {event.type}")
    return event


def _plan(text: str) -> ScalePlan:
    event = decode(text.encode())
    if not isinstance(event, ScalePlan):
        raise ValueError(f"a snapshot's kept plan is a {event.type}")
    return event


__all__ = ["MIN_STEP", "Loader", "VirtualCluster"]
