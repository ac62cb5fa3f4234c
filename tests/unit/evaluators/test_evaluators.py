from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import (
    Event,
    JobCompleted,
    JobFailed,
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeGroupResource,
    NodeOOM,
    NodeResource,
    OOMKind,
    RuntimeSample,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
)
from schemas.jobs import NodeRef, RoleSpec
from streams.evaluators.compare import bootstrap_mean, paired_difference, verdict
from streams.evaluators.ledger import Ledger
from streams.evaluators.registry import EVALUATORS, evaluate

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def job_life(
    ledger: Ledger,
    uuid: str,
    submit: float,
    start: float,
    end: float,
    gpus: int,
    failed: bool = False,
) -> None:
    job = JobMeta(uuid=uuid)
    ledger.observe(
        JobSubmitted(
            env="e",
            job=job,
            occurred_at=at(submit),
            roles={"worker": RoleSpec(replicas=gpus, gpu_num=1)},
        )
    )
    ledger.observe(JobStarted(env="e", job=job, occurred_at=at(start)))
    done = JobFailed if failed else JobCompleted
    ledger.observe(done(env="e", job=job, occurred_at=at(end)))


def test_jct_queueing_gpu_hours_and_failures() -> None:
    ledger = Ledger()
    job_life(ledger, "a", 0, 100, 3700, gpus=4)  # JCT 3700, queued 100, 4 GPU-hours
    job_life(ledger, "b", 50, 50, 1850, gpus=2, failed=True)  # JCT 1800, 1 GPU-hour
    m = evaluate(ledger.in_window(None, None), ledger.last_event_at)
    assert m["jobs"] == 2
    assert m["jct_mean_s"] == pytest.approx((3700 + 1800) / 2)
    assert m["queueing_mean_s"] == pytest.approx(50)
    assert m["gpu_hours"] == pytest.approx(5.0)
    assert m["jobs_completed"] == 1
    assert (m["failed_jobs"], m["failed_rate"]) == (1, 0.5)


def test_an_applied_scale_plan_changes_the_gpu_count_from_then_on() -> None:
    ledger = Ledger()
    job = JobMeta(uuid="a")
    ledger.observe(
        JobSubmitted(
            env="e", job=job, occurred_at=at(0), roles={"worker": RoleSpec(replicas=2, gpu_num=1)}
        )
    )
    ledger.observe(JobStarted(env="e", job=job, occurred_at=at(0)))
    plan = ScalePlan(
        env="e",
        job=job,
        plan_id="p",
        occurred_at=at(1000),
        node_group_resources={
            "worker": NodeGroupResource(count=6, node_resource=NodeResource(gpu_num=1))
        },
    )
    ledger.observe(plan)
    ledger.observe(
        ScaleResult(env="e", job=job, plan_id="p", status=ScaleStatus.APPLIED, occurred_at=at(1800))
    )
    ledger.observe(
        RuntimeSample(env="e", job=job, global_step=1, samples_per_s=600, occurred_at=at(2000))
    )
    ledger.observe(JobCompleted(env="e", job=job, occurred_at=at(3600)))
    m = evaluate(ledger.in_window(None, None), None)
    assert m["gpu_hours"] == pytest.approx((2 * 1800 + 6 * 1800) / 3600)
    assert m["throughput_per_gpu"] == pytest.approx(100)
    assert m["plans_per_job_hour"] == pytest.approx(1.0)


def test_a_rejected_plan_changes_nothing() -> None:
    ledger = Ledger()
    job_life(ledger, "a", 0, 0, 3600, gpus=2)
    ledger.observe(
        ScalePlan(
            env="e",
            job=JobMeta(uuid="a"),
            plan_id="p",
            occurred_at=at(10),
            node_group_resources={"worker": NodeGroupResource(count=8)},
        )
    )
    ledger.observe(
        ScaleResult(
            env="e",
            job=JobMeta(uuid="a"),
            plan_id="p",
            status=ScaleStatus.REJECTED,
            occurred_at=at(11),
        )
    )
    assert evaluate(ledger.in_window(None, None), None)["gpu_hours"] == pytest.approx(2.0)


def test_oom_recurrences_count_repeat_ooms_of_a_node() -> None:
    ledger = Ledger()
    job = JobMeta(uuid="a")
    for node_id in (0, 0, 0, 1):
        ledger.observe(
            NodeOOM(
                env="e", job=job, node=NodeRef(type="worker", id=node_id), kind=OOMKind.HOST_MEMORY
            )
        )
    m = evaluate(list(ledger.jobs.values()), None, ["oom"])
    assert (m["ooms"], m["oom_recurrences"]) == (4, 2)


