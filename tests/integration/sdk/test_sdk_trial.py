"""A trial's side against the real broker: ``Trial`` reads its later decisions on
``<env>.trial.decisions`` (a ``run`` after it started, a ``stop``; a resumed trial's
``resume`` published before it started), and its metrics land on ``<env>.trial.metrics``
as valid events; then the example trial (examples/experiments/train_trial.py) as real
torch processes through a trial's life: promoted in place, paused (SIGTERM), resumed
under torchrun with two ranks from its checkpoint, promoted in place again (both ranks
go on to the same budget) and completed.

The test plays the searcher by publishing its decisions. Waits are bounded by generous
deadlines; nothing asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import TRIAL_METRICS, topic
from dlrover_events.sdk import JobIdentity, Reporter
from dlrover_events.sdk.identity import ENV_ENV, JOB_ID_ENV
from dlrover_events.sdk.trial import Trial, TrialStatus
from dlrover_events.sdk.trial_env import (
    EXPERIMENT_ENV,
    TRIAL_BUDGET_ENV,
    TRIAL_BUDGET_UNIT_ENV,
    TRIAL_ENV,
    TRIAL_HPARAMS_ENV,
)
from dlrover_events.settings import Settings
from schemas.codec import decode
from schemas.experiments import DecisionKind, TrialDecision, TrialMetrics
from tests.conftest import ARTIFACTS, REPO, EnvFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

EXAMPLE = REPO / "examples" / "experiments" / "train_trial.py"
DEADLINE_S = 90.0


def trial_environ(env: str, experiment: str, trial: int, budget: float) -> dict[str, str]:
    return {
        EXPERIMENT_ENV: experiment,
        TRIAL_ENV: str(trial),
        TRIAL_HPARAMS_ENV: json.dumps({"lr": 0.01, "width": 32}),
        TRIAL_BUDGET_ENV: f"{budget:g}",
        TRIAL_BUDGET_UNIT_ENV: "steps",
        JOB_ID_ENV: f"{experiment}-t{trial}",
        ENV_ENV: env,
    }


class Searcher:
    """The test's stand-in for the searcher: its decisions, numbered as it numbers them."""

    def __init__(self, producer: Producer, env: str, experiment: str) -> None:
        self.producer = producer
        self.env = env
        self.experiment = experiment
        self.seq = 0

    async def decide(self, kind: DecisionKind, trial: int, budget: float | None = None) -> None:
        await self.producer.publish(self.decision(kind, trial, budget))
        self.seq += 1

    def decision(self, kind: DecisionKind, trial: int, budget: float | None) -> TrialDecision:
        return TrialDecision(
            env=self.env,
            source="test-searcher",
            experiment=self.experiment,
            seq=self.seq,
            decision=kind,
            trial=trial,
            budget=budget,
            reason=f"the test's {kind.value}",
        )


@asynccontextmanager
async def searcher(settings: Settings, env: str, experiment: str) -> AsyncIterator[Searcher]:
    async with Producer(settings, linger_ms=0) as producer:
        yield Searcher(producer, env, experiment)


