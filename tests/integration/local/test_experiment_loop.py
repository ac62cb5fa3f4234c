"""An experiment's trials share this machine with an ordinary job (issue 34's first
done-when): the local platform with 4 slots, the env's brain running goodput-cluster, the
searcher and the experiments recorder in this process, and a 16-trial ASHA experiment of
the example trial (examples/experiments/mlp-sweep.yaml: an MLP whose held-out loss depends
on its learning rate and width) created with `experiment create` while the elastic
example job trains. The experiment runs to its end and the job completes.

Checked from the processes, not from the searcher's view:

- never more than 4 slots in use: the training workers of the trials and of the job,
  counted with psutil every 0.2 s (torchrun's agents are not workers);
- a paused trial holds none: after each ``pause``, the workers of the life it paused are
  gone before any other worker of its job starts; once gone, none runs until its
  ``resume``, and none runs while the job is held (the platform's job state, sampled with
  the processes); the paused life left by the suspension's SIGTERM (or as told, when the
  searcher stopped the trial before its suspension came) with its checkpoint saved;
- a promoted trial goes on from its checkpoint: each ``resumed`` line its workers print
  (their pod logs, kept by the local platform under ``pods/`` and ``logs/``) is at most
  one checkpoint interval behind the last step its trial validated before;
- the best trial (the ``done`` decision's and `experiment describe`'s) is the one whose
  stored validation metric (the recorder's ``trial_metrics``) is best, and every
  validation a trial printed is stored, with the value it printed;
- every trial was created once (one job, one uid), every hold and release the searcher
  asked for was answered and none failed, and nothing went to the DLQ.

The same experiment with ``random`` and ``grid`` ends too, beside the same job and
under the same checks (test_experiment_loop_random_grid.py: a file of their own, so that
pytest-xdist's --dist loadfile can run them on the other worker than ASHA's run); they
are smaller (4 trials to 100 steps, where ASHA has 16 to 400), and they pause no trial
(each trial runs to the budget and completes), so only the ASHA run checks pauses and
resumes.

The job is submitted first and trains by the time the experiment is created, so the
trials come to a machine it already uses.

Real parts: the test broker and Postgres, the operator, the brain, the searcher, the
recorder, torchrun agents and torch workers. Waits are bounded by generous deadlines;
nothing asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from dlrover_events.bus.topics import DLQ, EXPERIMENTS, JOB_REQUESTS, TRIAL_DECISIONS
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.sdk.identity import JOB_NAME_ENV
from dlrover_events.store import EnvStore
from handlers.operator.document.trainingjob import ANN_WORKDIR
from handlers.operator.local.bench import worker_lines
from handlers.operator.local.cluster import LocalCluster
from handlers.operator.platform.bodies import JobView
from schemas.codec import decode
from schemas.dlq import DeadLetter
from schemas.experiments import DecisionKind, TrialDecision, trial_job_name
from schemas.jobs import JobCompleted, JobFailed, NodeStarted, RuntimeSample
from schemas.plans import ScalePlan, ScaleResult, ScaleStatus
from schemas.requests import JobRequestResult, JobRequestStatus
from streams.brain.runtime.app import Brain
from streams.searcher import recorder
from streams.searcher.runtime import service as searcher
from streams.searcher.runtime.step import SOURCE as SEARCHER
from streams.searcher.trials import plan_id
from tests.conftest import ARTIFACTS, run_cli
from tests.integration.local.conftest import Local
from tests.integration.local.test_elastic_loop import ROOT, example_job
from tests.integration.tap import Tap

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

SLOTS = 4
DEADLINE_S = 900.0
SAMPLE_EVERY_S = 0.2
SWEEP = ROOT / "examples" / "experiments" / "mlp-sweep.yaml"
TRIAL_PROGRAM = "examples/experiments/train_trial.py"
JOB_PROGRAM = "examples/elastic/train_elastic.py"
#: the trial's checkpoint interval (mlp-sweep.yaml's --checkpoint-every)
CHECKPOINT_EVERY = 25
#: the ordinary job: 2 workers for about 400 steps at 0.05 s (it overlaps the first rungs)
JOB_NAME, JOB_WORKERS, JOB_STEPS = "plain", 2, 400
HELD = "Held"


@dataclass(frozen=True)
class Search:
    searcher: str
    trials: int
    budget: int
    #: counts of a grid's real-valued hyperparameters (None: sampled)
    grid: bool = False


SEARCHES = {
    "asha": Search("asha", 16, 400),
    "random": Search("random", 4, 100),
    "grid": Search("grid", 4, 100, grid=True),
}


# -- the bus, with when each event was read ------------------------------------------------


class TimedTap(Tap):
    """A tap that notes when it read each event (this machine's clock, as the workers'
    JSON lines and the process samples are)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_at: dict[Any, float] = {}

    async def _read(self) -> None:
        while True:
            batch = await self._consumer.getmany(timeout_ms=100)
            now = time.time()
            for records in batch.values():
                for record in records:
                    event = decode(record.value)
                    self.events.append(event)
                    self.read_at.setdefault(event.event_id, now)


