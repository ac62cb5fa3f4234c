"""The plan view's pure fold and tag, and the bounded book that keeps them."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiokafka import ConsumerRecord

from dlrover_events.lifecycle import Stopping
from handlers.gateway.plan_state import Busy, PlanBook
from handlers.gateway.plans import RESULTS_KEPT, JobPlans, fold, has_nul, read_record, render
from schemas.codec import encode
from schemas.jobs import (
    JobCompleted,
    JobEvent,
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeRef,
)
from schemas.plans import (
    JobPlan,
    OptimizePlan,
    ResourcePlan,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
    TrainingApplied,
)

ENV = "e"
JOB = JobMeta(uuid="j1", user="u1")


def submitted(job: JobMeta = JOB) -> JobSubmitted:
    return JobSubmitted(env=ENV, job=job)


def optimize_plan(plan_id: str = "o1", job: JobMeta = JOB, caused_by: str = "c") -> OptimizePlan:
    return OptimizePlan(
        env=ENV,
        job=job,
        plan_id=plan_id,
        stage="create",
        optimizer="x",
        reason="r",
        resource=ResourcePlan(),
        caused_by=caused_by,
    )


def scale_plan(plan_id: str = "s1", job: JobMeta = JOB) -> ScalePlan:
    return ScalePlan(env=ENV, job=job, plan_id=plan_id, training={"local_batch_size": 32})


def result(plan_id: str = "s1", job: JobMeta = JOB) -> ScaleResult:
    return ScaleResult(env=ENV, job=job, plan_id=plan_id, status=ScaleStatus.APPLIED)


def applied(plan_id: str = "s1") -> TrainingApplied:
    return TrainingApplied(
        env=ENV,
        job=JOB,
        plan_id=plan_id,
        node=NodeRef(type="worker", id=0),
        training={"local_batch_size": 32},
        global_step=5,
    )


def fold_all(events: list[JobEvent]) -> JobPlans | None:
    view = None
    for e in events:
        view = fold(view, e)
    return view


def test_a_job_is_known_from_its_submission_or_a_plan_not_from_its_end_alone() -> None:
    assert fold(None, JobCompleted(env=ENV, job=JOB)) is None
    assert fold(None, submitted()) == JobPlans(job=JOB, submitted=True)
    from_plan = fold(None, scale_plan())
    assert from_plan is not None and not from_plan.submitted
    assert fold(None, JobStarted(env=ENV, job=JOB)) == JobPlans(job=JOB)


def test_the_plan_is_the_latest_of_each_part_and_the_result_of_that_scale_plan() -> None:
    view = fold_all(
        [
            submitted(),
            optimize_plan("o1"),
            scale_plan("s1"),
            result("s1"),
            optimize_plan("o2"),
            scale_plan("s2"),
            applied("s1"),
        ]
    )
    assert view is not None
    plan = view.plan()
    assert plan.optimize_plan is not None and plan.optimize_plan.plan_id == "o2"
    assert plan.scale_plan is not None and plan.scale_plan.plan_id == "s2"
    assert plan.result is None  # s2 not answered yet: s1's result is not s2's
    assert plan.training_applied is not None and plan.training_applied.plan_id == "s1"
    later = fold(view, result("s2"))
    assert later is not None and later.plan().knobs_to_apply() == ("s2", {"local_batch_size": 32})


def test_a_result_read_before_its_plan_is_matched_when_the_plan_comes() -> None:
    answer = result("s1")
    view = fold_all([submitted(), answer, scale_plan("s1")])
    assert view is not None and view.result() == answer
    many = fold_all([submitted(), *(result(f"s{i}") for i in range(3 * RESULTS_KEPT))])
    assert many is not None and len(many.results) == RESULTS_KEPT


def test_the_meta_comes_from_the_submission_once_it_was_read() -> None:
    other = JobMeta(uuid="j1", user="someone-else")
    view = fold_all([scale_plan(job=other), submitted(), optimize_plan(job=other)])
    assert view is not None and view.job == JOB


def test_the_tag_is_strong_and_follows_the_body() -> None:
    view = fold_all([submitted(), scale_plan()])
    assert view is not None
    one, again = render(view), render(view)
    assert one == again and one.etag.startswith('"') and not one.etag.startswith("W/")
    assert JobPlan.model_validate_json(one.body) == view.plan()
    changed = fold(view, result())
    assert changed is not None and render(changed).etag != one.etag


def record(value: bytes | None) -> ConsumerRecord:
    return ConsumerRecord("e.job.events", 0, 0, 0, 0, b"j1", value, None, 0, 0, ())


def test_records_are_read_for_what_the_view_needs_only() -> None:
    event = submitted()
    assert read_record(ENV, record(encode(event))) == event
    assert read_record(ENV, record(encode(JobStarted(env=ENV, job=JOB)))) is None
    assert read_record(ENV, record(None)) is None
    assert "not JSON" in str(read_record(ENV, record(b"{nope")))
    assert "env 'other'" in str(
        read_record(ENV, record(encode(JobSubmitted(env="other", job=JOB))))
    )
    bad = orjson.dumps({"type": "scale.plan", "env": ENV})
    assert isinstance(read_record(ENV, record(bad)), str)


def test_nul_is_found_anywhere() -> None:
    assert has_nul({"a": [1, {"b": "x\x00"}]})
    assert has_nul({"a\x00": 1})
    assert not has_nul({"a": [1, 2.5, None, True, {"b": "x"}]})


def job(i: int) -> JobMeta:
    return JobMeta(uuid=f"j{i}")


def test_the_book_evicts_finished_jobs_first_then_the_longest_idle() -> None:
    book = PlanBook(ENV, max_jobs=3)
    book.apply([submitted(job(1)), submitted(job(2)), submitted(job(3))])
    book.apply([JobCompleted(env=ENV, job=job(2))])
    book.apply([submitted(job(4))])
    assert book.view("j2") is None and len(book) == 3  # finished, though not the oldest
    book.apply([scale_plan(job=job(1))])  # j1 changed: j3 is now the longest idle
    book.apply([submitted(job(5))])
    assert book.view("j3") is None
    assert {j for j in ("j1", "j4", "j5") if book.view(j) is not None} == {"j1", "j4", "j5"}
    assert book.evicted == 2


async def test_a_waiter_wakes_on_its_jobs_change_only() -> None:
    book = PlanBook(ENV)
    book.apply([submitted(job(1)), submitted(job(2))])
    first = book.answer("j1")
    assert first is not None
    with book.admit():
        waiting = asyncio.create_task(book.wait_for_change("j1", {first.etag}, 5))
        await asyncio.sleep(0.01)
        book.apply([scale_plan(job=job(2))])  # another job
        book.apply([submitted(job(1))])  # the same view again: not a change
        await asyncio.sleep(0.01)
        assert not waiting.done()
        book.apply([scale_plan(job=job(1))])
        got = await asyncio.wait_for(waiting, 1)
    assert got is not None and got.etag != first.etag
    assert book._ticks == {}  # no wake-up left behind
    with book.admit():
        same = await book.wait_for_change("j1", {got.etag}, 0.05)
    assert same == got and book._ticks == {}


def test_the_waiters_are_capped() -> None:
    book = PlanBook(ENV, max_waiters=1)
    with book.admit(), pytest.raises(Busy), book.admit():
        pass
    assert book.waiting == 0


async def test_an_optimize_request_is_answered_by_the_plan_it_caused() -> None:
    book = PlanBook(ENV)
    future = book.expect("req-1")
    book.apply([optimize_plan("o1", caused_by="req-0")])
    assert not future.done()
    book.apply([optimize_plan("o2", caused_by="req-1")])
    assert future.done() and future.result().plan_id == "o2"
    assert book._pending == {}


async def test_closing_answers_every_waiter_at_once() -> None:
    """The gateway stops: long-polls get the answer they have, optimize requests still
    waiting end with Stopping, and no new one is taken."""
    book = PlanBook(ENV)
    book.apply([submitted(job(1))])
    first = book.answer("j1")
    assert first is not None
    asked = book.expect("req-1")
    with book.admit():
        waiting = asyncio.create_task(book.wait_for_change("j1", {first.etag}, 60))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        book.close()
        assert await asyncio.wait_for(waiting, 1) == first
    with pytest.raises(Stopping):
        asked.result()
    with pytest.raises(Stopping):
        book.expect("req-2")
    with book.admit():  # a long-poll that comes while the server closes does not wait
        assert await asyncio.wait_for(book.wait_for_change("j1", {first.etag}, 60), 1) == first
