"""The console's pages in headless Chromium, on a virtual env: a job's page (timeline,
world size and throughput charts), evaluation reports that repeat collapsed, the dead
letters with reasons, config documents, A/B results (table and chart), the env switcher,
and a read-only token that sees no action."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dlrover_events.bus.topics import topic
from dlrover_events.envs.tokens import Scope
from handlers.gateway.store import ConfigStore
from schemas.config import ConfigDocument
from schemas.dlq import FailureKind, fitting_letter
from schemas.envelope import Event
from schemas.evaluation import EvaluationReport
from schemas.jobs import JobMeta, JobSubmitted, NodeUsage, RoleSpec, RuntimeSample
from schemas.plans import NodeGroupResource, ScalePlan, ScaleResult, ScaleStatus
from streams.ab.report import ArmResult, compare
from streams.ab.summary import RunInfo, build_summary, write_summary
from tests.conftest import ARTIFACTS, EnvFactory
from tests.integration.console.conftest import BrowserFactory, Console
from tests.integration.gateway.conftest import mint

pytestmark = pytest.mark.integration

GiB = 2**30
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
JOB = JobMeta(uuid="5d1c0b7e-2f43-4a8e-b6a1-93c2e0f4d7aa", name="bert-large")
EVALUATORS = ("gpu_hours", "jct", "queue", "goodput", "plans", "failures", "utilisation")


def job_events(env: str) -> list[Event]:
    grow = {"worker": NodeGroupResource(count=4)}
    samples = [
        RuntimeSample(
            env=env,
            job=JOB,
            global_step=100 * i,
            speed=1.0 + (i >= 5),
            samples_per_s=64.0 * (1 + (i >= 5)),
            world_size=2 if i < 5 else 4,
            occurred_at=T0 + timedelta(seconds=60 * i),
            nodes=[NodeUsage(type="worker", id=0, memory=419_625_370)],
        )
        for i in range(10)
    ]
    return [
        JobSubmitted(env=env, job=JOB, roles={"worker": RoleSpec(replicas=2, memory=8 * GiB)}),
        *samples[:5],
        ScalePlan(env=env, job=JOB, plan_id="grow-1", node_group_resources=grow),
        ScaleResult(env=env, job=JOB, plan_id="grow-1", status=ScaleStatus.APPLIED),
        *samples[5:],
    ]


def reports(env: str, at: datetime) -> list[EvaluationReport]:
    return [
        EvaluationReport(
            env=env,
            evaluator=name,
            window_start=at - timedelta(seconds=10),
            window_end=at,
            occurred_at=at,
            jobs=1,
            metrics={"value": 0.0},
        )
        for name in EVALUATORS
    ]


async def test_the_pages_of_an_env(
    console: Console, open_browser: BrowserFactory, pg_dsn: str, make_env: EnvFactory
) -> None:
    env, prod = console.env, console.producer
    await prod.publish_many(job_events(env))
    for k in range(3):  # seven evaluators, the same values every 10 s
        await prod.publish_many(reports(env, T0 + timedelta(seconds=10 * k)))
    await prod.publish(
        fitting_letter(
            env=env,
            original_topic=topic(env, "job.metrics"),
            partition=0,
            offset=7,
            key=b"j",
            value=b'{"type": "job.runtime_sample", "global_step": -1}',
            kind=FailureKind.INVALID,
            error="global_step: Input should be greater than or equal to 0",
            group=f"{env}.brain",
        )
    )
    pool = await console.server.views.pool(env)
    await ConfigStore(pool, env, prod).create(
        ConfigDocument(name="a100-jobs", include={"cluster": "a100"}, configure={"lr": 0.1})
    )
    jobs = [f"j{i}" for i in range(12)]
    static = {j: 3000.0 + i for i, j in enumerate(jobs)}
    goodput = {j: 2500.0 + i for i, j in enumerate(jobs)}
    arms = [
        ArmResult("static", "ab-y-static", "defaults", static, {"gpu_hours": 5.0}),
        ArmResult("goodput", env, "defaults", goodput, {"gpu_hours": 4.0}),
    ]
    run = RunInfo("y", "workload-6.csv", None, "lockstep", 16, 4, 3.0)
    write_summary(console.server.conf.ab_reports[0], build_summary(compare(arms), run))

    b = await open_browser()
    await b.do("goto", url=f"{console.url}#token={console.token}")
    await b.wait("#status.live")
    assert await b.do("text", sel="#scope") == "read only"

    # seven identical reports every 10 s: seven rows, each saying it came twice more
    await b.until(
        '() => [...document.querySelectorAll(\'#events tr.event[data-type="eval.report"]'
        " .repeat')].filter(s => s.textContent.includes('2\u00d7')).length === 7"
    )
    assert await b.do("count", sel='#events tr.event[data-type="eval.report"]') == 7
    await b.until("() => document.querySelectorAll('#reports tr').length === 7")

    # the job's page: its timeline and two charts, memory in binary units
    link = f'#jobs tr[data-job="{JOB.uuid}"] a.job-link'
    await b.wait(link)
    row = await b.do("text", sel=f'#jobs tr[data-job="{JOB.uuid}"]')
    assert "worker-0 400 MiB" in row
    assert "419625370" not in row
    await b.do("click", sel=link)
    await b.wait("#view-job")
    await b.wait('#timeline tr[data-type="scale.result"][data-status="applied"]')
    await b.wait('#timeline tr[data-type="job.submitted"]')
    assert await b.do("count", sel="#chart-world canvas") == 1
    assert await b.do("count", sel="#chart-speed canvas") == 1
    await b.until(
        "() => document.querySelector('#chart-world .u-legend') !== null"
        " && document.getElementById('job-facts').textContent.includes('world 4')"
    )
    assert "bert-large" in await b.do("text", sel="#job-title")
    assert await b.do("count", sel="#job-actions button") == 0  # read only: no action
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await b.do("shot", path=str(ARTIFACTS / "console-job.png"))

    # dead letters, with the reason and what the record held
    await b.do("click", sel='#tabs a[data-view="dlq"]')
    await b.wait('#dlq tr.letter[data-kind="invalid"]')
    letter = await b.do("text", sel='#dlq tr.letter[data-kind="invalid"]')
    assert "greater than or equal to 0" in letter
    assert '"global_step": -1' in letter

    # config documents, one opened whole
    await b.do("click", sel='#tabs a[data-view="configs"]')
    await b.do("click", sel='#configs tr[data-config="a100-jobs"] a')
    await b.until("() => document.getElementById('config-doc').textContent.includes('0.1')")

    # A/B results: the arms and their chart
    await b.do("click", sel='#tabs a[data-view="ab"]')
    await b.wait('#ab-runs table.arms tr[data-arm="goodput"]')
    arm = await b.do("text", sel='#ab-runs table.arms tr[data-arm="goodput"]')
    assert "better" in arm
    assert "(this env)" in arm
    await b.wait("#ab-runs .ab-chart canvas")
    await b.do("shot", path=str(ARTIFACTS / "console-ab.png"))

    # envs: a read token sees neither promote nor revoke
    other = (await make_env(partitions=1)).name
    other_token = await mint(pg_dsn, other, Scope.READ)
    await b.do("click", sel='#tabs a[data-view="envs"]')
    await b.wait(f'#envs tr[data-env="{other}"]')
    assert await b.do("count", sel="button.action") == 0

    # the switcher: another env asks for its own token, then shows its own jobs
    await prod.publish(
        RuntimeSample(env=other, job=JobMeta(uuid="other-job"), global_step=1, speed=1.0)
    )
    await b.until(
        f"() => [...document.querySelectorAll('#env-select option')].some(o => o.value === "
        f"'{other}')",
    )
    await b.do("select", sel="#env-select", value=other)
    await b.wait("#login-form")
    assert await b.do("text", sel="#login-env") == other
    await b.do("fill", sel="#token-input", value=other_token)
    await b.do("click", sel="#login-form button")
    await b.wait(f'#envs tr[data-env="{other}"]')  # the view stays; the env changed
    await b.do("click", sel='#tabs a[data-view="overview"]')
    await b.wait('#jobs tr[data-job="other-job"]')
    assert await b.do("count", sel=f'#jobs tr[data-job="{JOB.uuid}"]') == 0
    # and back: the first env's token was kept
    await b.do("select", sel="#env-select", value=env)
    await b.wait(f'#jobs tr[data-job="{JOB.uuid}"]')
    assert await b.do("errors") == []