# -- the processes ------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    at: float
    #: job name -> the pids of its training workers
    workers: dict[str, frozenset[int]]
    #: the jobs held by their owner (suspended, admission reason Held)
    held: frozenset[str]

    @property
    def used(self) -> int:
        return sum(len(p) for p in self.workers.values())


def _workers(workdir: Path) -> dict[str, frozenset[int]]:
    """The training workers of this test's jobs (not their torchrun agents), by the job
    their pod belongs to: processes whose program is a trial's or the job's, run where
    the jobs were submitted."""
    found: dict[str, set[int]] = {}
    for p in psutil.process_iter(["cmdline", "cwd"]):
        cmd = p.info.get("cmdline") or []
        cwd = p.info.get("cwd") or ""
        if len(cmd) < 2 or not cwd.startswith(str(workdir)):
            continue
        if not (cmd[1].endswith(TRIAL_PROGRAM) or cmd[1].endswith(JOB_PROGRAM)):
            continue
        with contextlib.suppress(psutil.Error):
            job = p.environ().get(JOB_NAME_ENV, "?")
            found.setdefault(job, set()).add(p.pid)
    return {job: frozenset(pids) for job, pids in found.items()}


async def _held(cluster: LocalCluster) -> frozenset[str]:
    jobs, _ = await cluster.list_jobs()
    return frozenset(
        j.name
        for j in jobs
        if isinstance(j, JobView)
        and j.suspended
        and j.admission is not None
        and j.admission.reason == HELD
    )


async def _watch(
    workdir: Path, cluster: LocalCluster, out: list[Sample], stop: asyncio.Event
) -> None:
    while not stop.is_set():
        held = await _held(cluster)
        workers = await asyncio.to_thread(_workers, workdir)
        out.append(Sample(time.time(), workers, held))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)


# -- what the workers printed --------------------------------------------------------------

_POD = re.compile(r"^(?P<job>.+)-worker-\d+$")


