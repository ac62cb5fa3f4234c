"""The console's actions in headless Chromium, on real parts: a scale clicked in the console
is a ScalePlan on the env's scale.plans that the local platform's operator applies (its
nodes are processes on this machine) and answers, and the answer shows in the job's
timeline; a suspend stops the job's nodes and the job shows suspended, a resume starts
them again; a delete removes the job; a promote and a revoke go through the registry and
the env's tokens. A read-only token sees no action, and the API refuses it one (403)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.envs.tokens import Scope
from dlrover_events.settings import Settings
from handlers.console.runtime import ConsoleServer
from handlers.operator.platform.bodies import JobView
from schemas.control import EnvMode
from schemas.jobs import JobSubmitted
from schemas.plans import ScalePlan, ScaleResult, ScaleStatus
from tests.conftest import ARTIFACTS, EnvFactory
from tests.integration.console.conftest import Browser, BrowserFactory, console_settings
from tests.integration.gateway.conftest import mint
from tests.integration.local.conftest import Local
from tests.integration.local.conftest import no_orphans as no_orphans  # autouse here too
from tests.integration.local.test_local_platform import running, sleeper_job, until

pytestmark = pytest.mark.integration


async def running_count(local: Local, job: str, n: int) -> dict[int, Any] | None:
    found = running(await local.pods(job))
    return found if len(found) == n else None


async def test_a_scale_from_the_console_reaches_the_operator_and_shows_in_the_timeline(
    local: Local, open_browser: BrowserFactory
) -> None:
    admin = await mint(local.pg_dsn, local.env, Scope.ADMIN)
    reader = await mint(local.pg_dsn, local.env, Scope.READ)
    ctx, task = await local.start_operator()
    try:
        async with ConsoleServer(
            local.settings, local.env, local.pg_dsn, console_settings(platform="local")
        ) as console:
            await console.wait_ready(30)
            await local.submit(sleeper_job("console-job", 1))
            submitted = await local.tap.until(
                lambda: next(
                    (e for e in local.tap.of(JobSubmitted) if e.job.name == "console-job"), None
                ),
                "job.submitted",
            )
            uid = submitted.job.uuid
            await until("1 running node", lambda: running_count(local, "console-job", 1))

            b = await open_browser()
            await b.do("goto", url=f"{console.url}#token={admin}")
            await b.wait("#status.live")
            assert await b.do("text", sel="#scope") == "admin"
            link = f'#jobs tr[data-job="{uid}"] a.job-link'
            await b.wait(link)
            await b.do("click", sel=link)
            await b.wait('#job-actions button.action[data-action="scale"]')
            await b.do("click", sel='#job-actions button.action[data-action="scale"]')
            await b.do("fill", sel='#action-form input[name="replicas"]', value=2)
            await b.do("click", sel="#action-go")
            await b.wait("#action-result.applied")
            said = await b.do("text", sel="#action-result")
            plan_id = said.split()[1]

            # the operator got the console's plan, applied it, and the job has two nodes
            plan = await local.tap.first(ScalePlan, uid, lambda p: p.plan_id == plan_id, "plan")
            assert plan.source == "console"
            result = await local.tap.first(
                ScaleResult, uid, lambda r: r.plan_id == plan_id, "its result"
            )
            assert result.status == ScaleStatus.APPLIED, result
            await until("2 running nodes", lambda: running_count(local, "console-job", 2))
            # and its answer is in the job's timeline, beside the console's plan
            await b.wait(
                f'#timeline tr[data-type="scale.plan"][data-plan="{plan_id}"]'
                '[data-source="console"]'
            )
            await b.wait(
                f'#timeline tr[data-type="scale.result"][data-plan="{plan_id}"]'
                '[data-status="applied"]'
            )
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            await b.do("shot", path=str(ARTIFACTS / "console-scale.png"))

            # suspend, confirmed in a dialog: the operator stops the job's nodes and keeps
            # the job, and the console says it is suspended
            await b.do("dialogs", accept=True)
            suspended = await _act(b, "suspend")
            plan = await local.tap.first(ScalePlan, uid, lambda p: p.plan_id == suspended, "plan")
            assert (plan.source, plan.suspend) == ("console", True)
            result = await local.tap.first(
                ScaleResult, uid, lambda r: r.plan_id == suspended, "its result"
            )
            assert result.status == ScaleStatus.APPLIED, result
            await until("no node left", lambda: _no_pods(local, "console-job"))
            kept = await local.cluster().get_job("console-job")
            assert isinstance(kept, JobView) and kept.suspended
            assert kept.document["status"]["phase"] == "Suspended"
            await b.until(_facts_start("suspended"))
            await b.wait(
                f'#timeline tr[data-type="scale.result"][data-plan="{suspended}"]'
                '[data-status="applied"]'
            )
            await b.do("click", sel='#tabs a[data-view="overview"]')
            row = f'#jobs tr[data-job="{uid}"]'
            await b.until(
                f"() => document.querySelector('{row}')?.textContent.includes('suspended')"
            )
            await b.do("click", sel=link)

            # resume: the job's two nodes run again, and it is shown running
            resumed = await _act(b, "resume")
            result = await local.tap.first(
                ScaleResult, uid, lambda r: r.plan_id == resumed, "its result"
            )
            assert result.status == ScaleStatus.APPLIED, result
            await until("2 running nodes again", lambda: running_count(local, "console-job", 2))
            back = await local.cluster().get_job("console-job")
            assert isinstance(back, JobView) and not back.suspended
            await b.until(_facts_start("running"))
            # a resume of a job that runs is a mistake the page says, and nothing goes out
            await b.do("click", sel='#job-actions button.action[data-action="resume"]')
            await b.wait("#action-result.error")
            assert "is not suspended" in await b.do("text", sel="#action-result")
            (refused,) = await b.do("errors")  # the browser logs the 422, nothing else
            assert "422" in refused, refused

            # a read-only token: the same pages, no action anywhere, and the API says 403
            await b.do("goto", url=f"{console.url}#token={reader}")
            await b.until("() => document.getElementById('scope').textContent === 'read only'")
            await b.wait("#status.live")
            await b.do("click", sel=link)
            await b.wait('#timeline tr[data-type="scale.result"]')
            await b.do("click", sel='#tabs a[data-view="envs"]')
            await b.wait(f'#envs tr[data-env="{local.env}"]')
            assert await b.do("count", sel="button.action") == 0
            await b.do("click", sel='#tabs a[data-view="overview"]')
            await b.do("click", sel=link)
            await b.wait('#timeline tr[data-type="scale.result"]')
            assert await b.do("count", sel="#job-actions button") == 0
            base = f"{console.url}v1/envs/{local.env}/jobs/console-job"
            async with aiohttp.ClientSession() as http:
                read = {"Authorization": f"Bearer {reader}"}
                r = await http.post(base + "/scale", json={"replicas": 3}, headers=read)
                assert r.status == 403
                assert "admin" in (await r.json())["error"]["message"]
                r = await http.delete(base, headers=read)
                assert r.status == 403
                for action in ("suspend", "resume"):
                    r = await http.post(f"{base}/{action}", headers=read)
                    assert r.status == 403, action
                # an admin's mistakes: a 4xx that says what, nothing published
                write = {"Authorization": f"Bearer {admin}"}
                ps = {"role": "ps", "replicas": 2}
                r = await http.post(base + "/scale", json=ps, headers=write)
                assert r.status == 422
                assert "no role 'ps'" in (await r.json())["error"]["message"]
                r = await http.post(base + "/scale", data=b"{nope", headers=write)
                assert r.status == 400
                r = await http.post(
                    f"{console.url}v1/envs/{local.env}/jobs/nojob/scale",
                    json={"replicas": 2},
                    headers=write,
                )
                assert r.status == 404
            published = [p.plan_id for p in local.tap.of(ScalePlan, uid)]
            assert published == [plan_id, suspended, resumed]

            # delete, as the admin: confirmed in a dialog, then the job is gone
            await b.do("goto", url=f"{console.url}#token={admin}")
            await b.until("() => document.getElementById('scope').textContent === 'admin'")
            await b.do("click", sel='#tabs a[data-view="overview"]')
            await b.do("click", sel=link)
            await b.do("dialogs", accept=True)
            await b.do("click", sel='#job-actions button.action[data-action="delete"]')
            await b.wait("#action-result.applied")
            await until("the job deleted", lambda: _gone(local, "console-job"))
            await until("no node left", lambda: _no_pods(local, "console-job"))
            assert await b.do("errors") == []
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, 120)


async def _act(b: Browser, action: str) -> str:
    """Click the job's ``action`` button; the id of the plan the page says went out."""
    await b.do("click", sel=f'#job-actions button.action[data-action="{action}"]')
    await b.until(
        "() => { const o = document.getElementById('action-result');"
        f" return o.className === 'applied' && o.textContent.includes('-{action}-'); }}"
    )
    said = await b.do("text", sel="#action-result")
    return str(said.split()[1])


