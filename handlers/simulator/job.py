"""A simulated training job: what a real job would report under the plans it is given.

The virtual environment closes the brain's loop without a cluster: a ScalePlan goes in,
and the runtime samples, node events and completion that a real job would produce come out,
on a simulated clock that is just a number. A plan that starves a job of memory is answered
the way Kubernetes answers it: OOMKilled, exit code 137.

This module is the job's life (admission, restarts, stalls, suspends, completion) and its
snapshot; the roles it leans on are apart: job_plan.py reads what a plan asks, training.py
is the model of how the gang trains (speed from the Pollux traces, gradient statistics,
memory), job_events.py stamps what the job says.

Pure: no I/O, no sleeping, no wall clock. Event ids and timestamps derive from the job, a
per-job sequence number and the simulated clock, so the same inputs give the same events.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import TypeAdapter

from handlers.simulator.cluster import Allocation, Cluster, PodRequest
from handlers.simulator.job_events import DEFAULT_ORIGIN, TERMINATED_EXIT_CODE, JobVoice
from handlers.simulator.job_plan import (
    UNSUPPORTED,
    desired_after,
    gives_replicas,
    holds,
    node_names,
    override_after,
    pin_after,
    pinned,
)
from handlers.simulator.throughput import OutOfTraceError, SimulatedApplication
from handlers.simulator.training import (
    EPS,
    MEMORY_MODELS,
    TRAINING_ROLES,
    MemoryModel,
    TrainingModel,
    memory_model,
    replicas,
)
from schemas.env_settings import SIM_RESTART_DELAY_S
from schemas.jobs import JobEvent, JobMeta, JobSubmitted
from schemas.plan_parts import not_applied
from schemas.plans import TRAINING_KNOBS, NotApplied, ScalePlan, ScaleStatus

#: Pollux's simulator charges every re-allocation 30 s of checkpoint-restart (the restart
#: figure of schemas/rescale_cost.py, where its source is kept).
DEFAULT_RESTART_DELAY = SIM_RESTART_DELAY_S

#: Who decides when a job's gang starts. "cluster": the simulated cluster admits each
#: submitted job as soon as its gang fits (the static baseline). "brain": a cluster
#: scheduler in the brain does: a job starts only when a plan gives it replicas, and what
#: frees GPUs starts only gangs that a plan asked for.
Admission = Literal["cluster", "brain"]

#: What the job waits for while only its scheduler can start it.
AWAITING_SCHEDULER = "the scheduler"
AWAITING_RESUME = "a plan that resumes it"
AWAITING_RELEASE = "its owner to release it (a plan with hold false)"

_PARTS: TypeAdapter[list[NotApplied]] = TypeAdapter(list[NotApplied])


class JobPhase(StrEnum):
    PENDING = "pending"  # not (yet) admitted: waiting for the whole gang to fit
    RESTARTING = "restarting"  # pods placed, job (re)loading its checkpoint
    RUNNING = "running"
    STALLED = "stalled"  # pods crash-loop (OOM) until a plan gives them what they need
    SUSPENDED = "suspended"  # preempted by a plan: no pods, progress kept, until resumed
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """What the job looks like now: the seed's status(), in the brain's vocabulary."""

    state: JobPhase
    clock: float
    speed: float  # optimizer steps per second
    samples_per_s: float
    goodput: float  # scale-invariant iterations per second
    global_step: int
    progress: float
    target_progress: float
    epoch: int
    batch_size: int
    local_batch_size: int
    accumulation_steps: int
    replicas: int
    placement: tuple[int, ...]
    waiting_for: str
    started_at: float | None
    completed_at: float | None


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    """What the operator reports back for a plan: a ScaleResult's status, reason and the
    parts it did not apply (then the status is partial)."""

    status: ScaleStatus
    reason: str
    events: list[JobEvent] = field(default_factory=list)
    not_applied: tuple[NotApplied, ...] = ()

    def snapshot(self) -> dict[str, Any]:
        """The answer, JSON-able; its events are not kept (they were said once)."""
        return {
            "status": self.status.value,
            "reason": self.reason,
            "not_applied": [p.model_dump(mode="json") for p in self.not_applied],
        }

    @classmethod
    def restore(cls, state: Mapping[str, Any]) -> PlanOutcome:
        parts = tuple(_PARTS.validate_python(state["not_applied"]))
        return cls(ScaleStatus(state["status"]), state["reason"], [], parts)


def _pod_state(pod: PodRequest) -> list[Any]:
    return [pod.role, pod.index, pod.gpu, pod.cpu, pod.memory]


def _pod(state: list[Any]) -> PodRequest:
    role, index, gpu, cpu, memory = state
    return PodRequest(role, index, gpu, cpu, memory)


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value


class JobSimulator:
    """One job on a simulated cluster, driven by ScalePlans and a clock that only moves
    when advance() is called.

    This is the job's life: which pods it wants and holds, when it starts, restarts,
    stalls, is suspended, completes or fails. What a plan asks is read by job_plan.py,
    how the gang trains by its TrainingModel (training.py), and what the job says is
    stamped by its JobVoice (job_events.py).
    """

    def __init__(
        self,
        submitted: JobSubmitted,
        application: SimulatedApplication,
        cluster: Cluster,
        *,
        clock: float = 0.0,
        origin: datetime = DEFAULT_ORIGIN,
        restart_delay: float = DEFAULT_RESTART_DELAY,
        in_place_delay: float | None = None,
        sample_interval: float | None = 30.0,
        memory: MemoryModel | None = None,
        source: str = "simulator",
        admission: Admission = "cluster",
    ) -> None:
        self._voice = JobVoice(submitted.env, submitted.job, source, origin)
        self.cluster = cluster
        self.restart_delay = restart_delay
        #: a job that rescales in place (None: it restarts): a new allocation that keeps
        #: one of its pods where it was costs this instead of restart_delay
        self.in_place_delay = in_place_delay
        self.sample_interval = sample_interval
        self.admission: Admission = admission
        self.submitted_at = clock
        self._clock = clock
        self._desired: dict[tuple[str, int], PodRequest] = {}
        # Every traced application trains on GPUs: a worker that names no GPU still has one,
        # and a submission that names no worker is one worker, as the Pollux jobs are.
        for role, spec in (submitted.roles or {}).items():
            gpu = spec.gpu_num or (1 if role in TRAINING_ROLES else 0)
            for index in range(spec.replicas):
                self._desired[(role, index)] = PodRequest(role, index, gpu, spec.cpu, spec.memory)
        if not any(p.role in TRAINING_ROLES for p in self._desired.values()):
            self._desired[("worker", 0)] = PodRequest("worker", 0, 1)
        self._model = TrainingModel(
            application,
            memory or memory_model(application.name),
            submitted.batch_size or application.init_batch_size,
        )
        self._allocation: Allocation | None = None
        self._state = JobPhase.PENDING
        # Whether the job may hold pods: the cluster grants it at submission, a brain
        # with a plan that gives it replicas; a suspend takes it back.
        self._granted = admission == "cluster"
        self._waiting_for = "admission" if self._granted else AWAITING_SCHEDULER
        # Node index -> GPUs of the training replicas there, as the latest plan placed
        # them; None: the cluster packs the gang itself.
        self._pin: dict[int, int] | None = None
        self._resume_at = 0.0
        self._progress = 0.0
        self._steps = 0.0
        self._started_at: float | None = None
        self._completed_at: float | None = None
        self._next_sample = math.inf
        self._applied: dict[str, PlanOutcome] = {}
        self._eta: float | None = None
        # The plan whose knobs the job trains with from its next start, and confirms then
        # (training.applied), as a real training process would.
        self._to_confirm: str | None = None
        # Held by its owner (a plan with hold true: an experiment's trial paused at a
        # rung): suspended, and no plan resumes or resizes it until one releases it.
        self._held = False

    # -- who it is ------------------------------------------------------------------------

    @property
    def job(self) -> JobMeta:
        return self._voice.job

    @property
    def env(self) -> str:
        return self._voice.env

    @property
    def source(self) -> str:
        return self._voice.source

    @property
    def origin(self) -> datetime:
        return self._voice.origin

    @property
    def app(self) -> SimulatedApplication:
        return self._model.app

    @property
    def memory(self) -> MemoryModel:
        return self._model.memory

    # -- snapshots ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything the job is, JSON-able (the application by name): ``restore`` gives
        back a job that says what this one would have said, event for event."""
        override = self._model.override
        return {
            "job": self.job.model_dump(mode="json"),
            "env": self.env,
            "application": self.app.name,
            "memory": [self.memory.base, self.memory.per_sample],
            "restart_delay": self.restart_delay,
            "in_place_delay": self.in_place_delay,
            "sample_interval": self.sample_interval,
            "admission": self.admission,
            "granted": self._granted,
            "pin": None if self._pin is None else sorted([n, g] for n, g in self._pin.items()),
            "submitted_at": self.submitted_at,
            "clock": self._clock,
            "seq": self._voice.seq,
            "desired": [_pod_state(p) for p in self._desired.values()],
            "target_batch": self._model.target_batch,
            "batch_override": None if override is None else list(override),
            "allocation": None if self._allocation is None else self._allocation.snapshot(),
            "state": self._state.value,
            "waiting_for": self._waiting_for,
            "resume_at": self._resume_at,
            "progress": self._progress,
            "steps": self._steps,
            "started_at": self._started_at,
            "completed_at": self._completed_at,
            "next_sample": _finite(self._next_sample),
            "applied": {k: v.snapshot() for k, v in self._applied.items()},
            "eta": self._eta,
            "to_confirm": self._to_confirm,
            "held": self._held,
        }

    @classmethod
    def restore(
        cls,
        state: Mapping[str, Any],
        application: SimulatedApplication,
        cluster: Cluster,
        *,
        origin: datetime,
        source: str,
    ) -> JobSimulator:
        """The job a snapshot describes, on ``cluster`` (restored with it: the job's pods
        are already counted there)."""
        if application.name != state["application"]:
            raise ValueError(f"snapshot of a {state['application']} job given {application.name}")
        job = cls.__new__(cls)
        job._voice = JobVoice(
            state["env"], JobMeta.model_validate(state["job"]), source, origin, state["seq"]
        )
        job.cluster = cluster
        job.restart_delay = state["restart_delay"]
        job.in_place_delay = state.get("in_place_delay")  # (absent before it existed)
        job.sample_interval = state["sample_interval"]
        # (absent from a snapshot made before they existed: a cluster-admitted job)
        admission = state.get("admission", "cluster")
        if admission not in ("cluster", "brain"):
            raise ValueError(f"a job's admission is 'cluster' or 'brain', not {admission!r}")
        job.admission = admission
        job._granted = state.get("granted", True)
        pin = state.get("pin")
        job._pin = None if pin is None else {int(n): int(g) for n, g in pin}
        job.submitted_at = state["submitted_at"]
        job._clock = state["clock"]
        job._desired = {(p.role, p.index): p for p in map(_pod, state["desired"])}
        override = state["batch_override"]
        job._model = TrainingModel(
            application,
            MemoryModel(*state["memory"]),
            state["target_batch"],
            None if override is None else (override[0], override[1]),
        )
        allocation = state["allocation"]
        job._allocation = None if allocation is None else Allocation.restore(allocation)
        job._state = JobPhase(state["state"])
        job._waiting_for = state["waiting_for"]
        job._resume_at = state["resume_at"]
        job._progress = state["progress"]
        job._steps = state["steps"]
        job._started_at = state["started_at"]
        job._completed_at = state["completed_at"]
        next_sample = state["next_sample"]
        job._next_sample = math.inf if next_sample is None else next_sample
        job._applied = {k: PlanOutcome.restore(v) for k, v in state["applied"].items()}
        job._eta = state["eta"]
        job._to_confirm = state["to_confirm"]
        job._held = state.get("held", False)  # (absent before holds existed)
        return job

    # -- what the job is doing ------------------------------------------------------------

    @property
    def clock(self) -> float:
        return self._clock

    @property
    def state(self) -> JobPhase:
        return self._state

    @property
    def completed_at(self) -> float | None:
        return self._completed_at

    def _placement(self) -> tuple[int, ...]:
        if self._allocation is None:
            return ()
        return self._allocation.gpus_per_node(TRAINING_ROLES)

    def _running_pods(self) -> Mapping[tuple[str, int], PodRequest]:
        return {} if self._allocation is None else self._allocation.pods

    def _rates_check(self) -> None:
        """OutOfTraceError when the running configuration is beyond what was measured."""
        self._model.rates(self._running_pods(), self._placement(), self._progress)

    def status(self) -> JobSnapshot:
        count = replicas(self._running_pods() or self._desired)
        local_bsz, accumulation = self._model.batch(count)
        speed = samples = goodput = 0.0
        if self._state is JobPhase.RUNNING:
            rates = self._model.rates(self._running_pods(), self._placement(), self._progress)
            iteration, goodput = rates.iteration, rates.goodput
            speed, samples = 1 / iteration, rates.batch / iteration
        return JobSnapshot(
            state=self._state,
            clock=self._clock,
            speed=speed,
            samples_per_s=samples,
            goodput=goodput,
            global_step=int(self._steps + EPS),
            progress=self._progress,
            target_progress=self.app.target_progress,
            epoch=min(self.app.epoch_at(self._progress), self.app.max_epochs),
            batch_size=count * local_bsz * accumulation,
            local_batch_size=local_bsz,
            accumulation_steps=accumulation,
            replicas=count,
            placement=self._placement(),
            waiting_for=self._waiting_for,
            started_at=self._started_at,
            completed_at=self._completed_at,
        )

    def observed(self) -> dict[str, dict[str, int]]:
        """Per role pod counts, as a ScaleResult reports them."""
        counts: dict[str, dict[str, int]] = {}
        running = self._running_pods()
        phase = {
            JobPhase.COMPLETED: "succeeded",
            JobPhase.FAILED: "failed",
            JobPhase.STALLED: "failed",
        }.get(self._state, "running")
        for key, pod in self._desired.items():
            role = counts.setdefault(
                pod.role, {"pending": 0, "running": 0, "succeeded": 0, "failed": 0}
            )
            role["pending" if running.get(key) != pod else phase] += 1
        return counts

    # -- plans ----------------------------------------------------------------------------

    def update(self, plan: ScalePlan) -> PlanOutcome:
        """Make the plan the job's desired state; each plan_id takes effect once.

        Pods whose set, resources or nodes change restart the whole gang (all-reduce
        rendezvous). A change of batch settings alone does not: the training process
        applies its knobs at a step boundary and confirms them at once, as the SDK does.
        A gang that does not fit yet waits (see try_admit). A suspend frees every pod
        and keeps the progress for a later plan that gives replicas again. A suspend with
        ``hold`` holds the job for its owner (an experiment's trial paused at a rung): no
        plan resumes or resizes it until a plan with ``hold`` false releases it, which
        resumes it at once under the cluster's admission and leaves it to the scheduler's
        plans under a brain's (as the reconciler does: reconcile/planning.py).
        """
        if plan.job.uuid != self.job.uuid:
            return PlanOutcome(ScaleStatus.REJECTED, f"plan is for job {plan.job.uuid}")
        earlier = self._applied.get(plan.plan_id)
        if earlier is not None:
            return replace(earlier, reason="already applied", events=[])
        if self._state in (JobPhase.COMPLETED, JobPhase.FAILED):
            return PlanOutcome(ScaleStatus.REJECTED, f"job is {self._state.value}")
        if plan.hold is False:
            released, reason = self._release(plan)
            return self._answer(plan, released, reason=reason)
        if self._held and not plan.suspend:
            return PlanOutcome(
                ScaleStatus.REJECTED,
                f"job {self.job.name or self.job.uuid} is held by its owner; no plan resumes "
                "or resizes it until a plan with hold false releases it",
            )
        if plan.suspend:
            if plan.node_group_resources or plan.remove_nodes or plan.training:
                return PlanOutcome(
                    ScaleStatus.REJECTED,
                    "a suspend plan carries nothing else: a later plan with a count resumes it",
                )
            stopped = self._suspend()
            if plan.hold:
                self._held = True
                self._waiting_for = AWAITING_RELEASE
                stopped.append(self._voice.job_held(True, plan.plan_id, "held", self._clock))
            return self._answer(plan, stopped)
        try:
            desired = desired_after(self._desired, plan)
            override = override_after(plan.training, desired, self._model)
            shape = self.cluster.shape
            pin = pin_after(plan, desired, self._pin, (shape[0], shape[1]))
        except ValueError as e:
            return PlanOutcome(ScaleStatus.REJECTED, str(e))
        if not any(p.role in TRAINING_ROLES and p.gpu for p in desired.values()):
            return PlanOutcome(
                ScaleStatus.REJECTED, "plan leaves the job without training replicas"
            )
        if not self.cluster.can_ever_fit(list(desired.values()), pinned(desired, pin)):
            where = "" if pin is None else f" on {node_names(pin)}"
            return PlanOutcome(ScaleStatus.REJECTED, f"the job's pods cannot fit{where}")
        pods_changed = (
            desired != self._desired or self._allocation is None or not holds(self._allocation, pin)
        )
        self._desired, self._pin = desired, pin
        if gives_replicas(plan):
            self._granted = True
        events: list[JobEvent] = []
        if any(knob in plan.training for knob in TRAINING_KNOBS):
            self._to_confirm = plan.plan_id
        batch_changed = override != self._model.override
        if batch_changed:
            self._model.override = override
            self._eta = None
        if pods_changed:
            events.extend(self.try_admit())
        # The gang kept its pods (no change, or the new one waits): the knobs act on it.
        if batch_changed and self._state is JobPhase.RUNNING:
            events.extend(self._rebatch())
        elif batch_changed and self._state is JobPhase.STALLED:
            # A crash-looping job reads its batch settings as it restarts.
            self._state, self._resume_at = JobPhase.RESTARTING, self._clock + self.restart_delay
        elif self._to_confirm == plan.plan_id and self._state is JobPhase.RUNNING:
            events.extend(self._confirm())  # it trains with them already
        return self._answer(plan, events)

    def _answer(
        self, plan: ScalePlan, events: list[JobEvent], *, reason: str | None = None
    ) -> PlanOutcome:
        """The outcome of an accepted plan, kept for a plan given again."""
        left_out = not_applied(plan, UNSUPPORTED, pins_nodes=True)
        status = ScaleStatus.PARTIAL if left_out else ScaleStatus.APPLIED
        if reason is None:
            reason = (
                f"waiting for {self._waiting_for}"
                if self._desired != dict(self._running_pods())
                else ""
            )
        outcome = PlanOutcome(status, reason, events, left_out)
        self._applied[plan.plan_id] = replace(outcome, events=[])
        return outcome

    def stop_pods(self) -> list[JobEvent]:
        """Its pods stopped for good (the job deleted): they exit, their GPUs are free."""
        stopped = sorted(self._running_pods().values(), key=lambda p: (p.role, p.index))
        self.cluster.release(self.job.uuid)
        self._allocation = None
        self._granted = False
        return self._voice.exited(stopped, self._clock)

    @property
    def held(self) -> bool:
        """Whether the job is held by its owner (see update)."""
        return self._held

    def _release(self, plan: ScalePlan) -> tuple[list[JobEvent], str]:
        """A held job released to the queue: under the cluster's admission it resumes at
        once (if its gang fits), under a brain's it waits for a plan that gives it
        replicas. One that is not held is left as it is (a release delivered again, or
        one that came before its hold)."""
        if not self._held:
            return [], "not held: nothing to release"
        self._held = False
        reason = "released to the queue"
        events: list[JobEvent] = [self._voice.job_held(False, plan.plan_id, reason, self._clock)]
        if self.admission == "cluster":
            self._granted = True
            self._waiting_for = "admission"
            events.extend(self.try_admit())
        else:
            self._waiting_for = AWAITING_SCHEDULER
        return events, reason

    def _suspend(self) -> list[JobEvent]:
        """Preempted: every pod stops (its checkpoint keeps the progress) and nothing
        starts the job again but a plan that gives it replicas. A job without pods only
        loses its claim to start."""
        self._granted = False
        self._eta = None
        stopped = sorted(self._running_pods().values(), key=lambda p: (p.role, p.index))
        if self._allocation is not None:
            self.cluster.release(self.job.uuid)
            self._allocation = None
        if stopped or self._state is JobPhase.SUSPENDED or self._started_at is not None:
            self._state = JobPhase.SUSPENDED
            self._waiting_for = AWAITING_RESUME
        elif self.admission == "brain":
            self._waiting_for = AWAITING_SCHEDULER
        else:
            self._waiting_for = AWAITING_RESUME
        return self._voice.exited(stopped, self._clock)

    def _rebatch(self) -> list[JobEvent]:
        """New knobs in a running gang, from this step on: the job confirms them, or its
        replicas run out of memory at the first step with them."""
        oom = self._oom_events()
        if oom:
            self._state = JobPhase.STALLED
            self._waiting_for = "a plan that gives the job the memory it needs"
            self._eta = None
            return oom
        try:
            self._rates_check()
        except OutOfTraceError as e:
            return self._unsimulable(e)
        return self._confirm()

    def _confirm(self) -> list[JobEvent]:
        """training.applied for the plan whose knobs the job now trains with: said by its
        first training replica, for all of them, at the step it starts from."""
        plan_id, self._to_confirm = self._to_confirm, None
        training = sorted(
            (p for p in self._running_pods().values() if p.role in TRAINING_ROLES),
            key=lambda p: (p.role, p.index),
        )
        if plan_id is None or not training:
            return []
        local_bsz, accumulation = self._model.batch(replicas(self._running_pods()))
        return [
            self._voice.training_applied(
                plan_id,
                training[0],
                local_bsz,
                accumulation,
                int(self._steps + EPS),
                self._clock,
            )
        ]

    def try_admit(self) -> list[JobEvent]:
        """Ask the cluster for the desired gang, on its planned nodes if it has any; on
        success the job restarts on it. A job nobody granted pods waits untouched."""
        if self._state in (JobPhase.COMPLETED, JobPhase.FAILED) or not self._granted:
            return []
        if (
            self._allocation is not None
            and dict(self._allocation.pods) == self._desired
            and holds(self._allocation, self._pin)
        ):
            return []
        pods = list(self._desired.values())
        placed = pinned(self._desired, self._pin)
        if not self.cluster.can_ever_fit(pods, placed):
            self._state = JobPhase.FAILED
            self._waiting_for = ""
            self.cluster.release(self.job.uuid)
            self._allocation = None
            return [self._voice.job_failed("the job's pods cannot fit on the cluster", self._clock)]
        allocation = self.cluster.admit(self.job.uuid, pods, placed)
        if allocation is None:
            self._waiting_for = (
                f"capacity: {replicas(self._desired)} GPUs as one gang"
                if self._pin is None
                else f"room on {node_names(self._pin)}"
            )
            if self.admission == "brain" and self._allocation is not None:
                return self._give_up_old_gang()
            return []
        previous = self._allocation
        self._allocation = allocation
        self._waiting_for = ""
        self._state = JobPhase.RESTARTING
        self._resume_at = self._clock + self._rescale_delay(previous, allocation)
        self._eta = None
        # A pod that changed is a new pod; so is one a plan's placement moved to another
        # node (the cluster's own re-packing of a gang is its affair, said as before).
        started = [
            pod
            for key, pod in allocation.pods.items()
            if previous is None
            or previous.pods.get(key) != pod
            or (self._pin is not None and previous.nodes.get(key) != allocation.nodes[key])
        ]
        return self._voice.started(started, self._clock)

    def _rescale_delay(self, previous: Allocation | None, allocation: Allocation) -> float:
        """What the change from ``previous`` to ``allocation`` costs: in place when the job
        rescales so and one of its training pods stays as and where it was (a survivor to
        send the newcomers the state), else a restart from the checkpoint."""
        if self.in_place_delay is None or previous is None:
            return self.restart_delay
        kept = any(
            pod.role in TRAINING_ROLES
            and previous.pods.get(key) == pod
            and previous.nodes.get(key) == allocation.nodes.get(key)
            for key, pod in allocation.pods.items()
        )
        return self.in_place_delay if kept else self.restart_delay

    def _give_up_old_gang(self) -> list[JobEvent]:
        """Under a brain's admission the scheduler has given the GPUs of the job's old
        gang to others in the same decision (two jobs may swap nodes): the old pods stop
        while the new gang waits for its room, as a real restart deletes them first."""
        stopped = sorted(self._running_pods().values(), key=lambda p: (p.role, p.index))
        self.cluster.release(self.job.uuid)
        self._allocation = None
        self._state = JobPhase.PENDING
        self._eta = None
        return self._voice.exited(stopped, self._clock)

    # -- time -----------------------------------------------------------------------------

    def advance(self, dt: float) -> list[JobEvent]:
        """Move the simulated clock by dt seconds and return what the job said meanwhile."""
        if dt < 0:
            raise ValueError("time does not run backwards")
        end = self._clock + dt
        events: list[JobEvent] = []
        while self._clock < end and self._state in (JobPhase.RESTARTING, JobPhase.RUNNING):
            if self._state is JobPhase.RESTARTING:
                if self._resume_at > end:
                    break
                self._clock = self._resume_at
                events.extend(self._resume())
                continue
            events.extend(self._train_until(end))
        self._clock = max(self._clock, end)
        return events

    def _oom_events(self) -> list[JobEvent]:
        """What the training replicas say at their first step with the current batch
        when it does not fit; nothing when it fits."""
        kind, need, starved = self._model.out_of_memory(self._running_pods())
        return self._voice.out_of_memory(kind, need, starved, self._clock)

    def _unsimulable(self, error: OutOfTraceError) -> list[JobEvent]:
        """Beyond what was measured the simulator would only guess; it says so loudly."""
        self._state = JobPhase.FAILED
        self._waiting_for = ""
        self.cluster.release(self.job.uuid)
        self._allocation = None
        return [self._voice.job_failed(f"not simulable: {error}", self._clock)]

    def _resume(self) -> list[JobEvent]:
        """Training starts on the new gang, unless its pods do not have the memory."""
        events = self._oom_events()
        if not events:
            try:
                self._rates_check()
            except OutOfTraceError as e:
                return self._unsimulable(e)
        if events:
            self._state = JobPhase.STALLED
            self._waiting_for = "a plan that gives the job the memory it needs"
            self._eta = None
            return events
        self._state = JobPhase.RUNNING
        events.extend(self._confirm())
        if self.sample_interval:
            self._next_sample = (
                math.floor(self._clock / self.sample_interval) + 1
            ) * self.sample_interval
        if self._started_at is None:
            self._started_at = self._clock
            events.append(self._voice.job_started(self._clock))
        return events

    def _train_until(self, end: float) -> list[JobEvent]:
        """Train to the first of: end, the next sample, the end of the current epoch."""
        stretch = self._model.train(
            self._running_pods(),
            self._placement(),
            self._clock,
            self._steps,
            self._progress,
            min(end, self._next_sample),
        )
        self._clock, self._steps, self._progress = stretch.clock, stretch.steps, stretch.progress
        if stretch.epoch_ended:
            return self._complete() if stretch.last else []
        if self._clock >= self._next_sample:
            assert self.sample_interval is not None
            self._next_sample += self.sample_interval
            return [self._sample()]
        return []

    def _sample(self) -> JobEvent:
        pods = self._running_pods()
        measured = self._model.measured(pods, self._placement(), self._progress, self._steps)
        return self._voice.sample(measured, self._clock)

    def _complete(self) -> list[JobEvent]:
        events: list[JobEvent] = [self._sample()] if self.sample_interval else []
        self._state = JobPhase.COMPLETED
        self._completed_at = self._clock
        self._eta = self._clock
        self.cluster.release(self.job.uuid)
        self._allocation = None
        events.append(self._voice.job_completed(self._clock))
        return events

    def next_event_at(self) -> float | None:
        """Clock of the next thing the job says if no plan comes: the end of its restart,
        its next sample, or its completion. None while only a plan or free capacity can move
        it, so a clock that jumps from event to event knows there is nothing to jump to."""
        if self._state is JobPhase.RESTARTING:
            return self._resume_at
        if self._state is not JobPhase.RUNNING:
            return None
        times = [t for t in (self._next_sample, self.eta()) if t is not None and t < math.inf]
        return min(times, default=None)

    def eta(self) -> float | None:
        """Clock at which the job completes if nothing changes; None if it never will."""
        if self._eta is not None:
            return self._eta
        if self._state is JobPhase.RUNNING:
            t = self._clock
        elif self._state is JobPhase.RESTARTING:
            t = self._resume_at
            if self._model.starves(self._running_pods()):
                return None
        else:
            return None
        eta = self._model.finish_at(self._running_pods(), self._placement(), t, self._progress)
        if eta is None:
            return None
        self._eta = eta
        return eta


__all__ = [
    "AWAITING_RESUME",
    "AWAITING_SCHEDULER",
    "DEFAULT_ORIGIN",
    "DEFAULT_RESTART_DELAY",
    "MEMORY_MODELS",
    "TERMINATED_EXIT_CODE",
    "TRAINING_ROLES",
    "Admission",
    "JobPhase",
    "JobSimulator",
    "JobSnapshot",
    "MemoryModel",
    "PlanOutcome",
    "memory_model",
]