def printed(root: Path, kinds: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    """The JSON lines of ``kinds`` every worker printed, live pods' and kept logs', by the
    job of the pod, in the order printed."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    for line in worker_lines([*root.glob("pods/*/log"), *root.glob("logs/*.log")], kinds):
        match = _POD.match(line["pod"])
        if match:
            by_job.setdefault(match["job"], []).append(line)
    for lines in by_job.values():
        lines.sort(key=lambda x: x["time"])
    return by_job


# -- the experiment ------------------------------------------------------------------------


def experiment_file(tmp_path: Path, name: str, search: Search, workdir: Path) -> Path:
    """examples/experiments/mlp-sweep.yaml as this run uses it: its name, searcher,
    trials and budget, its trials run where the test's workdir is."""
    doc: dict[str, Any] = yaml.safe_load(SWEEP.read_text())
    doc["metadata"]["name"] = name
    searcher_spec = doc["spec"]["searcher"]
    searcher_spec["name"] = search.searcher
    searcher_spec["max_trials"] = search.trials
    searcher_spec["budget"]["max"] = search.budget
    if search.searcher != "asha":
        for knob in ("divisor", "max_rungs"):
            searcher_spec.pop(knob, None)
    if search.grid:
        for hp in doc["spec"]["hyperparameters"].values():
            hp["count"] = 2
    meta = doc["spec"]["trial"].setdefault("metadata", {})
    meta.setdefault("annotations", {})[ANN_WORKDIR] = str(workdir)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def ordinary_job() -> dict[str, Any]:
    body = example_job(JOB_NAME, JOB_WORKERS)
    worker = body["spec"]["roles"]["worker"]
    worker["minReplicas"] = worker["maxReplicas"] = JOB_WORKERS
    command = worker["elastic"]["command"]
    command[command.index("--steps=100000")] = f"--steps={JOB_STEPS}"
    return body


async def until(what: str, check: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    while loop.time() < deadline:
        got = check()
        if isinstance(got, Awaitable):
            got = await got
        if got:
            return got
        await asyncio.sleep(0.5)
    raise AssertionError(f"no {what} within {deadline_s:.0f}s")


@dataclass
class Services:
    """The env's searcher and experiments recorder, in this process."""

    contexts: list[ServiceContext] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self, local: Local) -> None:
        for run in (searcher.run, recorder.run):
            ctx = ServiceContext(local.settings, local.env, local.pg_dsn)
            task = asyncio.create_task(run(ctx))
            self.contexts.append(ctx)
            self.tasks.append(task)
            ready = asyncio.create_task(ctx.ready.wait())
            await asyncio.wait([task, ready], timeout=120, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                task.result()
            assert ready.done(), f"{run.__module__} did not get ready"

    async def stop(self) -> None:
        for ctx in self.contexts:
            ctx.stop.set()
        for task in self.tasks:
            await asyncio.wait_for(task, 120)


async def stored_validations(
    local: Local, experiment: str, metric: str
) -> dict[int, dict[int, float]]:
    """trial -> step -> the metric, as the recorder stored the trials' validations."""
    async with await EnvStore.open(local.pg_dsn, local.env, max_size=1) as store:
        rows = await store.pool.fetch(
            "SELECT trial, step, (metrics ->> $2)::float8 AS v FROM trial_metrics"
            " WHERE experiment = $1 AND validation AND metrics ? $2",
            experiment,
            metric,
        )
    out: dict[int, dict[int, float]] = {}
    for r in rows:
        out.setdefault(r["trial"], {})[r["step"]] = r["v"]
    return out


async def describe(local: Local, experiment: str) -> dict[str, Any]:
    code, out, err = await run_cli(
        local.settings,
        local.pg_dsn,
        "experiment",
        "describe",
        experiment,
        "--env",
        local.env,
        "--json",
    )
    assert code == 0, err
    described: dict[str, Any] = json.loads(out)
    return described


@pytest.mark.parametrize("which", ["asha"])
async def test_an_experiment_shares_four_slots_with_a_job(
    local: Local, tmp_path: Path, which: str
) -> None:
    await an_experiment_shares_four_slots_with_a_job(local, tmp_path, which)


async def an_experiment_shares_four_slots_with_a_job(
    local: Local, tmp_path: Path, which: str
) -> None:
    """The run and its checks for the search ``which`` of SEARCHES (the other searches'
    tests call it from their own file)."""
    search = SEARCHES[which]
    name = f"sweep-{which}"
    registry = EnvRegistry(local.settings, local.pg_dsn)
    await registry.change_settings(
        local.env,
        lambda doc: {
            **doc,
            "brain": {
                **doc.get("brain", {}),
                "scheduler": {
                    "name": "goodput-cluster",
                    "nodes": 1,
                    "gpus_per_node": SLOTS,
                    "interval_s": 2,
                },
            },
        },
    )
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "examples").symlink_to(ROOT / "examples")
    said = ARTIFACTS / "logs" / "experiment-loop" / f"{which}.services.log"
    said.parent.mkdir(parents=True, exist_ok=True)
    logs = contextlib.ExitStack()
    logs.enter_context(_services_log(said))
    bus = TimedTap(local.settings, local.env, (TRIAL_DECISIONS, JOB_REQUESTS, EXPERIMENTS, DLQ))
    await bus.start()
    brain = Brain(local.settings, local.env, local.pg_dsn, checkpoint_every_s=1)
    await brain.start()
    services = Services()
    await services.start(local)
    ctx, task = await local.start_operator(slots=SLOTS)
    samples: list[Sample] = []
    stop_watch = asyncio.Event()
    watcher = asyncio.create_task(_watch(workdir, local.cluster(), samples, stop_watch))
    started = time.time()
    try:
        # the job first, training by the time the trials come: they share the slots left
        job_uid = (await local.submit(ordinary_job(), workdir)).uid
        await until(
            "the ordinary job to train",
            lambda: any(s.job.uuid == job_uid for s in local.tap.of(RuntimeSample)),
        )
        code, _, err = await run_cli(
            local.settings,
            local.pg_dsn,
            "experiment",
            "create",
            str(experiment_file(tmp_path, name, search, workdir)),
            "--env",
            local.env,
        )
        assert code == 0, err

        def decisions() -> list[TrialDecision]:
            return sorted(
                (d for d in bus.of(TrialDecision) if d.experiment == name), key=lambda d: d.seq
            )

        def done() -> TrialDecision | None:
            return next((d for d in decisions() if d.decision is DecisionKind.DONE), None)

        finished = await until(f"the {search.searcher} experiment's end", done)
        trial_jobs = {trial_job_name(name, i) for i in range(search.trials)}

        def ended(job: str) -> bool:
            """Its job completed or failed, or it is held with no worker left."""
            if any(e.job.name == job for e in local.tap.of(JobCompleted) + local.tap.of(JobFailed)):
                return True
            last = samples[-1] if samples else None
            return last is not None and job in last.held and not last.workers.get(job)

        await until("every trial's job to end", lambda: all(ended(j) for j in trial_jobs))
        end = await until(
            "the ordinary job to end",
            lambda: next(
                (
                    e
                    for e in [*local.tap.of(JobCompleted), *local.tap.of(JobFailed)]
                    if e.job.uuid == job_uid
                ),
                None,
            ),
        )
        assert isinstance(end, JobCompleted), end
        await until("every worker to be gone", lambda: samples and not samples[-1].workers)
        metric = "val_loss"
        described = await until(
            "the experiment stored as completed",
            lambda: _completed(local, name),
        )
        elapsed = time.time() - started
        stop_watch.set()
        await watcher

        # -- what was decided and what ran --------------------------------------------
        mine = decisions()
        assert [d.seq for d in mine] == list(range(len(mine))), "a decision missing or twice"
        kinds = [d.decision for d in mine]
        creates = [d for d in mine if d.decision is DecisionKind.CREATE]
        pauses = [d for d in mine if d.decision is DecisionKind.PAUSE]
        resumes = [d for d in mine if d.decision is DecisionKind.RESUME]
        assert sorted(d.trial or 0 for d in creates) == list(range(search.trials)), creates
        lines = printed(local.root, ("trial", "resumed", "validation", "budget", "exit"))
        assert trial_jobs <= set(lines), sorted(set(lines))
        most = max(s.used for s in samples)
        together = sum(JOB_NAME in s.workers and bool(set(s.workers) & trial_jobs) for s in samples)
        job_stops = sum(x["event"] == "exit" and x["reason"] == "sigterm" for x in lines[JOB_NAME])
        print(
            f"{which}: {len(creates)} trials, {len(pauses)} pauses, {len(resumes)} resumes,"
            f" {kinds.count(DecisionKind.RUN)} runs in place, {kinds.count(DecisionKind.STOP)}"
            f" stops, {kinds.count(DecisionKind.COMPLETE)} completed; at most {most} slots"
            f" in use ({len(samples)} samples, {together} with the job's and trials' workers"
            f" at once; {job_stops} SIGTERM exits of the job's workers);"
            f" {finished.reason}; {elapsed:.0f} s"
        )

        # Every trial created once: one creation answered, one job uid, on every node.
        answers = [
            r
            for r in bus.of(JobRequestResult)
            if r.owner == name and r.status is JobRequestStatus.CREATED
        ]
        uids = {r.name: r.job.uuid for r in answers if r.job is not None}
        assert set(uids) == trial_jobs and len(set(uids.values())) == len(uids), uids
        for node in local.tap.of(NodeStarted):
            if node.job.name in trial_jobs:
                assert node.job.uuid == uids[node.job.name], (node.job, uids)
        assert not bus.of(DeadLetter), [(d.consumer_group, d.error) for d in bus.of(DeadLetter)]
        # Every hold and release the searcher asked for was answered, none failed (a
        # suspend that waited for the pods of a trial that had exited 0 failed after its
        # grace period and margin, holding up every plan of the env meanwhile).
        mine_plans = {p.plan_id for p in local.tap.of(ScalePlan) if p.source == SEARCHER}

        def answers_to_mine() -> dict[str, ScaleResult]:
            return {r.plan_id: r for r in local.tap.of(ScaleResult) if r.plan_id in mine_plans}

        await until(
            "an answer to every plan of the searcher",
            lambda: set(answers_to_mine()) == mine_plans,
            120,
        )
        answered = answers_to_mine()
        failed = [
            (r.job.name, r.reason) for r in answered.values() if r.status is ScaleStatus.FAILED
        ]
        assert not failed, failed

        # Never more than the slots, trials and the job together.
        assert 0 < most <= SLOTS, [s for s in samples if s.used > SLOTS][:3]
        # The trials ran while the job was in the queue (training, or suspended by the
        # cluster scheduler for them: its choice, as is whether they train at once).
        job_done = end.occurred_at.timestamp()
        assert any(s.at < job_done and set(s.workers) & trial_jobs for s in samples), (
            "no trial ran before the job completed"
        )

        # A held job starts no worker: while the platform says it is held, its workers
        # are at most those it had before (leaving).
        for prev, s in itertools.pairwise(samples):
            for job in s.held:
                assert s.workers.get(job, frozenset()) <= prev.workers.get(job, frozenset()), (
                    job,
                    prev,
                    s,
                )
        # A paused trial holds none.
        for pause in pauses:
            _holds_none(pause, name, mine, samples, lines, local, bus)
        # A promoted trial goes on from its checkpoint.
        for resume in resumes:
            assert resume.trial is not None
            job = trial_job_name(name, resume.trial)
            at = resume.occurred_at.timestamp()
            resumed = [x for x in lines[job] if x["event"] == "resumed" and x["time"] > at]
            assert resumed, f"{job} was resumed by the searcher and never ran again"
        for job in trial_jobs:
            for i, x in enumerate(lines[job]):
                if x["event"] != "resumed" or x["rank"] != 0:
                    continue
                validated = [v["step"] for v in lines[job][:i] if v["event"] == "validation"]
                assert validated, (job, x)
                assert x["step"] >= validated[-1] - CHECKPOINT_EVERY, (job, x, validated[-3:])
        if search.searcher == "asha":
            assert pauses and resumes, kinds  # (a run that pauses none checks nothing here)

        # The best trial is the one whose stored validation metric is best.
        stored = await stored_validations(local, name, metric)
        for i in range(search.trials):
            seen = {
                x["step"]: x["val_loss"]
                for x in lines[trial_job_name(name, i)]
                if x["event"] == "validation"
            }
            assert set(seen) <= set(stored.get(i, {})), (i, sorted(seen), sorted(stored.get(i, {})))
            for step, value in seen.items():
                assert stored[i][step] == pytest.approx(value, rel=1e-5, abs=1e-6), (i, step)
        best_value, best = min((min(v.values()), t) for t, v in stored.items())
        assert f"best: trial {best}," in finished.reason, (best, best_value, finished.reason)
        assert described["best_trial"]["trial"] == best, (described["best_trial"], best)
        assert described["best_trial"]["value"] == pytest.approx(best_value)
        if search.searcher != "asha":
            assert kinds.count(DecisionKind.COMPLETE) == search.trials, kinds
    finally:
        stop_watch.set()
        await watcher
        _keep_logs(local.root, which, bus, local.tap, samples)
        ctx.stop.set()
        await asyncio.wait_for(task, 240)
        await services.stop()
        await brain.stop()
        await bus.stop()
        logs.close()


@contextlib.contextmanager
def _services_log(path: Path) -> Iterator[None]:
    """What the operator, the brain, the searcher and the recorder log at INFO, in
    ``path`` (beside the pods' logs): the story of a failed run."""
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    loggers = [logging.getLogger(n) for n in ("handlers", "streams", "dlrover_events")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.INFO)
        lg.addHandler(handler)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)
        handler.close()