async def until(what: str, cond: Callable[[], bool], timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def trial_metrics(settings: Settings, env: str, expect: int) -> list[TrialMetrics]:
    """The reports on the topic, each once (at least once: a resend has the same id)."""
    records = await read_topic(settings, topic(env, TRIAL_METRICS), timeout_s=30, expect=expect)
    events = [decode(r.value) for r in records]  # each decodes and validates
    reports = [e for e in events if isinstance(e, TrialMetrics)]
    assert len(reports) == len(events), events
    assert all(r.key == e.experiment.encode() for r, e in zip(records, reports, strict=True))
    return list({e.event_id: e for e in reports}.values())


async def test_a_trial_follows_a_later_run_then_a_stop_and_its_metrics_land(
    settings: Settings, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    experiment = f"sweep-{uuid.uuid4().hex[:6]}"
    environ = trial_environ(env, experiment, 2, 10)
    reporter = Reporter(JobIdentity.from_env(environ), settings=settings, interval_s=0.2)
    trial = Trial.from_env(environ, reporter=reporter, settings=settings)
    async with searcher(settings, env, experiment) as s:
        await s.decide(DecisionKind.CREATE, 2, 10)
        await asyncio.to_thread(reporter.start)
        await asyncio.to_thread(trial.start)
        try:
            assert trial.budget() == 10 and trial.decision is not None
            assert trial.decision.decision is DecisionKind.CREATE
            assert trial.report_metrics(10, {"val_loss": 0.5}, validation=True)
            assert trial.report_metrics(10, {"train_loss": 0.75})
            waiting = asyncio.create_task(asyncio.to_thread(trial.wait_for_budget, 10, 60))
            await s.decide(DecisionKind.RUN, 3, 99)  # another trial's
            older = s.decision(DecisionKind.STOP, 2, None).model_copy(update={"seq": 0})
            await s.producer.publish(older)  # a seq already read: not news
            await s.decide(DecisionKind.RUN, 2, 40)
            assert await waiting == 40
            assert (trial.budget(), trial.status) == (40, TrialStatus.RUNNING)

            await s.decide(DecisionKind.STOP, 2)
            assert await asyncio.to_thread(trial.wait_for_budget, 40, 60) is None
            assert trial.status is TrialStatus.STOPPED
            assert trial.describe().startswith(f"trial {experiment}-t2: stopped, budget 40")
            assert await asyncio.to_thread(reporter.flush, 10.0)
        finally:
            await asyncio.to_thread(trial.close)
            await asyncio.to_thread(reporter.close)

    reports = await trial_metrics(settings, env, expect=2)
    assert sorted((m.step, m.budget, m.validation, m.metrics) for m in reports) == [
        (10, 10.0, False, {"train_loss": 0.75}),
        (10, 10.0, True, {"val_loss": 0.5}),
    ]
    for m in reports:
        assert (m.env, m.experiment, m.trial, m.key) == (env, experiment, 2, experiment)
        assert m.source == f"sdk/{experiment}-t2/worker-0"


async def test_a_resumed_trial_starts_with_the_budget_it_was_resumed_to_and_reports(
    settings: Settings, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    experiment = f"sweep-{uuid.uuid4().hex[:6]}"
    async with searcher(settings, env, experiment) as s:
        await s.decide(DecisionKind.CREATE, 0, 25)
        await s.decide(DecisionKind.PAUSE, 0)
        await s.decide(DecisionKind.RESUME, 0, 100)
        # a new process of the resumed job: its variables still say 25
        environ = trial_environ(env, experiment, 0, 25)
        trial = Trial.from_env(environ, settings=settings)  # its own reporter
        await asyncio.to_thread(trial.start)
        try:
            assert (trial.budget(), trial.status) == (100.0, TrialStatus.RUNNING)
            assert trial.report_metrics(100, {"val_loss": 0.25}, validation=True)
            # paused again at 100: the wait goes on until the suspension's SIGTERM
            stopping = asyncio.Event()
            waiting = asyncio.create_task(
                asyncio.to_thread(trial.wait_for_budget, 100, 60, stop=stopping.is_set)
            )
            await s.decide(DecisionKind.PAUSE, 0)
            await until("the pause read", lambda: trial.status is TrialStatus.PAUSED)
            assert not waiting.done()
            stopping.set()
            assert await waiting is None
        finally:
            await asyncio.to_thread(trial.close)  # sends what is left of the reports
    (report,) = await trial_metrics(settings, env, expect=1)
    assert (report.trial, report.step, report.metrics) == (0, 100, {"val_loss": 0.25})


class Process:
    """A trial's process (or torchrun with its workers) and its JSON lines."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self.lines: list[dict[str, Any]] = []
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, args: list[str], environ: dict[str, str], log: Path) -> Process:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as err:
            proc = await asyncio.create_subprocess_exec(
                *args,
                env=environ,
                cwd=REPO,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
        return cls(proc, log)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            text = raw.decode(errors="replace").strip()
            if text.startswith("{"):
                self.lines.append(json.loads(text))

    def of(self, event: str, **match: Any) -> list[dict[str, Any]]:
        return [
            line
            for line in self.lines
            if line["event"] == event and all(line.get(k) == v for k, v in match.items())
        ]

    async def wait_for(self, event: str, **match: Any) -> dict[str, Any]:
        await until(f"{event} {match} (log: {self.log})", lambda: bool(self.of(event, **match)))
        return self.of(event, **match)[0]

    async def exit_code(self) -> int:
        async with asyncio.timeout(DEADLINE_S):
            code = await self.proc.wait()
            await self._reader
        return code

    def kill(self) -> None:
        if self.proc.returncode is None:
            os.killpg(self.proc.pid, signal.SIGKILL)


async def test_the_example_trial_is_promoted_paused_resumed_and_completed(
    settings: Settings, make_env: EnvFactory, tmp_path: Path
) -> None:
    env = (await make_env()).name
    experiment = f"sweep-{uuid.uuid4().hex[:6]}"
    every = 10
    environ = {
        **os.environ,
        **trial_environ(env, experiment, 0, 20),
        "DLROVER_EVENTS_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "DLROVER_EVENTS_GATEWAY_URL": "",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    args = [
        str(EXAMPLE),
        f"--validate-every={every}",
        f"--checkpoint-every={every}",
        f"--checkpoint={tmp_path / 'trial.pt'}",
        "--interval-s=0.5",
    ]
    logs = ARTIFACTS / "logs" / "sdk-trial" / experiment
    procs: list[Process] = []
    async with searcher(settings, env, experiment) as s:
        try:
            await s.decide(DecisionKind.CREATE, 0, 20)
            # the first life: alone, promoted in place, then paused
            first = await Process.start([sys.executable, *args], environ, logs / "first.log")
            procs.append(first)
            await first.wait_for("validation", step=20, budget=20.0)
            await s.decide(DecisionKind.RUN, 0, 50)
            await first.wait_for("budget", step=20, budget=50.0)
            await first.wait_for("validation", step=50, budget=50.0)
            await s.decide(DecisionKind.PAUSE, 0)
            first.proc.send_signal(signal.SIGTERM)  # the operator's suspension
            assert await first.exit_code() == 143
            assert first.of("exit")[0]["saved_step"] == 50

            # the second life: torchrun with two ranks, from the checkpoint
            await s.decide(DecisionKind.RESUME, 0, 70)
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            second = await Process.start(
                [*torchrun, "--nproc-per-node=2", *args], environ, logs / "second.log"
            )
            procs.append(second)
            resumed = await second.wait_for("resumed", rank=0)
            last_validated = max(v["step"] for v in first.of("validation"))
            assert last_validated - every <= resumed["step"] <= last_validated
            assert resumed["budget"] == 70.0 and resumed["world_size"] == 2
            await second.wait_for("validation", step=70, budget=70.0)
            await s.decide(DecisionKind.RUN, 0, 90)
            for rank in (0, 1):  # every rank goes on to the same budget
                await second.wait_for("budget", step=70, budget=90.0, rank=rank)
            await second.wait_for("validation", step=90, budget=90.0)
            await s.decide(DecisionKind.COMPLETE, 0)
            assert await second.exit_code() == 0
            assert {(e["rank"], e["reason"], e["step"]) for e in second.of("exit")} == {
                (0, "told", 90),
                (1, "told", 90),
            }
        finally:
            for p in procs:
                p.kill()

    steps = [v["step"] for p in procs for v in p.of("validation")]
    assert steps == list(range(every, 91, every))  # never went back: resumed at 50
    losses = {v["step"]: v["val_loss"] for p in procs for v in p.of("validation")}
    assert losses[90] < losses[10]  # it learned
    reports = await trial_metrics(settings, env, expect=2 * len(steps))
    validations = sorted((m.step, m.metrics["val_loss"]) for m in reports if m.validation)
    assert [step for step, _ in validations] == steps
    assert all(abs(v - losses[step]) < 1e-5 for step, v in validations)
