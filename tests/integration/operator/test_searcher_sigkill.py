"""Issue 34's done-when: the searcher process (`dlrover-events searcher --env E`, its own
process) killed with SIGKILL 20 times at random moments of an experiment in a virtual env
makes the same trials with the same hyperparameters and the same decisions as a run
without kills (same seed), and creates no trial twice.

The virtual operator runs as fast as possible and its clock waits for the searcher
(operator.trials.wait_for_searcher), so a trial's reports depend only on the decisions it
got, never on when the searcher was dead. The moments are random (a seeded draw): 3 times
in 10 a moment of the searcher's start (0.2 to 1.5 s after it was spawned: its outbox
flushed, its offsets checked, its consumer joining), else once it runs, after 0 or 1 new
decision on the bus and 0 to 200 ms more; a killed searcher is started again at once.

"No trial created twice" is read from what the bus and the env's Postgres hold: every
JobRequest published for a request_id carries the same document (a searcher that
re-decided after a kill would have asked again under the same id with the same document,
or under another id); the operator's job_requests ledger has one row per trial, created;
each trial's job was submitted once, under one uid.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import JOB_EVENTS, JOB_REQUESTS, TRIAL_DECISIONS, TRIAL_METRICS
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from handlers.operator.wiring.modes import run_operator
from schemas.experiments import DecisionKind, ExperimentSubmitted, TrialDecision
from schemas.jobs import JobSubmitted
from schemas.requests import JobRequest
from streams.searcher.runtime.service import run as run_searcher
from tests.conftest import REPO, EnvFactory, cli_environ
from tests.integration.operator.test_virtual_trials import OPERATOR, experiment_document
from tests.integration.tap import DEADLINE_S, Tap

pytestmark = pytest.mark.integration

KILLS = 20
SEED = 34
TRIALS = 24
#: 24 trials, 4 at a time, rungs at 40 and 160 steps: about 60 decisions, enough that 20 kills
#: (at most one decision apart, some during a start) land before the experiment is done.
SEARCHER: dict[str, Any] = {"max_trials": TRIALS, "max_concurrent_trials": 4, "seed": 5}

Decision = tuple[int, str, int | None, float | None, str]


def decisions_of(tap: Tap) -> list[Decision]:
    return sorted(
        {
            (d.seq, d.decision.value, d.trial, d.budget, str(sorted(d.hparams.items())))
            for d in tap.of(TrialDecision)
        }
    )


def done(tap: Tap) -> bool:
    return any(d.decision is DecisionKind.DONE for d in tap.of(TrialDecision))


async def submit(settings: Settings, env: str, name: str) -> None:
    doc = experiment_document(name)
    spec = doc.spec.model_copy(update={"searcher": doc.spec.searcher.model_copy(update=SEARCHER)})
    async with Producer(settings) as producer:
        await producer.publish(
            ExperimentSubmitted(env=env, source="test", experiment=name, spec=spec)
        )


@dataclass
class Killer:
    """Starts `dlrover-events searcher --env E` and kills it with SIGKILL ``kills`` times at
    random moments, starting it again each time."""

    settings: Settings
    pg_dsn: str
    env: str
    tap: Tap
    kills: int
    rng: random.Random
    done_kills: int = 0
    moments: list[str] = field(default_factory=list)
    proc: asyncio.subprocess.Process | None = None
    drains: list[asyncio.Task[None]] = field(default_factory=list)
    #: wall seconds from each spawn to its ready
    starts: list[float] = field(default_factory=list)

    async def start(self) -> asyncio.subprocess.Process:
        environ = {
            **cli_environ(self.settings, self.pg_dsn),
            "DLROVER_EVENTS_SEARCHER_FETCH_WAIT_MS": "20",
            "DLROVER_EVENTS_METRICS_PORT": "0",
            # a killed member leaves the group when its session ends: the next one joins
            # sooner
            "DLROVER_EVENTS_SESSION_TIMEOUT_MS": "1000",
            "DLROVER_EVENTS_HEARTBEAT_INTERVAL_MS": "200",
        }
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from dlrover_events.cli.app import main; main()",
            "searcher",
            "--env",
            self.env,
            cwd=REPO,
            env=environ,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        return self.proc

    async def ready(self, proc: asyncio.subprocess.Process) -> None:
        """Until the searcher says it runs (its consumer assigned)."""
        spawned = asyncio.get_running_loop().time()
        assert proc.stderr is not None
        lines: list[str] = []
        async with asyncio.timeout(DEADLINE_S):
            while True:
                line = (await proc.stderr.readline()).decode()
                if not line:
                    pytest.fail(f"the searcher exited at start: {''.join(lines)[-2000:]}")
                lines.append(line)
                if "is running" in line:
                    break
        self.starts.append(asyncio.get_running_loop().time() - spawned)
        # the rest is drained, so a full pipe never blocks it
        self.drains.append(asyncio.create_task(_drain(proc)))

    async def run(self) -> None:
        while self.done_kills < self.kills and not done(self.tap):
            proc = await self.start()
            if self.rng.random() < 0.3:
                # a moment of its start: its outbox flushed, its offsets checked, its
                # consumer joining
                into = self.rng.uniform(0.2, 1.5)
                await asyncio.sleep(into)
                moment = f"{into:.2f} s into a start"
            else:
                await self.ready(proc)
                wait_for = self.rng.randint(0, 1)
                pause = self.rng.uniform(0.0, 0.2)
                seen = len(decisions_of(self.tap))

                def decided(seen: int = seen, wait_for: int = wait_for) -> bool:
                    return len(decisions_of(self.tap)) >= seen + wait_for or done(self.tap)

                await self.tap.until(decided, f"{wait_for} more decisions")
                await asyncio.sleep(pause)
                moment = f"after {seen}+{wait_for} decisions and {pause:.2f} s"
            if done(self.tap):
                break
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            self.done_kills += 1
            self.moments.append(moment)
        if self.proc is None or self.proc.returncode is not None:
            await self.ready(await self.start())

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 20)
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()
        for drain in self.drains:
            drain.cancel()
        await asyncio.gather(*self.drains, return_exceptions=True)


async def _drain(proc: asyncio.subprocess.Process) -> None:
    assert proc.stderr is not None
    while await proc.stderr.read(65536):
        pass


async def experiment(
    settings: Settings, pg_dsn: str, env: str, *, kills: int = 0
) -> tuple[Tap, Killer | None]:
    """Run the experiment in ``env`` to its done: the operator in this process, the
    searcher here (no kills) or in a process killed ``kills`` times."""
    tap = Tap(settings, env, (TRIAL_DECISIONS, TRIAL_METRICS, JOB_REQUESTS, JOB_EVENTS))
    await tap.start()
    stop = asyncio.Event()
    ctx = ServiceContext(settings, env, pg_dsn, stop=stop)
    tasks = [asyncio.create_task(run_operator(ctx, OPERATOR))]
    killer: Killer | None = None
    try:
        await asyncio.wait_for(ctx.ready.wait(), DEADLINE_S)
        if kills:
            killer = Killer(settings, pg_dsn, env, tap, kills, random.Random(SEED))
        else:
            searcher = ServiceContext(settings, env, pg_dsn, stop=stop)
            tasks.append(asyncio.create_task(run_searcher(searcher)))
            await asyncio.wait_for(searcher.ready.wait(), DEADLINE_S)
        await submit(settings, env, "sweep")
        if killer is not None:
            await killer.run()

        def finished() -> bool:
            for task in tasks:
                if task.done():
                    task.result()
            return done(tap)

        await tap.until(finished, "the experiment's done")
        return tap, killer
    finally:
        if killer is not None:
            await killer.stop()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await tap.stop()


async def test_a_searcher_killed_20_times_decides_as_one_never_killed(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    calm_env, killed_env = (await make_env()).name, (await make_env()).name
    calm, _ = await experiment(settings, pg_dsn, calm_env)
    killed, killer = await experiment(settings, pg_dsn, killed_env, kills=KILLS)
    assert killer is not None
    print(f"{killer.done_kills} kills: {'; '.join(killer.moments)}")
    print(f"starts to ready: {', '.join(f'{s:.1f}' for s in killer.starts)} s")
    assert killer.done_kills == KILLS, (
        f"the experiment was done after {killer.done_kills} kills: {killer.moments}"
    )

    # the same trials with the same hyperparameters, and the same decisions
    expected = decisions_of(calm)
    assert [kind for _, kind, *_ in expected].count("create") == TRIALS
    assert decisions_of(killed) == expected
    # a decision published again (a kill between publishing and forgetting it) is the
    # same decision: one per seq
    by_seq: dict[int, set[str]] = {}
    for d in killed.of(TrialDecision):
        by_seq.setdefault(d.seq, set()).add(d.model_dump_json(exclude={"occurred_at"}))
    assert all(len(copies) == 1 for copies in by_seq.values())

    # no trial created twice: one document per request id, the same as without kills
    def requests(tap: Tap) -> dict[str, set[str]]:
        docs: dict[str, set[str]] = {}
        for r in tap.of(JobRequest):
            docs.setdefault(r.request_id, set()).add(repr(sorted(r.document.items())))
        return docs

    killed_requests, calm_requests = requests(killed), requests(calm)
    assert all(len(docs) == 1 for docs in killed_requests.values())
    assert killed_requests == calm_requests
    assert sorted(killed_requests) == sorted(f"sweep-t{i}" for i in range(TRIALS))
    store = await EnvStore.open(pg_dsn, killed_env, max_size=1)
    try:
        rows = await store.pool.fetch("SELECT request_id, status FROM job_requests")
    finally:
        await store.close()
    creations = [r for r in rows if not r["request_id"].endswith("-del")]
    assert sorted((r["request_id"], r["status"]) for r in creations) == sorted(
        (f"sweep-t{i}", "created") for i in range(TRIALS)
    )
    submitted = [e for e in killed.of(JobSubmitted) if e.job.name.startswith("sweep-t")]
    assert len({e.job.uuid for e in submitted}) == TRIALS
    assert len({e.job.name for e in submitted}) == TRIALS