def _keep_logs(root: Path, which: str, bus: TimedTap, operator: Tap, samples: list[Sample]) -> None:
    """The pods' logs, the searcher's decisions, the plans with their results and the
    samples where they changed, kept where a failed run can be read after pytest removed
    its temporary directories."""
    kept = ARTIFACTS / "logs" / "experiment-loop" / which
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    results = {r.plan_id: r for r in operator.of(ScaleResult)}
    with (kept / "plans.jsonl").open("w") as out:
        for p in sorted(operator.of(ScalePlan), key=lambda p: p.occurred_at):
            result = results.get(p.plan_id)
            group = p.node_group_resources.get("worker")
            row = {
                "at": p.occurred_at.timestamp(),
                "job": p.job.name,
                "source": p.source,
                "suspend": p.suspend,
                "hold": p.hold,
                "workers": None if group is None else group.count,
                "result": None if result is None else result.status.value,
                "result_at": None if result is None else result.occurred_at.timestamp(),
                "why": None if result is None else result.reason,
            }
            out.write(json.dumps(row) + "\n")
    with (kept / "samples.jsonl").open("w") as out:
        last: tuple[Any, ...] | None = None
        for sample in samples:
            now = (sorted((j, len(p)) for j, p in sample.workers.items()), sorted(sample.held))
            if now != last:
                row = {"at": sample.at, "workers": dict(now[0]), "held": now[1]}
                out.write(json.dumps(row) + "\n")
                last = now
    with (kept / "decisions.jsonl").open("w") as out:
        for d in sorted(bus.of(TrialDecision), key=lambda d: d.seq):
            fields = d.model_dump(mode="json", include={"seq", "decision", "trial", "budget"})
            read = {"read_at": bus.read_at.get(d.event_id), "reason": d.reason}
            out.write(json.dumps({**fields, **read}) + "\n")
    for log in [*root.glob("pods/*/log"), *root.glob("logs/*.log")]:
        name = f"{log.parent.name}.live.log" if log.name == "log" else log.name
        with contextlib.suppress(OSError):
            shutil.copyfile(log, kept / name)


