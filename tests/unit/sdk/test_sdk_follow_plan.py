"""The plan follower: what each gateway answer means (pure), and the thread against a fake
gateway on 127.0.0.1 (long-poll with ETag, 404 before the job is known, 401, outages)."""

from __future__ import annotations

import http.server
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dlrover_events.backoff import Backoff
from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk.follow_plan import PlanFollower, PlanResource
from dlrover_events.sdk.knobs import StepKnobs
from schemas.jobs import JobMeta
from schemas.plans import JobPlan, NotApplied, ScalePlan, ScaleResult, ScaleStatus

JOB = JobMeta(uuid="job/plans 1")


def a_plan(plan_id: str, job: JobMeta = JOB) -> JobPlan:
    return JobPlan(
        job=job,
        scale_plan=ScalePlan(
            env="unit", job=job, plan_id=plan_id, training={"local_batch_size": 8}
        ),
    )


def body(plan: JobPlan) -> bytes:
    return plan.model_dump_json().encode()


def test_the_resources_url_and_headers() -> None:
    res = PlanResource("http://gw:8470/", "tok", JOB.uuid)
    assert res.url(None) == "http://gw:8470/v1/jobs/job%2Fplans%201/plan"
    assert res.url(30) == "http://gw:8470/v1/jobs/job%2Fplans%201/plan?wait=30"
    assert res.headers(True) == {"Accept": "application/json", "Authorization": "Bearer tok"}
    res.got(200, body(a_plan("p1")), '"e1"')
    assert res.headers(True)["If-None-Match"] == '"e1"'
    assert "If-None-Match" not in res.headers(False)


def test_answers_keep_the_last_good_plan(caplog: pytest.LogCaptureFixture) -> None:
    res = PlanResource("http://gw", None, JOB.uuid)
    with caplog.at_level(logging.INFO):
        first = res.got(404, b'{"error": {"message": "unknown job"}}', None)
        again = res.got(404, b"", None)
    assert first.stale and first.plan is None and again.stale
    assert sum("no plan for job" in r.message for r in caplog.records) == 1  # said once
    assert not any(r.levelno >= logging.WARNING for r in caplog.records)  # not an outage

    good = res.got(200, body(a_plan("p1")), '"e1"')
    assert not good.stale and good.plan is not None and good.plan.scale_plan is not None
    same = res.got(304, b"", '"e1"')
    assert not same.stale and same.plan == good.plan

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            down = res.failed("URLError: refused")
        denied = res.got(401, b'{"error": {"message": "bad token"}}', None)
    assert down.stale and down.plan == good.plan  # kept through the outage
    assert denied.stale and denied.error is not None and "401: bad token" in denied.error
    assert sum("unavailable" in r.message for r in caplog.records) == 1  # one line per outage

    junk = res.got(200, b'{"job": 3}', None)
    other = res.got(200, body(a_plan("p9", JobMeta(uuid="other"))), None)
    assert junk.stale and other.stale and res.last.plan == good.plan


class FakeGateway:
    """GET /v1/jobs/{job}/plan with ETag and long-poll, as the gateway's contract says."""

    def __init__(self, token: str = "tok") -> None:
        self.token = token
        self.plan: JobPlan | None = None
        self.version = 0
        self.changed = threading.Condition()
        self.requests: list[tuple[str, str | None]] = []
        gw = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                gw.requests.append((self.path, self.headers.get("If-None-Match")))
                if self.headers.get("Authorization") != f"Bearer {gw.token}":
                    return self.answer(401, b'{"error": {"message": "no token"}}')
                wait = float(self.path.partition("wait=")[2] or 0)
                etag = self.headers.get("If-None-Match")
                with gw.changed:
                    gw.changed.wait_for(lambda: etag != f'"{gw.version}"', timeout=wait)
                    plan, version = gw.plan, gw.version
                if plan is None:
                    return self.answer(404, b'{"error": {"message": "unknown job"}}')
                if etag == f'"{version}"':
                    return self.answer(304, b"", version)
                return self.answer(200, body(plan), version)

            def answer(self, status: int, data: bytes, version: int | None = None) -> None:
                self.send_response(status)
                if version is not None:
                    self.send_header("ETag", f'"{version}"')
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def publish(self, plan: JobPlan) -> None:
        with self.changed:
            self.plan, self.version = plan, self.version + 1
            self.changed.notify_all()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    gw = FakeGateway()
    yield gw
    gw.close()


