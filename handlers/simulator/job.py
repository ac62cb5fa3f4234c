"""A simulated training job: what a real job would report under the plans it is given.

The virtual environment closes the brain's loop without a cluster: a ScalePlan goes in,
and the runtime samples, node events and completion that a real job would produce come out,
on a simulated clock that is just a number. Speed comes from the measured Pollux traces
(throughput.py), usefulness of a step from their gradient statistics, and memory failures
from a small per-application memory model (MEMORY_MODELS), so a plan that starves a job of
memory is answered the way Kubernetes answers it: OOMKilled, exit code 137.

Pure: no I/O, no sleeping, no wall clock. Event ids and timestamps derive from the job, a
per-job sequence number and the simulated clock, so the same inputs give the same events.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import TypeAdapter

from handlers.simulator.cluster import Allocation, Cluster, GiB, PodRequest
from handlers.simulator.throughput import OutOfTraceError, SimulatedApplication, StepTime
from schemas.env_settings import SIM_RESTART_DELAY_S
from schemas.jobs import (
    JobCompleted,
    JobEvent,
    JobFailed,
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeExited,
    NodeOOM,
    NodeRef,
    NodeStarted,
    NodeUsage,
    OOMKind,
    RuntimeSample,
)
from schemas.plan_parts import not_applied
from schemas.plans import (
    TRAINING_KNOBS,
    NodeResource,
    NotApplied,
    ScalePlan,
    ScaleStatus,
    TrainingApplied,
)

MiB = 1024**2

#: Roles whose pods are data-parallel replicas: one replica per GPU of such a pod.
TRAINING_ROLES: frozenset[str] = frozenset({"worker", "chief"})

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

#: The exit code of a pod the platform stopped (SIGTERM, 128 + 15), as Kubernetes reports it.
TERMINATED_EXIT_CODE = 143

#: A plan's placement names nodes as the simulated cluster does: node-<index from 0>.
_NODE_NAME = re.compile(r"node-(0|[1-9][0-9]*)")

#: Simulated time 0; fixed so that two runs of the same input give equal timestamps.
DEFAULT_ORIGIN = datetime(2021, 1, 1, tzinfo=UTC)

_EVENT_NAMESPACE = uuid.UUID("6f1c1d3e-4b5a-4f0e-9a7c-5d8e2b1a0c93")

#: Slack when the clock lands on an epoch boundary computed along another path (float sums).
_EPS = 1e-6

_PARTS: TypeAdapter[list[NotApplied]] = TypeAdapter(list[NotApplied])

#: What a plan may ask that the simulated cluster does not model: its pods have GPUs,
#: cores and memory, and a GPU out of memory is a micro-batch beyond the traced one.
UNSUPPORTED = {
    "gpu_type": "the simulated cluster has no GPU types",
    "gpu_memory": "the simulated cluster does not model GPU memory sizes",
    "priority": "the simulated cluster has no priorities",
}


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """Host memory one training replica needs: a fixed part (framework, model, optimizer
    state, data-loader workers) and a part that grows with the local batch (prefetched
    samples). These are assumptions of scale, not measurements: the Pollux traces record
    no host memory."""

    base: int
    per_sample: int

    def need(self, local_bsz: int) -> int:
        return self.base + self.per_sample * local_bsz


MEMORY_MODELS: Mapping[str, MemoryModel] = {
    # BERT-base fine-tuning on SQuAD: large model and tokenised dataset in memory.
    "bert": MemoryModel(base=6 * GiB, per_sample=32 * MiB),
    # ResNet-18 on CIFAR-10: the whole dataset (~180 MB) fits in memory.
    "cifar10": MemoryModel(base=2 * GiB, per_sample=1 * MiB),
    # DeepSpeech2 on LibriSpeech: spectrogram batches are large.
    "deepspeech2": MemoryModel(base=4 * GiB, per_sample=32 * MiB),
    # ResNet-50 on ImageNet: JPEG decoding workers and their prefetch queues.
    "imagenet": MemoryModel(base=8 * GiB, per_sample=16 * MiB),
    # NeuMF on MovieLens: rating matrix and embedding tables, tiny samples.
    "ncf": MemoryModel(base=4 * GiB, per_sample=4 * 1024),
    # YOLOv3 on PASCAL VOC: augmentation workers on 416x416 images.
    "yolov3": MemoryModel(base=6 * GiB, per_sample=64 * MiB),
}
DEFAULT_MEMORY_MODEL = MemoryModel(base=4 * GiB, per_sample=8 * MiB)


def memory_model(application: str) -> MemoryModel:
    return MEMORY_MODELS.get(application, DEFAULT_MEMORY_MODEL)


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
    when advance() is called."""

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
        self.job = submitted.job
        self.env = submitted.env
        self.app = application
        self.cluster = cluster
        self.origin = origin
        self.restart_delay = restart_delay
        #: a job that rescales in place (None: it restarts): a new allocation that keeps
        #: one of its pods where it was costs this instead of restart_delay
        self.in_place_delay = in_place_delay
        self.sample_interval = sample_interval
        self.memory = memory or memory_model(application.name)
        self.source = source
        self.admission: Admission = admission
        self.submitted_at = clock
        self._clock = clock
        self._seq = 0
        self._desired: dict[tuple[str, int], PodRequest] = {}
        # Every traced application trains on GPUs: a worker that names no GPU still has one,
        # and a submission that names no worker is one worker, as the Pollux jobs are.
        for role, spec in (submitted.roles or {}).items():
            gpu = spec.gpu_num or (1 if role in TRAINING_ROLES else 0)
            for index in range(spec.replicas):
                self._desired[(role, index)] = PodRequest(role, index, gpu, spec.cpu, spec.memory)
        if not any(p.role in TRAINING_ROLES for p in self._desired.values()):
            self._desired[("worker", 0)] = PodRequest("worker", 0, 1)
        self._target_batch = submitted.batch_size or application.init_batch_size
        self._batch_override: tuple[int, int] | None = None
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

    # -- snapshots ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything the job is, JSON-able (the application by name): ``restore`` gives
        back a job that says what this one would have said, event for event."""
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
            "seq": self._seq,
            "desired": [_pod_state(p) for p in self._desired.values()],
            "target_batch": self._target_batch,
            "batch_override": None if self._batch_override is None else list(self._batch_override),
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
        job.job = JobMeta.model_validate(state["job"])
        job.env = state["env"]
        job.app = application
        job.cluster = cluster
        job.origin = origin
        job.restart_delay = state["restart_delay"]
        job.in_place_delay = state.get("in_place_delay")  # (absent before it existed)
        job.sample_interval = state["sample_interval"]
        job.memory = MemoryModel(*state["memory"])
        job.source = source
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
        job._seq = state["seq"]
        job._desired = {(p.role, p.index): p for p in map(_pod, state["desired"])}
        job._target_batch = state["target_batch"]
        override = state["batch_override"]
        job._batch_override = None if override is None else (override[0], override[1])
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

    def _replicas(self, pods: Mapping[tuple[str, int], PodRequest]) -> int:
        return sum(p.gpu for p in pods.values() if p.role in TRAINING_ROLES)

    def _placement(self) -> tuple[int, ...]:
        if self._allocation is None:
            return ()
        return self._allocation.gpus_per_node(TRAINING_ROLES)

    def _batch(self, replicas: int) -> tuple[int, int]:
        """(local_bsz, accumulation_steps) at a replica count: the plan's, else the rule's."""
        if self._batch_override is not None:
            return self._batch_override
        return self.app.split_batch(self._target_batch, max(replicas, 1))

    def _running_pods(self) -> Mapping[tuple[str, int], PodRequest]:
        return {} if self._allocation is None else self._allocation.pods

    def _rates(self) -> tuple[StepTime, float, int, float]:
        """(step time, iteration time, global batch, goodput) of the running configuration."""
        replicas = self._replicas(self._running_pods())
        local_bsz, accumulation = self._batch(replicas)
        step = self.app.step_time(self._placement(), local_bsz)
        iteration = step.iteration_time(accumulation)
        batch = replicas * local_bsz * accumulation
        epoch = min(self.app.epoch_at(self._progress), self.app.max_epochs - 1)
        return step, iteration, batch, self.app.gain(batch, epoch) / iteration

    def status(self) -> JobSnapshot:
        replicas = self._replicas(self._running_pods() or self._desired)
        local_bsz, accumulation = self._batch(replicas)
        speed = samples = goodput = 0.0
        if self._state is JobPhase.RUNNING:
            _, iteration, batch, goodput = self._rates()
            speed, samples = 1 / iteration, batch / iteration
        return JobSnapshot(
            state=self._state,
            clock=self._clock,
            speed=speed,
            samples_per_s=samples,
            goodput=goodput,
            global_step=int(self._steps + _EPS),
            progress=self._progress,
            target_progress=self.app.target_progress,
            epoch=min(self.app.epoch_at(self._progress), self.app.max_epochs),
            batch_size=replicas * local_bsz * accumulation,
            local_batch_size=local_bsz,
            accumulation_steps=accumulation,
            replicas=replicas,
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

    # -- events ---------------------------------------------------------------------------

    def _meta(self, kind: str) -> dict[str, Any]:
        self._seq += 1
        return {
            "env": self.env,
            "job": self.job,
            "source": self.source,
            "event_id": uuid.uuid5(_EVENT_NAMESPACE, f"{self.job.uuid}/{self._seq}/{kind}"),
            "occurred_at": self.origin + timedelta(seconds=self._clock),
        }

    def _node(self, pod: PodRequest) -> NodeRef:
        return NodeRef(
            type=pod.role,
            id=pod.index,
            name=f"{self.job.name or self.job.uuid}-{pod.role}-{pod.index}",
        )

    def _sample(self) -> RuntimeSample:
        step, iteration, batch, _ = self._rates()
        local_bsz, accumulation = self._batch(self._replicas(self._running_pods()))
        nodes = [
            NodeUsage(
                type=pod.role,
                id=pod.index,
                cpu=pod.cpu,
                memory=self._memory_used(pod, local_bsz),
                gpu_util=(step.compute_time / step.step_time) if pod.gpu else None,
                step_time=iteration,
            )
            for pod in self._running_pods().values()
        ]
        epoch = min(self.app.epoch_at(self._progress), self.app.max_epochs - 1)
        stats = self.app.grad_stats(batch, epoch)  # None: the application has none
        placement = self._placement()
        world_size = self._replicas(self._running_pods())
        # Per optimizer step: the all-reduce the compute did not hide happens once, after
        # the last micro-step; the rest is compute (k micro-steps). One replica reduces
        # with no one: what its trace calls sync is step overhead, i.e. compute.
        allreduce = step.sync_time if world_size > 1 else 0.0
        return RuntimeSample(
            **self._meta("sample"),
            global_step=int(self._steps + _EPS),
            speed=1 / iteration,
            samples_per_s=batch / iteration,
            batch_size=batch,
            local_batch_size=local_bsz,
            accumulation_steps=accumulation,
            world_size=world_size,
            nodes=nodes,
            num_nodes=len(placement),
            grad_sqr=None if stats is None else stats[0],
            # The traces' variance is that of a mean over the initial batch; the sample's
            # is that of one sample's gradient (schemas.jobs.RuntimeSample.grad_var).
            grad_var=None if stats is None else stats[1] * self.app.init_batch_size,
            compute_s=iteration - allreduce,
            allreduce_s=allreduce,
        )

    def _memory_used(self, pod: PodRequest, local_bsz: int) -> int:
        if pod.role not in TRAINING_ROLES:
            return 0
        need = self.memory.need(local_bsz)
        return min(need, pod.memory) if pod.memory else need

    # -- plans ----------------------------------------------------------------------------

    def update(self, plan: ScalePlan) -> PlanOutcome:
        """Make the plan the job's desired state; each plan_id takes effect once.

        Pods whose set, resources or nodes change restart the whole gang (all-reduce
        rendezvous). A change of batch settings alone does not: the training process
        applies its knobs at a step boundary and confirms them at once, as the SDK does.
        A gang that does not fit yet waits (see try_admit). A suspend frees every pod
        and keeps the progress for a later plan that gives replicas again.
        """
        if plan.job.uuid != self.job.uuid:
            return PlanOutcome(ScaleStatus.REJECTED, f"plan is for job {plan.job.uuid}")
        earlier = self._applied.get(plan.plan_id)
        if earlier is not None:
            return replace(earlier, reason="already applied", events=[])
        if self._state in (JobPhase.COMPLETED, JobPhase.FAILED):
            return PlanOutcome(ScaleStatus.REJECTED, f"job is {self._state.value}")
        if plan.suspend:
            if plan.node_group_resources or plan.remove_nodes or plan.training:
                return PlanOutcome(
                    ScaleStatus.REJECTED,
                    "a suspend plan carries nothing else: a later plan with a count resumes it",
                )
            return self._answer(plan, self._suspend())
        try:
            desired = self._desired_after(plan)
            override = self._override_after(plan.training, desired)
            pin = self._pin_after(plan, desired)
        except ValueError as e:
            return PlanOutcome(ScaleStatus.REJECTED, str(e))
        if not any(p.role in TRAINING_ROLES and p.gpu for p in desired.values()):
            return PlanOutcome(
                ScaleStatus.REJECTED, "plan leaves the job without training replicas"
            )
        if not self.cluster.can_ever_fit(list(desired.values()), self._pinned(desired, pin)):
            where = "" if pin is None else f" on {_node_names(pin)}"
            return PlanOutcome(ScaleStatus.REJECTED, f"the job's pods cannot fit{where}")
        pods_changed = desired != self._desired or self._allocation is None or not self._holds(pin)
        self._desired, self._pin = desired, pin
        if _gives_replicas(plan):
            self._granted = True
        events: list[JobEvent] = []
        if any(knob in plan.training for knob in TRAINING_KNOBS):
            self._to_confirm = plan.plan_id
        batch_changed = override != self._batch_override
        if batch_changed:
            self._batch_override = override
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

    def _answer(self, plan: ScalePlan, events: list[JobEvent]) -> PlanOutcome:
        """The outcome of an accepted plan, kept for a plan given again."""
        left_out = not_applied(plan, UNSUPPORTED, pins_nodes=True)
        status = ScaleStatus.PARTIAL if left_out else ScaleStatus.APPLIED
        reason = (
            f"waiting for {self._waiting_for}"
            if self._desired != dict(self._running_pods())
            else ""
        )
        outcome = PlanOutcome(status, reason, events, left_out)
        self._applied[plan.plan_id] = replace(outcome, events=[])
        return outcome

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
        return [
            NodeExited(
                **self._meta("node.exited"), node=self._node(pod), exit_code=TERMINATED_EXIT_CODE
            )
            for pod in stopped
        ]

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
            self._rates()
        except OutOfTraceError as e:
            return self._unsimulable(e)
        return self._confirm()

    def _pin_after(
        self, plan: ScalePlan, desired: Mapping[tuple[str, int], PodRequest]
    ) -> dict[int, int] | None:
        """The nodes the plan puts the training replicas on: its placement, else the
        ones they were put on before while they still match the replicas; None: the
        cluster chooses. A placement it cannot follow is refused (ValueError)."""
        replicas = self._replicas(desired)
        if not plan.placement:
            kept = self._pin
            if kept is None or sum(kept.values()) != replicas:
                return None
            try:
                self._pinned(desired, kept)
            except ValueError:
                return None
            return kept
        num_nodes, gpus_per_node, _, _ = self.cluster.shape
        pin: dict[int, int] = {}
        for name, gpus in plan.placement.items():
            match = _NODE_NAME.fullmatch(name)
            if match is None or int(match.group(1)) >= num_nodes:
                raise ValueError(
                    f"placement names {name!r}: the simulated cluster's nodes are "
                    f"node-0 to node-{num_nodes - 1}"
                )
            if gpus > gpus_per_node:
                raise ValueError(f"placement puts {gpus} GPUs on {name}, which has {gpus_per_node}")
            if gpus:
                pin[int(match.group(1))] = gpus
        if sum(pin.values()) != replicas:
            raise ValueError(
                f"placement holds {sum(pin.values())} GPUs, the job's training replicas "
                f"need {replicas}"
            )
        self._pinned(desired, pin)
        return pin

    def _pinned(
        self, pods: Mapping[tuple[str, int], PodRequest], pin: Mapping[int, int] | None
    ) -> dict[tuple[str, int], int] | None:
        """The node of each training pod under ``pin``: lowest node first, pods in index
        order, a node filled to its GPUs before the next. ValueError when the pods do not
        split that way (a pod of 2 GPUs cannot take one GPU here and one there)."""
        if pin is None:
            return None
        training = sorted(
            (p for p in pods.values() if p.role in TRAINING_ROLES and p.gpu),
            key=lambda p: (p.role, p.index),
        )
        nodes: dict[tuple[str, int], int] = {}
        slots = iter(sorted(pin.items()))
        node, left = next(slots, (-1, 0))
        for pod in training:
            while left == 0:
                node, left = next(slots, (-1, -1))
            if pod.gpu > left:
                raise ValueError(
                    f"placement {_node_names(pin)} does not split into the job's pods of "
                    f"{pod.gpu} GPUs each"
                )
            nodes[pod.key] = node
            left -= pod.gpu
        return nodes

    def _holds(self, pin: Mapping[int, int] | None) -> bool:
        """Whether the running gang already sits where ``pin`` puts it."""
        if pin is None or self._allocation is None:
            return True
        have: dict[int, int] = {}
        for key, node in self._allocation.nodes.items():
            pod = self._allocation.pods[key]
            if pod.role in TRAINING_ROLES and pod.gpu:
                have[node] = have.get(node, 0) + pod.gpu
        return have == dict(pin)

    def _desired_after(self, plan: ScalePlan) -> dict[tuple[str, int], PodRequest]:
        pods = dict(self._desired)
        for role, group in plan.node_group_resources.items():
            current = sorted((k for k in pods if k[0] == role), key=lambda k: k[1])
            template = (
                pods[current[0]]
                if current
                else PodRequest(role, 0, 1 if role in TRAINING_ROLES else 0)
            )
            template = _with_resource(template, group.node_resource)
            for key in current:
                pods[key] = _with_resource(pods[key], group.node_resource)
            if group.count:
                for key in current[group.count :]:  # highest index first
                    del pods[key]
                next_index = (current[-1][1] + 1) if current else 0
                for index in range(next_index, next_index + max(0, group.count - len(current))):
                    pods[(role, index)] = replace(template, index=index)
        for ref in plan.remove_nodes:
            pods.pop((ref.type, ref.id), None)
        for node in plan.launch_nodes:
            key = (node.type, node.id)
            siblings = [p for p in pods.values() if p.role == node.type]
            base = (
                siblings[0]
                if siblings
                else PodRequest(node.type, node.id, 1 if node.type in TRAINING_ROLES else 0)
            )
            pods[key] = _with_resource(replace(base, index=node.id), node.resource)
        for move in plan.migrate_nodes:
            key = (move.node.type, move.node.id)
            if key not in pods:
                raise ValueError(f"cannot migrate {move.node.type}-{move.node.id}: no such node")
            pods[key] = _with_resource(pods[key], move.resource)
        return pods

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
        local_bsz, accumulation = self._batch(self._replicas(self._running_pods()))
        return [
            TrainingApplied(
                **self._meta("training.applied"),
                plan_id=plan_id,
                node=self._node(training[0]),
                training={"local_batch_size": local_bsz, "accumulation_steps": accumulation},
                global_step=int(self._steps + _EPS),
            )
        ]

    def _override_after(
        self, training: Mapping[str, Any], desired: Mapping[tuple[str, int], PodRequest]
    ) -> tuple[int, int] | None:
        """The (local batch, accumulation) the plan sets; a knob it leaves out is what the
        job would use at the plan's replicas."""
        if "local_batch_size" not in training and "accumulation_steps" not in training:
            return self._batch_override
        local_bsz, accumulation = self._batch(self._replicas(desired))
        local_bsz = int(training.get("local_batch_size", local_bsz))
        accumulation = int(training.get("accumulation_steps", accumulation))
        if local_bsz < 1 or accumulation < 1:
            raise ValueError("local_batch_size and accumulation_steps must be >= 1")
        return (local_bsz, accumulation)

    def try_admit(self) -> list[JobEvent]:
        """Ask the cluster for the desired gang, on its planned nodes if it has any; on
        success the job restarts on it. A job nobody granted pods waits untouched."""
        if self._state in (JobPhase.COMPLETED, JobPhase.FAILED) or not self._granted:
            return []
        if (
            self._allocation is not None
            and dict(self._allocation.pods) == self._desired
            and self._holds(self._pin)
        ):
            return []
        pods = list(self._desired.values())
        pinned = self._pinned(self._desired, self._pin)
        if not self.cluster.can_ever_fit(pods, pinned):
            self._state = JobPhase.FAILED
            self._waiting_for = ""
            self.cluster.release(self.job.uuid)
            self._allocation = None
            return [
                JobFailed(**self._meta("failed"), reason="the job's pods cannot fit on the cluster")
            ]
        allocation = self.cluster.admit(self.job.uuid, pods, pinned)
        if allocation is None:
            self._waiting_for = (
                f"capacity: {self._replicas(self._desired)} GPUs as one gang"
                if self._pin is None
                else f"room on {_node_names(self._pin)}"
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
        return [
            NodeStarted(**self._meta("node.started"), node=self._node(pod))
            for key, pod in allocation.pods.items()
            if previous is None
            or previous.pods.get(key) != pod
            or (self._pin is not None and previous.nodes.get(key) != allocation.nodes[key])
        ]

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
        return [
            NodeExited(
                **self._meta("node.exited"), node=self._node(pod), exit_code=TERMINATED_EXIT_CODE
            )
            for pod in stopped
        ]

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
        when it does not fit: the GPU's memory (a micro-batch beyond the largest traced)
        or the pod's (OOMKilled); nothing when it fits."""
        replicas = self._replicas(self._running_pods())
        local_bsz, _ = self._batch(replicas)
        training = [p for p in self._running_pods().values() if p.role in TRAINING_ROLES]
        if local_bsz > self.app.max_local_bsz:
            return [
                NodeOOM(
                    **self._meta("node.oom"),
                    node=self._node(pod),
                    kind=OOMKind.GPU_MEMORY,
                    exit_code=1,
                )
                for pod in training
            ]
        need = self.memory.need(local_bsz)
        return [
            NodeOOM(
                **self._meta("node.oom"),
                node=self._node(pod),
                kind=OOMKind.HOST_MEMORY,
                memory=need,
                exit_code=137,
            )
            for pod in training
            if pod.memory and pod.memory < need
        ]

    def _unsimulable(self, error: OutOfTraceError) -> list[JobEvent]:
        """Beyond what was measured the simulator would only guess; it says so loudly."""
        self._state = JobPhase.FAILED
        self._waiting_for = ""
        self.cluster.release(self.job.uuid)
        self._allocation = None
        return [JobFailed(**self._meta("failed"), reason=f"not simulable: {error}")]

    def _resume(self) -> list[JobEvent]:
        """Training starts on the new gang, unless its pods do not have the memory."""
        events = self._oom_events()
        if not events:
            try:
                self._rates()
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
            events.append(JobStarted(**self._meta("job.started")))
        return events

    def _train_until(self, end: float) -> list[JobEvent]:
        """Train to the first of: end, the next sample, the end of the current epoch."""
        _, iteration, _, goodput = self._rates()
        epoch = self.app.epoch_at(self._progress)
        boundary = self.app.epoch_end_progress(epoch)
        to_boundary = (boundary - self._progress) / goodput
        horizon = min(end, self._next_sample)
        if self._clock + to_boundary <= horizon + _EPS:
            self._clock += to_boundary
            self._steps += to_boundary / iteration
            self._progress = boundary
            if epoch + 1 >= self.app.max_epochs:
                return self._complete()
            return []
        # An epoch end reached within _EPS past the horizon may leave the clock just beyond it.
        elapsed = max(0.0, horizon - self._clock)
        self._clock += elapsed
        self._steps += elapsed / iteration
        self._progress += goodput * elapsed
        if self._clock >= self._next_sample:
            assert self.sample_interval is not None
            self._next_sample += self.sample_interval
            return [self._sample()]
        return []

    def _complete(self) -> list[JobEvent]:
        events: list[JobEvent] = [self._sample()] if self.sample_interval else []
        self._state = JobPhase.COMPLETED
        self._completed_at = self._clock
        self._eta = self._clock
        self.cluster.release(self.job.uuid)
        self._allocation = None
        events.append(JobCompleted(**self._meta("job.completed")))
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
            t, progress = self._clock, self._progress
        elif self._state is JobPhase.RESTARTING:
            t, progress = self._resume_at, self._progress
            local_bsz, _ = self._batch(self._replicas(self._running_pods()))
            if local_bsz > self.app.max_local_bsz:
                return None
            need = self.memory.need(local_bsz)
            if any(
                p.memory and p.memory < need
                for p in self._running_pods().values()
                if p.role in TRAINING_ROLES
            ):
                return None
        else:
            return None
        saved = self._progress
        try:
            self._rates()
        except OutOfTraceError:
            return None
        try:
            for epoch in range(self.app.epoch_at(progress), self.app.max_epochs):
                self._progress = progress
                _, _, _, goodput = self._rates()
                boundary = self.app.epoch_end_progress(epoch)
                t += (boundary - progress) / goodput
                progress = boundary
        finally:
            self._progress = saved
        self._eta = t
        return t


def _gives_replicas(plan: ScalePlan) -> bool:
    """Whether the plan gives the job training replicas: what lets a brain's scheduler
    start (or resume) a job, as opposed to re-tuning one."""
    return (
        bool(plan.placement)
        or any(g.count for r, g in plan.node_group_resources.items() if r in TRAINING_ROLES)
        or any(n.type in TRAINING_ROLES for n in plan.launch_nodes)
    )


def _node_names(pin: Mapping[int, int]) -> str:
    return ", ".join(f"node-{n} ({g} GPUs)" for n, g in sorted(pin.items()))


def _with_resource(pod: PodRequest, resource: NodeResource) -> PodRequest:
    """Apply a plan's resources to a pod: a 0 field means unchanged."""
    return replace(
        pod,
        gpu=resource.gpu_num or pod.gpu,
        cpu=resource.cpu or pod.cpu,
        memory=resource.memory or pod.memory,
    )


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