async def _completed(local: Local, name: str) -> dict[str, Any] | None:
    described = await describe(local, name)
    return described if described["status"] == "completed" else None


def _holds_none(
    pause: TrialDecision,
    experiment: str,
    decisions: list[TrialDecision],
    samples: list[Sample],
    lines: dict[str, list[dict[str, Any]]],
    local: Local,
    bus: TimedTap,
) -> None:
    """After ``pause``, the workers of the life it paused are gone before any other of
    its job's starts, and none runs from then until its resume (or the end), nor while
    the platform says the job is held."""
    assert pause.trial is not None
    job = trial_job_name(experiment, pause.trial)
    paused_at = bus.read_at[pause.event_id]
    later = [
        d
        for d in decisions
        if d.trial == pause.trial and d.seq > pause.seq and d.decision is DecisionKind.RESUME
    ]
    resumed_at = bus.read_at[later[0].event_id] if later else float("inf")
    # the hold was applied: the platform suspended the job
    result = next((r for r in local.tap.of(ScaleResult) if r.plan_id == plan_id(pause)), None)
    assert result is not None and result.status is ScaleStatus.APPLIED, (job, result)
    before = [s for s in samples if s.at < paused_at]
    life = frozenset().union(*(s.workers.get(job, frozenset()) for s in before[-25:]))
    assert life, f"{job}: no worker seen before its pause"
    after = [s for s in samples if s.at >= paused_at]
    gone = next((s for s in after if not (s.workers.get(job, frozenset()) & life)), None)
    assert gone is not None, f"{job}: its workers never left after its pause"
    for s in after:
        if s.at >= gone.at:
            break
        assert s.workers.get(job, frozenset()) <= life, (job, "a new life before the old left")
    for s in after:
        if gone.at <= s.at < resumed_at:
            assert not s.workers.get(job), (job, "a worker while paused", s)
    # the paused life left as the suspension's SIGTERM asks (143), its checkpoint saved at
    # its last validation; or, stopped by the searcher before the suspension came, it
    # exited as told (0) at its budget
    stopped = any(
        d.trial == pause.trial and d.seq > pause.seq and d.decision is DecisionKind.STOP
        for d in decisions
    )
    exits = [
        x
        for x in lines.get(job, [])
        if x["event"] == "exit"
        and x["rank"] == 0
        and pause.occurred_at.timestamp() <= x["time"] <= gone.at
    ]
    assert exits, (job, "no exit line after its pause")
    assert exits[0]["reason"] == "sigterm" or (stopped and exits[0]["reason"] == "told"), (
        job,
        exits[0],
    )
    validated = [
        x["step"]
        for x in lines[job]
        if x["event"] == "validation" and x["time"] <= exits[0]["time"]
    ]
    assert exits[0]["saved_step"] == validated[-1], (job, exits[0], validated[-3:])
