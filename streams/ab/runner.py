"""Run an A/B test: one virtual env per arm, the same input for all, until every job ends.

An arm in lockstep, or without a brain, is fed its whole input before its services start:
the virtual operator schedules each submission at its own simulated time, so all arms see
the same arrivals however the wall clock jitters. Services are found in the service
registry (the operator lives in handlers/, which streams/ does not import). An arm whose
settings say ``brain: false`` runs without a brain: its jobs keep what they asked for (the
static baseline).

An arm with a brain out of lockstep is fed once its services are ready, paced at its
simulated speed, as a real env gets its submissions: its brain decides on event time, and
a backlog read at once would move its clock to the last submission while the simulated
cluster is still at the first (a cluster scheduler would plan every job at once and count
service that has not happened). The first submission starts both clocks; the operator
starts its clock once it has read it, so the feed leads the simulated clock by that
reading's wall time, never lags it: every job still arrives at its own simulated time.

By default an arm with a brain runs in lockstep with it (schemas.lockstep): its simulated
clock moves a tick at a time, each once its brain has decided it, so the arm's result
depends on its input and settings alone, not on how fast the machine is. An arm without a
brain needs no such wait and runs as fast as possible, which is deterministic already.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.tail import Line
from dlrover_events.bus.tailer import follow
from dlrover_events.bus.topics import JOB_EVENTS, TRIAL_DECISIONS
from dlrover_events.domain.workloads import read_trace
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import cancel_and_wait, end_within, wait_for_any
from dlrover_events.runtime.services import ServiceContext, discover_services
from dlrover_events.settings import Settings
from schemas.control import EnvMode
from schemas.envelope import Event
from schemas.experiments import DecisionKind, ExperimentDocument, TrialDecision
from schemas.jobs import JobSubmitted
from streams.ab.arms import Arm
from streams.ab.experiment import arm_experiment, env_settings_of, experiment_metrics, submitted
from streams.ab.report import ArmResult
from streams.ab.summary import RunInfo
from streams.brain.core.schedulers.registry import SCHEDULERS
from streams.evaluators.ledger import Ledger, gpu_use
from streams.evaluators.registry import evaluate
from streams.evaluators.service import ledger_of
from streams.replay.copier import Replay
from streams.replay.core import DEFAULT_TYPES, Pacer, Selection
from streams.replay.trace import replay_trace

log = logging.getLogger(__name__)

ArmProgress = Callable[[str, int, int], None]  # (arm, finished jobs, expected jobs)

#: What a paced arm gets of `--from` before its services start: the virtual operator reads
#: the runtime samples once, at its start, to simulate jobs of untraced applications.
MEASURED: tuple[str, ...] = ("job.runtime_sample",)


@dataclass
class ArmCluster:
    nodes: int = 16
    gpus_per_node: int = 4
    #: Out of lockstep: simulated seconds per wall second; None: as fast as possible
    #: (for arms without a brain, which could not keep up).
    speed: float | None = 200.0
    #: Arms with a brain tick with it (speed then plays no part); arms without one run as
    #: fast as possible.
    lockstep: bool = True

    @property
    def label(self) -> str:
        """How the clocks moved, as --speed says it: lockstep, NNNx or max."""
        if self.lockstep:
            return "lockstep"
        return "max" if self.speed is None else f"{self.speed:g}x"


@dataclass
class ABTest:
    settings: Settings
    dsn: str
    arms: list[Arm]
    trace: Path | None = None
    source: str | None = None
    cluster: ArmCluster = field(default_factory=ArmCluster)
    timeout_s: float = 1800.0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    keep_envs: bool = False
    poll_s: float = 2.0
    #: An experiment every arm runs (an arm's ``experiment`` section changes it), with
    #: the target and deadline its KPIs are measured against (streams/ab/experiment.py).
    experiment: ExperimentDocument | None = None
    target: float | None = None
    deadline_s: float | None = None
    #: Wall seconds the last run() took, from creating the arms' envs to the verdict.
    wall_s: float | None = field(default=None, init=False)

    def env_settings(self, arm: Arm) -> dict[str, Any]:
        """The arm's settings, with its simulated cluster, which its brain also learns.

        Its operator and its brain are in lockstep both or neither: an operator waiting for
        acknowledgements that no brain sends would wait forever, and a brain waiting for
        barriers that no operator sends would never decide. An arm may opt out with
        ``operator: {lockstep: false}``.
        """
        settings = env_settings_of(arm.settings)
        own = settings.get("operator", {})
        rescale = own.get("rescale_mode") if isinstance(own, dict) else None
        lockstep = _brain(arm) and bool(own.get("lockstep", self.cluster.lockstep))
        if lockstep:
            pace: dict[str, Any] = {}
        elif self.cluster.speed is None or (self.cluster.lockstep and not _brain(arm)):
            pace = {"fast": True}
        else:
            pace = {"speed": self.cluster.speed}
        brain = settings.get("brain", {})
        scheduler = False
        if isinstance(brain, dict):
            gpus = self.cluster.nodes * self.cluster.gpus_per_node
            brain = {"cluster_gpus": gpus, **{k: v for k, v in brain.items() if k != "lockstep"}}
            if lockstep:
                brain["lockstep"] = True
            if isinstance(brain.get("scheduler"), dict):
                # a cluster scheduler owns the arm's GPUs: it schedules the arm's cluster,
                # and the simulated cluster starts no job it did not plan
                scheduler = True
                brain["scheduler"] = {
                    "nodes": self.cluster.nodes,
                    "gpus_per_node": self.cluster.gpus_per_node,
                    **brain["scheduler"],
                }
                priced = _prices_rescales(brain["scheduler"].get("name"))
                if priced and rescale is not None:
                    # the scheduler weighs a reallocation at what the arm's simulated jobs
                    # pay for it (operator.rescale_mode)
                    params = dict(brain["scheduler"].get("params") or {})
                    params.setdefault("rescale_mode", rescale)
                    brain["scheduler"]["params"] = params
        operator = {
            "nodes": self.cluster.nodes,
            "gpus_per_node": self.cluster.gpus_per_node,
            **({"admission": "brain"} if scheduler else {}),
            **pace,
            **own,
            "lockstep": lockstep,
        }
        return {**settings, "brain": brain, "operator": operator}

    async def run(self, progress: ArmProgress | None = None) -> list[ArmResult]:
        if self.trace is not None and self.source is not None:
            raise UserError("an A/B test takes its input from at most one of --trace and --from")
        if self.trace is None and self.source is None and self.experiment is None:
            raise UserError("an A/B test needs an input: --trace, --from or --experiment")
        experiments = (
            {a.name: arm_experiment(self.experiment, a.name, a.settings) for a in self.arms}
            if self.experiment is not None
            else {}
        )
        services = discover_services()
        needed = ["operator", "brain", *(["searcher"] if experiments else [])]
        missing = [s for s in needed if s not in services]
        if set(missing) - {"brain"} or ("brain" in missing and any(_brain(a) for a in self.arms)):
            raise UserError(f"the A/B test needs the {' and '.join(missing)} service(s)")
        started = time.monotonic()
        registry = EnvRegistry(self.settings, self.dsn)
        created: list[str] = []
        stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        feeds: list[asyncio.Task[None]] = []
        try:
            # counted from the input: a paced arm's env holds its submissions only later
            expected = await self._submissions()
            if expected == 0 and not experiments:
                raise UserError("the input holds no job submissions")
            for arm in self.arms:
                env = arm.env(self.run_id)
                await registry.create(env, EnvMode.VIRTUAL, settings=self.env_settings(arm))
                created.append(env)
                if arm.name in experiments:
                    # before the services start: the operator reads it with its backlog,
                    # so the trials begin at the simulated clock's start, however fast
                    # the services come up
                    async with Producer(self.settings) as producer:
                        await producer.publish(submitted(env, experiments[arm.name]))
                if self.feed_speed(arm) is None:
                    await self._feed(env)
                else:
                    await self._prefeed(env)
            contexts = []
            for arm in self.arms:
                names = ["operator", *(["brain"] if _brain(arm) else [])]
                names += ["searcher"] if experiments else []
                for name in names:
                    ctx = ServiceContext(self.settings, arm.env(self.run_id), self.dsn, stop=stop)
                    contexts.append(ctx)
                    tasks.append(asyncio.create_task(services[name].run(ctx), name=name))
            await self._until_ready(contexts, tasks)
            for arm in self.arms:
                if (speed := self.feed_speed(arm)) is not None:
                    env = arm.env(self.run_id)
                    feed = self._paced_feed(env, speed, stop)
                    feeds.append(asyncio.create_task(feed, name=f"feed of {env}"))
            ledgers = await self._until_done(
                expected, tasks, progress, feeds=feeds, experiments=bool(experiments)
            )
        finally:
            stop.set()
            # a paced feed may sleep until its next submission is due: nothing waits for it
            await cancel_and_wait(*feeds)
            await end_within(tasks, 20)
            if not self.keep_envs:
                for env in created:
                    with contextlib.suppress(Exception):
                        await registry.delete(env)
        results = [self._result(arm, ledgers[arm.env(self.run_id)], expected) for arm in self.arms]
        self.wall_s = time.monotonic() - started
        return results

    def run_info(self, *, seed: int = 0) -> RunInfo:
        """What summary.json says about the run itself (after run(): its wall time)."""
        return RunInfo(
            run_id=self.run_id,
            trace=None if self.trace is None else str(self.trace),
            source=self.source,
            speed=self.cluster.label,
            nodes=self.cluster.nodes,
            gpus_per_node=self.cluster.gpus_per_node,
            wall_s=0.0 if self.wall_s is None else self.wall_s,
            seed=seed,
            experiment=None if self.experiment is None else self.experiment.metadata.name,
        )

    def feed_speed(self, arm: Arm) -> float | None:
        """Simulated seconds per wall second at which the arm is fed once its services are
        ready; None: it is fed whole before they start.

        Only an arm with a brain out of lockstep is paced: in lockstep the brain holds
        each submission until its tick, and without a brain nothing decides on event time.
        An arm as fast as possible has no speed to pace at (its clock jumps anyway).
        """
        if not _brain(arm):
            return None
        operator = self.env_settings(arm)["operator"]
        if operator["lockstep"] or operator.get("fast"):
            return None
        return float(operator.get("speed") or 1.0)  # (the operator's default speed)

    async def _submissions(self) -> int:
        """How many jobs the input submits, read from the input itself: a trace's
        submissions as its adapter makes them, or the submissions the source env holds
        now (read before any copy starts, so a copy cannot have fewer)."""
        if self.trace is not None:
            return count_submissions(e for _, e in read_trace(self.trace, "ab-count"))
        if self.source is None:
            return 0  # an experiment alone
        ledger = await ledger_of(self.settings, self.source, [JOB_EVENTS])
        return sum(1 for j in ledger.jobs.values() if j.submitted_at is not None)

    async def _prefeed(self, env: str) -> None:
        """What a paced arm's operator must have before it starts: the runtime samples of
        `--from` (it reads them once, at its start, to simulate untraced jobs)."""
        if self.source is None:
            return
        samples = Selection(types=MEASURED)
        await Replay(self.settings, self.source, env, pacer=Pacer(None), selection=samples).run()

    async def _paced_feed(self, env: str, speed: float, stop: asyncio.Event) -> None:
        """The rest of the input, each record when the arm's simulated clock reaches it
        (its first record starts the clock); it fails the run if it fails."""
        if self.trace is not None:
            await replay_trace(self.settings, self.trace, env, pacer=Pacer(speed), stop=stop)
            return
        assert self.source is not None
        rest = Selection(types=tuple(t for t in DEFAULT_TYPES if t not in MEASURED))
        # (restart: the prefeed's copy committed the same group's offsets past the end)
        replay = Replay(
            self.settings, self.source, env, pacer=Pacer(speed), selection=rest, restart=True
        )
        await replay.run(stop=stop)

    async def _feed(self, env: str) -> int:
        """Copy the whole input into the arm's env at once; returns how many jobs it submits."""
        if self.trace is not None:
            await replay_trace(self.settings, self.trace, env, pacer=Pacer(None))
        elif self.source is None:
            return 0  # an experiment alone: published once the arm's services run
        else:
            await Replay(
                self.settings, self.source, env, pacer=Pacer(None), selection=Selection()
            ).run()
        ledger = await ledger_of(self.settings, env)
        return sum(1 for j in ledger.jobs.values() if j.submitted_at is not None)

    async def _until_ready(
        self, contexts: list[ServiceContext], tasks: list[asyncio.Task[None]]
    ) -> None:
        async with asyncio.timeout(120):
            for ctx, task in zip(contexts, tasks, strict=True):
                if not await wait_for_any([ctx.ready], [task]):
                    task.result()
                    raise UserError(f"service {task.get_name()} of {ctx.env} stopped at start")

    async def _until_done(
        self,
        expected: int,
        tasks: list[asyncio.Task[None]],
        progress: ArmProgress | None,
        *,
        feeds: Sequence[asyncio.Task[None]] = (),
        experiments: bool = False,
    ) -> dict[str, Ledger]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        # Completions are on job.events alone, followed as they come: re-reading the
        # whole topic at every look would cost more the longer the arms run, on the
        # cores the arms share. An experiment's end is its searcher's done.
        watched = {a.env(self.run_id): Ledger() for a in self.arms}
        ended: set[str] = set()
        enough = asyncio.Event()

        def fold_into(env: str, ledger: Ledger) -> Callable[[Line], None]:
            def fold(line: Line) -> None:
                if isinstance(line.event, TrialDecision):
                    if line.event.decision is DecisionKind.DONE:
                        ended.add(env)
                elif line.event is not None:
                    ledger.observe(line.event)

            return fold

        topics = [JOB_EVENTS, *([TRIAL_DECISIONS] if experiments else [])]
        followers = [
            asyncio.create_task(
                follow(
                    self.settings, env, topics, fold_into(env, led), start="earliest", stop=enough
                )
            )
            for env, led in watched.items()
        ]
        try:
            while True:
                for task in [*tasks, *followers]:
                    if task.done():
                        task.result()  # a service (or a follower) that died says why
                        raise UserError(f"service {task.get_name()} stopped during the test")
                for feed in feeds:
                    if feed.done():
                        feed.result()  # a feed that failed fails the run with its reason
                # (an experiment's trials are not the input's jobs)
                finished = {
                    env: sum(1 for j in led.jobs.values() if j.done and j.experiment is None)
                    for env, led in watched.items()
                }
                if progress is not None:
                    for arm in self.arms:
                        progress(arm.name, finished[arm.env(self.run_id)], expected)
                done = all(n >= expected for n in finished.values())
                if experiments:
                    done = done and ended >= set(watched)
                if done or loop.time() > deadline:
                    if loop.time() > deadline:
                        log.warning(
                            "A/B test timed out after %.0f s; reporting what finished",
                            self.timeout_s,
                        )
                    break
                await asyncio.sleep(self.poll_s)
        finally:
            enough.set()
            await asyncio.gather(*followers, return_exceptions=True)
        # The verdict needs every topic: plans and results move GPUs, samples give
        # throughput.
        return {env: await ledger_of(self.settings, env) for env in watched}

    def _result(self, arm: Arm, ledger: Ledger, expected: int) -> ArmResult:
        jobs = ledger.in_window(None, None)
        # The compared JCTs are the input's jobs'; an experiment's trials have its KPIs.
        inputs = [j for j in jobs if j.experiment is None]
        jct = {j.job: v for j in inputs if (v := j.jct_s()) is not None and not j.failed}
        metrics = evaluate(jobs, ledger.last_event_at)
        if self.experiment is not None:
            metrics |= experiment_metrics(jobs, target=self.target, deadline_s=self.deadline_s)
        return ArmResult(
            name=arm.name,
            env=arm.env(self.run_id),
            settings_source=arm.source,
            jct=jct,
            metrics=metrics,
            gpu_use=gpu_use(jobs, step_s=300.0),
            unfinished=max(0, expected - sum(1 for j in inputs if j.done)),
        )


def count_submissions(events: Iterable[Event]) -> int:
    """The jobs the events submit (a job submitted twice counts once, as in a ledger)."""
    return len({e.job.uuid for e in events if isinstance(e, JobSubmitted)})


def _prices_rescales(scheduler: object) -> bool:
    """Whether the named scheduler prices a reallocation by the jobs' rescale mode."""
    spec = SCHEDULERS.get(str(scheduler))
    return spec is not None and "rescale_mode" in spec.params.model_fields


def _brain(arm: Arm) -> bool:
    return arm.settings.get("brain", True) is not False
