"""The console's model registry in headless Chromium, on real Postgres: an env whose
catalog holds an experiment's checkpoints (as the checkpoints service records them) and
whose experiment tables hold its trials' hyperparameters (as the experiments recorder
stores them), with the best trial registered as a model version and a second version
beside it. The Models tab lists the model; its page lists both versions and shows the
lineage of the one chosen: the checkpoint and where it lies, the job, trial and
experiment, the searcher and its metric, the hyperparameters, the plans it trained under.
A read-only token sees all of it (the console registers nothing)."""

from __future__ import annotations

import pytest

from dlrover_events.checkpoints.store import Batch, CheckpointStore
from dlrover_events.experiments.store import Batch as ExperimentBatch
from dlrover_events.experiments.store import ExperimentStore
from dlrover_events.store import create_pool, env_schema
from schemas.experiments import DecisionKind, ExperimentSpec, ExperimentSubmitted, TrialDecision
from tests.conftest import ARTIFACTS
from tests.integration.checkpoints.conftest import committed
from tests.integration.console.conftest import BrowserFactory, Console
from tests.unit.experiments.documents import document

pytestmark = pytest.mark.integration

SWEEP = "ck-console"


async def seed(env: str, pg_dsn: str) -> None:
    pool = await create_pool(pg_dsn, env_schema(env), max_size=1)
    try:
        experiments = ExperimentBatch()
        spec = ExperimentSpec.model_validate(document(SWEEP)["spec"])
        experiments.add(ExperimentSubmitted(env=env, experiment=SWEEP, spec=spec))
        for trial, lr in ((0, 0.01), (1, 0.1)):
            experiments.add(
                TrialDecision(
                    env=env, experiment=SWEEP, seq=trial, decision=DecisionKind.CREATE,
                    trial=trial, hparams={"lr": lr, "width": 64}, budget=30, rung=0,
                )
            )  # fmt: skip
        await ExperimentStore(pool).record(experiments)
        catalog = Batch()
        for trial, losses in ((0, (0.7, 0.3)), (1, (0.5, 0.4))):
            job = f"{SWEEP}-t{trial}"
            for step, loss in zip((10, 20), losses, strict=True):
                catalog.add(
                    committed(
                        env, job, step, url=f"s3://ckpts/{job}/step-{step}", experiment=SWEEP,
                        trial=trial, metrics={"val_loss": loss},
                        plan_id="p-a" if step == 10 else "p-b", world_size=4 if step == 10 else 2,
                    )
                )  # fmt: skip
        store = CheckpointStore(pool)
        await store.record(catalog)
        await store.register(
            "sweep-best", await store.best_of(SWEEP), notes="the best", labels=["candidate"]
        )
        await store.register("sweep-best", f"{SWEEP}-t1-20", notes="runner-up")
    finally:
        await pool.close()


async def test_the_models_page_shows_versions_and_lineage(
    console: Console, pg_dsn: str, open_browser: BrowserFactory
) -> None:
    c = console
    await seed(c.env, pg_dsn)
    b = await open_browser()
    await b.do("goto", url=f"{c.url}#token={c.token}")  # a read-only token
    await b.wait("#status.live")
    await b.do("click", sel='#tabs a[data-view="models"]')
    row = '#models tr[data-model="sweep-best"]'
    await b.wait(row)
    cells = await b.do("texts", sel=f"{row} td")
    assert cells[:3] == ["sweep-best", "2", "2"], cells
    await b.do("click", sel=f"{row} a.model-link")
    await b.wait('#model-detail[data-version="2"]')
    assert await b.do("texts", sel="#model-versions tr td:first-child") == ["2", "1"]

    # the best trial's version: its lineage back to the run
    await b.do("click", sel='#model-versions tr[data-version="1"] a.version-link')
    await b.wait('#model-detail[data-version="1"]')
    assert await b.do("count", sel='#model-versions tr.on[data-version="1"]') == 1

    async def fact(name: str) -> str:
        texts = await b.do("texts", sel=f'#model-lineage tr[data-fact="{name}"] td')
        assert texts[0] == name, texts
        return str(texts[1])

    assert await fact("checkpoint") == f"{SWEEP}-t0-20 (kept)"
    assert await fact("url") == f"s3://ckpts/{SWEEP}-t0/step-20"
    assert await fact("job") == f"{SWEEP}-t0 (uid-{SWEEP}-t0)"
    assert await fact("experiment") == SWEEP
    assert await fact("trial") == "0"
    assert await fact("searcher") == "asha on val_loss \u2193"
    assert await fact("hyperparameters") == "lr=0.01 width=64"
    assert await fact("metrics") == "val_loss=0.3"
    assert await fact("plan in force") == "p-b"
    assert await fact("notes") == "the best"
    assert await fact("labels") == "candidate"
    plans = await b.do("texts", sel="#model-plans tr td:first-child")
    assert plans == ["p-a", "p-b"], plans
    assert await b.do("texts", sel='#model-plans tr[data-plan="p-a"] td:nth-child(3)') == ["4"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await b.do("shot", path=str(ARTIFACTS / "console-models.png"))
    assert await b.do("errors") == []