def _facts_start(status: str) -> str:
    return f"() => document.getElementById('job-facts').textContent.startsWith('{status}')"


async def _gone(local: Local, name: str) -> bool:
    return await local.cluster().get_job(name) is None


async def _no_pods(local: Local, name: str) -> bool:
    return not await local.pods(name)


async def test_promote_and_revoke_from_the_console(
    settings: Settings, pg_dsn: str, make_env: EnvFactory, open_browser: BrowserFactory
) -> None:
    real = (await make_env(mode=EnvMode.REAL, partitions=1)).name
    shadow = (await make_env(partitions=1)).name
    admin = await mint(pg_dsn, real, Scope.ADMIN)
    reader = await mint(pg_dsn, real, Scope.READ)
    shadow_admin = await mint(pg_dsn, shadow, Scope.ADMIN)
    registry = EnvRegistry(settings, pg_dsn)
    async with ConsoleServer(settings, real, pg_dsn, console_settings()) as console:
        await console.wait_ready(30)
        async with aiohttp.ClientSession() as http:
            # the admin of a virtual env may not make it the real one
            r = await http.post(
                f"{console.url}v1/promote",
                json={"env": shadow, "reason": "mine now"},
                headers={"Authorization": f"Bearer {shadow_admin}"},
            )
            assert r.status == 403
            r = await http.post(
                f"{console.url}v1/promote",
                json={"env": shadow},
                headers={"Authorization": f"Bearer {reader}"},
            )
            assert r.status == 403
        assert (await registry.real()) is not None
        assert (await registry.get(real)).mode == EnvMode.REAL  # type: ignore[union-attr]

        b = await open_browser()
        await b.do("goto", url=f"{console.url}#token={admin}")
        await b.wait("#status.live")
        await b.do("click", sel='#tabs a[data-view="envs"]')
        # revoke the read token: the console says so, and the token stops working
        reader_id = reader.split(".")[2]
        await b.do("dialogs", accept=True)
        await b.do("click", sel=f'#tokens button.action[data-token="{reader_id}"]')
        await b.wait(f'#tokens tr[data-token="{reader_id}"] td.failed')

        async def refused() -> bool:
            async with aiohttp.ClientSession() as http:
                r = await http.get(
                    f"{console.url}v1/envs/{real}/jobs",
                    headers={"Authorization": f"Bearer {reader}"},
                )
                return r.status == 401

        await until("the revoked token refused", refused)

        # promote the shadow env, with a reason
        await b.do("dialogs", accept=True, text="the shadow's brain won its A/B")
        await b.do("click", sel=f'#envs button.action[data-action="promote"][data-env="{shadow}"]')
        row = f'#envs tr[data-env="{real}"]'
        await b.until(f"() => document.querySelector('{row}')?.textContent.includes('virtual')")
        assert await b.do("text", sel="#mode") == "virtual"
        assert await b.do("count", sel='#envs button.action[data-action="promote"]') == 0
        assert await b.do("errors") == []
    now = await registry.get(shadow)
    assert now is not None
    assert now.mode == EnvMode.REAL
    change = [c for c in await registry.changes(shadow) if c["change"] == "promote"]
    assert change[-1]["reason"] == "the shadow's brain won its A/B"
