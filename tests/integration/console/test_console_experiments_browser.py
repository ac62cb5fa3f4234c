"""The console's experiment pages in headless Chromium, on a real broker and Postgres with
the experiments recorder running: a recorded ASHA experiment (its submission, its
searcher's decisions, its trials' validation reports, published on the env's bus) is
listed, and its page shows every trial's learning curve, the rungs, the best trial and its
hyperparameters and what each trial was told; pause, activate and kill clicked there are
ExperimentActions on the env's bus, and only an admin token may: a read-only token sees
the same page without a button, and the API refuses it (403) and publishes nothing.

"Nothing was published" is checked without a clock: a marker action keyed by the
experiment is published after the refused call, so a tap that read the marker read
everything published before it under that key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest

from dlrover_events.bus.topics import EXPERIMENTS
from dlrover_events.envs.tokens import Scope
from dlrover_events.experiments.store import ExperimentStore
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import create_pool, env_schema
from schemas.envelope import Event
from schemas.experiments import (
    DecisionKind,
    ExperimentAction,
    ExperimentActionKind,
    ExperimentSpec,
    ExperimentSubmitted,
    TrialDecision,
    TrialMetrics,
)
from streams.searcher import recorder
from tests.conftest import ARTIFACTS
from tests.integration.console.conftest import Browser, BrowserFactory, Console
from tests.integration.gateway.conftest import mint
from tests.integration.tap import Tap
from tests.unit.experiments.documents import document

pytestmark = pytest.mark.integration

NAME = "lr-sweep"
#: trial -> (its learning rate, its validation loss at budgets 1 and 4)
TRIALS = {0: (0.1, 0.9, 0.6), 1: (0.01, 0.5, 0.3), 2: (0.001, 0.8, None), 3: (0.03, 0.7, None)}


def recorded(env: str) -> list[Event]:
    """An ASHA experiment as its searcher and trials left it: four trials created at rung
    0 (budget 1), the two best promoted to rung 1 (budget 4), the others paused."""
    spec = ExperimentSpec.model_validate(
        document(NAME, max_trials=4, budget={"unit": "steps", "max": 16})["spec"]
    )
    events: list[Event] = [ExperimentSubmitted(env=env, source="cli", experiment=NAME, spec=spec)]
    seq = iter(range(100))

    def told(kind: DecisionKind, trial: int, **more: object) -> TrialDecision:
        return TrialDecision.model_validate(
            {"env": env, "source": "searcher", "experiment": NAME, "seq": next(seq),
             "decision": kind, "trial": trial, **more}
        )  # fmt: skip

    def validated(trial: int, budget: float, loss: float) -> TrialMetrics:
        return TrialMetrics(
            env=env, source="trial", experiment=NAME, trial=trial, step=int(budget * 100),
            budget=budget, validation=True, metrics={"val_loss": loss},
        )  # fmt: skip

    for trial, (lr, _, _) in TRIALS.items():
        events.append(told(DecisionKind.CREATE, trial, hparams={"lr": lr}, budget=1, rung=0))
    for trial, (_, at_1, _) in TRIALS.items():
        events.append(validated(trial, 0.5, at_1 + 0.2))
        events.append(validated(trial, 1, at_1))
    for trial, (_, _, at_4) in TRIALS.items():
        if at_4 is None:
            events.append(told(DecisionKind.PAUSE, trial, rung=0, reason="not in the top 1/4"))
        else:
            events.append(told(DecisionKind.RUN, trial, budget=4, rung=1, reason="promoted"))
    for trial, (_, _, at_4) in TRIALS.items():
        if at_4 is not None:
            events.append(validated(trial, 2, at_4 + 0.1))
            events.append(validated(trial, 4, at_4))
    return events


#: validation points of the curves: 2 per trial at rung 0, 2 more per promoted trial
POINTS = 2 * len(TRIALS) + 2 * sum(1 for t in TRIALS.values() if t[2] is not None)
DECISIONS = 2 * len(TRIALS)


@dataclass
class Recorded:
    console: Console
    store: ExperimentStore
    tap: Tap
    admin: str


@pytest.fixture
async def recorded_console(
    console: Console, settings: Settings, pg_dsn: str
) -> AsyncIterator[Recorded]:
    """The console of an env whose recorder has stored the experiment of `recorded`."""
    env = console.env
    admin = await mint(pg_dsn, env, Scope.ADMIN)
    ctx = ServiceContext(settings, env, pg_dsn)
    recording = asyncio.create_task(recorder.run(ctx))
    pool = await create_pool(pg_dsn, env_schema(env), max_size=2)
    tap = Tap(settings, env, (EXPERIMENTS,))
    await tap.start()
    try:
        await console.producer.publish_many(recorded(env))
        store = ExperimentStore(pool)
        async with asyncio.timeout(60):
            while True:
                if await store.exists(NAME):
                    seen = await store.describe(NAME)
                    stored = sum(t["validations"] for t in seen["trials"])
                    told = sum(len(t["decisions"]) for t in seen["trials"])
                    if (stored, told) == (POINTS, DECISIONS):
                        break
                await asyncio.sleep(0.1)
        yield Recorded(console, store, tap, admin)
    finally:
        await tap.stop()
        ctx.stop.set()
        await recording
        await pool.close()


def console_actions(tap: Tap) -> list[ExperimentAction]:
    return [e for e in tap.of(ExperimentAction, NAME) if e.source == "console"]


async def status_is(r: Recorded, status: str) -> None:
    async with asyncio.timeout(60):
        while True:
            if (await r.store.status(NAME)).value == status:
                return
            await asyncio.sleep(0.1)


async def click_action(b: Browser, action: str) -> None:
    button = f'#experiment-actions button.action[data-action="{action}"]'
    await b.wait(button)
    await b.do("click", sel=button)
    await b.wait("#experiment-result.applied")


async def test_an_experiments_page_shows_its_curves_rungs_best_trial_and_decisions(
    recorded_console: Recorded, open_browser: BrowserFactory
) -> None:
    r = recorded_console
    c = r.console
    b = await open_browser()
    await b.do("goto", url=f"{c.url}#token={c.token}")  # a read-only token
    await b.wait("#status.live")
    await b.do("click", sel='#tabs a[data-view="experiments"]')
    row = f'#experiments tr[data-experiment="{NAME}"]'
    await b.wait(row)
    cells = await b.do("texts", sel=f"{row} td")
    assert cells[:6] == [NAME, "active", "asha", "val_loss \u2193", "4 / 4", "trial 1"], cells
    assert cells[6] == "0.3", cells
    await b.do("click", sel=f"{row} a.job-link")

    # every trial's curve, on the budget axis, the rungs' budgets and the best trial
    chart = f'#chart-curves[data-points="{POINTS}"]'
    await b.wait(chart)
    got = await b.do("eval", js="() => ({...document.getElementById('chart-curves').dataset})")
    assert (got["trials"], got["rungs"], got["best"]) == ("0,1,2,3", "1,4", "1"), got
    legend = await b.do("texts", sel="#chart-curves .u-legend .u-series .u-label")
    assert legend == ["budget", "trial 0", "trial 1", "trial 2", "trial 3"], legend
    # the curves drawn are the reports: uPlot's data, point for point
    drawn = await b.do(
        "eval",
        js="""() => {
            const u = state.curves;
            return u.data.slice(1).map((ys) => ys.map((y, i) => [u.data[0][i], y])
                .filter(([, y]) => y !== null));
        }""",
    )
    assert drawn[1] == [[0.5, 0.7], [1, 0.5], [2, 0.4], [4, 0.3]], drawn
    assert drawn[2] == [[0.5, 1.0], [1, 0.8]], drawn
    assert await b.do("texts", sel="#best-trial td") == ["trial", "1", "value", "0.3", "lr", "0.01"]
    assert await b.do("texts", sel="#rungs tr td:first-child") == ["0", "1"]
    assert await b.do("texts", sel="#rungs tr td:nth-child(2)") == ["1", "4"]
    statuses = await b.do("texts", sel="#trials tr td:nth-child(2)")
    assert statuses == ["running", "running", "paused", "paused"], statuses
    assert await b.do("count", sel="#trials tr.best") == 1
    # what each trial was told, and why
    assert await b.do("count", sel="#decisions tr.decision") == DECISIONS
    why = await b.do("texts", sel='#decisions tr[data-trial="2"] td:last-child')
    assert why == ["not in the top 1/4", ""], why
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await b.do("shot", path=str(ARTIFACTS / "console-experiment.png"))

    # a read-only token: no button, and the API refuses it and publishes nothing
    assert await b.do("count", sel="#experiment-actions button") == 0
    url = f"{c.url}v1/envs/{c.env}/experiments/{NAME}/pause"
    async with aiohttp.ClientSession() as http:
        async with http.post(url, headers=c.auth, json={"reason": "x"}) as resp:
            assert resp.status == 403, await resp.text()
        async with http.post(url, json={}) as resp:
            assert resp.status == 401, await resp.text()
    await everything_seen(r)
    assert console_actions(r.tap) == []
    assert await b.do("errors") == []


async def test_pause_activate_and_kill_from_the_console_are_actions_on_the_bus(
    recorded_console: Recorded, open_browser: BrowserFactory
) -> None:
    r = recorded_console
    c = r.console
    b = await open_browser()
    await b.do("dialogs", accept=True)
    await b.do("goto", url=f"{c.url}#token={r.admin}&view=experiment&experiment={NAME}")
    await b.wait(f'#chart-curves[data-points="{POINTS}"]')
    assert await b.do("texts", sel="#experiment-actions button") == ["Pause", "Kill"]

    await click_action(b, "pause")
    (paused,) = await r.tap.until(lambda: console_actions(r.tap), "the console's pause")
    assert paused.action is ExperimentActionKind.PAUSE
    assert paused.reason == "pause from the console"
    await status_is(r, "paused")
    # the page follows the experiment: paused, it offers activate
    await b.until("() => document.getElementById('experiment-facts').dataset.status === 'paused'")
    await click_action(b, "activate")
    await r.tap.until(lambda: console_actions(r.tap)[1:], "the console's activate")
    await status_is(r, "active")
    await b.until("() => !!document.querySelector('#experiment-actions [data-action=pause]')")
    await click_action(b, "kill")
    acted = await r.tap.until(lambda: console_actions(r.tap)[2:], "the console's kill")
    assert [a.action for a in console_actions(r.tap)] == [
        ExperimentActionKind.PAUSE,
        ExperimentActionKind.ACTIVATE,
        ExperimentActionKind.KILL,
    ], acted
    await status_is(r, "killed")
    await b.until("() => document.getElementById('experiment-facts').dataset.status === 'killed'")
    assert await b.do("count", sel="#experiment-actions button") == 0
    # killed is final: the API says so, and nothing more goes out
    url = f"{c.url}v1/envs/{c.env}/experiments/{NAME}/activate"
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {r.admin}"}
        async with http.post(url, headers=headers) as resp:
            assert resp.status == 409, await resp.text()
            assert "killed" in (await resp.json())["error"]["message"]
        missing = f"{c.url}v1/envs/{c.env}/experiments/no-such/pause"
        async with http.post(missing, headers=headers) as resp:
            assert resp.status == 404, await resp.text()
    await everything_seen(r)
    assert len(console_actions(r.tap)) == 3


async def everything_seen(r: Recorded) -> None:
    """Publish a marker action keyed by the experiment and wait for the tap to read it."""
    marker = ExperimentAction(
        env=r.console.env,
        source="test-marker",
        experiment=NAME,
        action=ExperimentActionKind.ACTIVATE,
        reason="marker",
    )
    await r.console.producer.publish(marker)
    await r.tap.until(
        lambda: any(e.event_id == marker.event_id for e in r.tap.of(ExperimentAction, NAME)),
        "the marker",
    )