def test_window_selects_by_submission_time() -> None:
    ledger = Ledger()
    job_life(ledger, "early", 0, 0, 10, gpus=1)
    job_life(ledger, "late", 100, 100, 110, gpus=1)
    assert [j.job for j in ledger.in_window(at(50), None)] == ["late"]
    assert [j.job for j in ledger.in_window(None, at(50))] == ["early"]


def life_events() -> list[Event]:
    job = JobMeta(uuid="a")
    workers = {"worker": NodeGroupResource(count=6, node_resource=NodeResource(gpu_num=1))}
    return [
        JobSubmitted(
            env="e", job=job, occurred_at=at(0), roles={"worker": RoleSpec(replicas=2, gpu_num=1)}
        ),
        JobStarted(env="e", job=job, occurred_at=at(10)),
        RuntimeSample(env="e", job=job, global_step=1, samples_per_s=100, occurred_at=at(20)),
        ScalePlan(env="e", job=job, plan_id="p", occurred_at=at(900), node_group_resources=workers),
        ScaleResult(
            env="e", job=job, plan_id="p", status=ScaleStatus.APPLIED, occurred_at=at(1000)
        ),
        RuntimeSample(env="e", job=job, global_step=2, samples_per_s=480, occurred_at=at(1100)),
        NodeOOM(env="e", job=job, node=NodeRef(type="worker", id=1), kind=OOMKind.HOST_MEMORY),
        JobCompleted(env="e", job=job, occurred_at=at(2000)),
    ]


@given(st.permutations(life_events()))
def test_kpis_do_not_depend_on_arrival_order(events: list[Event]) -> None:
    ordered, shuffled = Ledger(), Ledger()
    for e in life_events():
        ordered.observe(e)
    for e in events:
        shuffled.observe(e)
    expected = evaluate(ordered.in_window(None, None), None)
    assert evaluate(shuffled.in_window(None, None), None) == expected
    assert expected["gpu_hours"] == pytest.approx((2 * 990 + 6 * 1000) / 3600)
    assert expected["throughput_per_gpu"] == pytest.approx((50 + 80) / 2)


def test_unknown_evaluator_is_named() -> None:
    with pytest.raises(KeyError, match="unknown evaluator"):
        evaluate([], None, ["nope"])
    assert {"jct", "queueing", "gpu_hours", "throughput", "oom", "churn", "failures"} <= set(
        EVALUATORS
    )


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.integers(0, 100))
def test_bootstrap_interval_lies_within_the_data(values: list[float], seed: int) -> None:
    ci = bootstrap_mean(values, resamples=200, seed=seed)
    assert min(values) - 1e-6 <= ci.low <= ci.high <= max(values) + 1e-6
    assert ci.n == len(values)
    assert bootstrap_mean(values, resamples=200, seed=seed) == ci  # reproducible


@given(st.floats(-1e6, 1e6), st.integers(1, 20))
def test_bootstrap_of_constant_data_is_a_point(value: float, n: int) -> None:
    ci = bootstrap_mean([value] * n, resamples=100)
    assert ci.low == pytest.approx(value)
    assert ci.high == pytest.approx(value)


def test_paired_difference_and_verdict() -> None:
    a = {f"j{i}": 100.0 + i for i in range(30)}
    b = {f"j{i}": 80.0 + i for i in range(30)}
    diff = paired_difference(a, b)
    assert diff.estimate == pytest.approx(-20)
    assert diff.high < 0
    assert verdict(diff, "jct_s") == "jct_s: B is better by 20"
    same = paired_difference(a, a)
    assert "no significant difference" in verdict(same, "jct_s")


def test_watchdog_trips_on_the_failed_rate_in_the_window_only() -> None:
    from streams.evaluators.watchdog import WatchdogPolicy, failover_reason

    policy = WatchdogPolicy("standby", failed_rate=0.5, window=timedelta(hours=1), min_finished=4)
    ledger = Ledger()
    for i in range(4):  # old failures, outside the window at the end
        job_life(ledger, f"old-{i}", 0, 0, 60, gpus=1, failed=True)
    for i in range(4):
        job_life(ledger, f"new-{i}", 7200, 7200, 7300 + i, gpus=1, failed=i == 0)
    assert failover_reason(ledger, policy) is None  # 1 of 4 recent failed
    job_life(ledger, "bad-1", 7300, 7300, 7400, gpus=1, failed=True)
    job_life(ledger, "bad-2", 7300, 7300, 7401, gpus=1, failed=True)
    reason = failover_reason(ledger, policy)
    assert reason is not None
    assert "3 of 6 jobs failed" in reason
    assert failover_reason(Ledger(), policy) is None
