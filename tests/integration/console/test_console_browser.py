"""The console's live view in headless Chromium (Debian's `chromium`, driven by
playwright-core from npm): a live event arrives, the job filter works, the events' "what"
column is in sight, and a screenshot is saved under test-artifacts/ (not committed).

The latency from a published event to its row on the page is measured and written beside
the screenshot; it is not asserted (speed is the benchmark's business).
"""

from __future__ import annotations

import json
import time

import pytest

from schemas.jobs import JobMeta, NodeUsage, RuntimeSample
from schemas.plans import ScaleResult, ScaleStatus
from tests.conftest import ARTIFACTS
from tests.integration.console.conftest import BrowserFactory, Console

pytestmark = pytest.mark.integration

#: a job id as long as the operator's (a Kubernetes uid)
LONG = "3f2c9a7e-5b1d-4c8e-9a6f-0d2e4b7c1a95"


def sample(env: str, job: str, step: int) -> RuntimeSample:
    return RuntimeSample(
        env=env,
        job=JobMeta(uuid=job),
        global_step=step,
        speed=4.0,
        samples_per_s=256.0,
        nodes=[NodeUsage(type="worker", id=0, memory=2**31, step_time=0.25)],
    )


def rows(job: str) -> str:
    return f'#events tr.event[data-job="{job}"]'


async def test_live_event_filter_and_screenshot(
    console: Console, open_browser: BrowserFactory
) -> None:
    env = console.env
    b = await open_browser()
    await b.do("goto", url=f"{console.url}#token={console.token}")
    await b.wait("#status.live")

    asked = time.monotonic()
    await console.producer.publish(sample(env, "job-alpha", 1))
    await b.wait(rows("job-alpha"))
    latency_ms = int((time.monotonic() - asked) * 1000)

    await b.do("fill", sel="#job", value="job-beta")
    await b.do("click", sel="#apply")
    await b.wait("#status.live")
    await console.producer.publish_many(
        [sample(env, "job-alpha", 2), sample(env, "job-beta", 1), sample(env, "job-alpha", 3)]
    )
    await console.producer.publish(sample(env, "job-beta", 2))
    await b.until(f"() => document.querySelectorAll('{rows('job-beta')}').length >= 2")
    # job-alpha's samples went out with job-beta's; the filtered feed showed none of them
    # (the table was emptied when the filter changed).
    assert await b.do("count", sel=rows("job-alpha")) == 0
    # The jobs table is not filtered: both jobs, with their last usage in binary units.
    await b.wait('#jobs tr[data-job="job-alpha"]')
    await b.wait('#jobs tr[data-job="job-beta"]')
    usage = await b.do("text", sel='#jobs tr[data-job="job-beta"]')
    assert "worker-0 2 GiB" in usage
    assert str(2**31) not in usage

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "console.png"
    await b.do("shot", path=str(shot))
    assert shot.stat().st_size > 10_000
    assert await b.do("errors") == []
    (ARTIFACTS / "console-browser.json").write_text(
        json.dumps({"env": env, "live_event_latency_ms": latency_ms, "screenshot": str(shot)})
    )


#: Every "what" cell lies inside its section and shows its whole text (it wraps), whatever
#: the widths of the columns before it.
WHAT_IN_SIGHT = """() => {
  const box = document.querySelector('#view-overview section').getBoundingClientRect();
  const cells = [...document.querySelectorAll('#events tr.event td.summary')];
  return cells.map(td => {
    const r = td.getBoundingClientRect();
    return {right: r.right, box: box.right, scroll: td.scrollWidth, client: td.clientWidth,
            text: td.textContent};
  });
}"""


async def test_the_what_column_is_in_sight_with_long_ids(
    console: Console, open_browser: BrowserFactory
) -> None:
    """Issue 28: with an operator's job ids and long topic names the column that says what
    happened was pushed out of its section."""
    env = console.env
    b = await open_browser()
    await b.do("viewport", width=1280, height=800)
    await b.do("goto", url=f"{console.url}#token={console.token}")
    await b.wait("#status.live")
    plan = "cli-" + LONG.replace("-", "") * 2  # an id without a place to break
    await console.producer.publish_many(
        [
            sample(env, LONG, 1),
            ScaleResult(env=env, job=JobMeta(uuid=LONG), plan_id=plan, status=ScaleStatus.APPLIED),
        ]
    )
    await b.until(f"() => document.querySelectorAll('{rows(LONG)}').length >= 2")
    cells = await b.do("eval", js=WHAT_IN_SIGHT)
    assert len(cells) == 2
    assert {c["text"].split()[0] for c in cells} == {"step=1", f"plan={plan}"}
    for c in cells:
        assert c["right"] <= c["box"] + 1, c
        assert c["scroll"] <= c["client"] + 1, c