def until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.02)


def test_the_follower_long_polls_and_calls_back(
    gateway: FakeGateway, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dlrover_events.config.client.RETRY", Backoff(0.05, 0.05))
    follower = PlanFollower(JOB.uuid, url=gateway.url, token="tok", wait_s=5)
    seen: list[str] = []

    def broken(plan: JobPlan) -> None:
        raise RuntimeError("a bug in the callback")

    follower.on_plan(broken)
    follower.on_plan(lambda p: seen.append(p.scale_plan.plan_id if p.scale_plan else "-"))
    with caplog.at_level(logging.INFO), follower.start():
        until(lambda: len(gateway.requests) >= 2)  # 404s: the job is not known yet
        assert follower.current() is None
        gateway.publish(a_plan("p1"))
        until(lambda: seen == ["p1"])
        gateway.publish(a_plan("p2"))
        until(lambda: seen == ["p1", "p2"])
        current = follower.current()
        assert current is not None and current.scale_plan is not None
        assert current.scale_plan.plan_id == "p2"
        # Long-polls carry the ETag they got; a late callback gets the plan held at once.
        assert any(path.endswith("wait=5") and tag for path, tag in gateway.requests)
        late: list[JobPlan] = []
        follower.on_plan(late.append)
        assert late == [current]
    assert "a bug in the callback" in caplog.text  # logged, not raised


def test_without_a_token_or_a_gateway_training_goes_on(
    gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dlrover_events.config.client.RETRY", Backoff(0.05, 0.05))
    gateway.publish(a_plan("p1"))
    denied = PlanFollower(JOB.uuid, url=gateway.url, token="wrong", wait_s=1).start()
    until(lambda: len(gateway.requests) >= 2)
    assert denied.current() is None and "401" in (denied.snapshot().error or "")
    denied.close()

    nowhere = PlanFollower(JOB.uuid, url=f"http://127.0.0.1:{free_port()}", token="t").start()
    until(lambda: nowhere.snapshot().error not in (None, "not fetched yet"))
    assert nowhere.current() is None
    nowhere.close()

    monkeypatch.delenv("DLROVER_EVENTS_GATEWAY_URL", raising=False)
    off = PlanFollower(JOB.uuid).start()  # no URL: off, and says so once
    assert not off.enabled and off.current() is None
    off.close()


def test_a_gateway_going_away_keeps_the_last_plan(
    gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dlrover_events.config.client.RETRY", Backoff(0.05, 0.05))
    gateway.publish(a_plan("p1"))
    follower = PlanFollower(JOB.uuid, url=gateway.url, token="tok", wait_s=0.2).start()
    until(lambda: follower.current() is not None)
    gateway.close()
    until(lambda: follower.snapshot().stale, timeout_s=15)
    current = follower.current()
    assert current is not None and current.scale_plan is not None
    assert current.scale_plan.plan_id == "p1"
    follower.close()


def test_knobs_follow_the_follower(gateway: FakeGateway) -> None:
    knobs = StepKnobs(16, 1)
    follower = PlanFollower(JOB.uuid, url=gateway.url, token="tok", wait_s=5)
    knobs.follow(follower.start())
    plan = a_plan("p7").model_copy(
        update={
            "result": ScaleResult(
                env="unit",
                job=JOB,
                plan_id="p7",
                status=ScaleStatus.PARTIAL,
                not_applied=[NotApplied(part="training.local_batch_size", reason="job's")],
            )
        }
    )
    gateway.publish(plan)
    until(lambda: knobs._pending is not None)
    switch = knobs.at_step_boundary(100)
    assert switch is not None and switch.after.local_batch_size == 8
    assert switch.after.accumulation_steps == 2
    follower.close()
    json.dumps(knobs.state_dict())  # a checkpoint can hold it as JSON too
