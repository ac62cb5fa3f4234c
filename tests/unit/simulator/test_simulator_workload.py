"""Pollux workloads as submissions, and the static FIFO baseline over a whole workload."""

from __future__ import annotations

import csv
import io

from handlers.simulator.job import JobPhase
from handlers.simulator.throughput import load_application
from handlers.simulator.workload import parse_workload, read_workload, run_static, workload_path


def test_a_workload_becomes_submissions_in_arrival_order() -> None:
    path = workload_path("workload-6")
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    subs = read_workload(path)
    assert len(subs) == len(rows) == 160
    assert [s.time for s in subs] == sorted(float(r["time"]) for r in rows)
    by_name = {s.name: s for s in subs}
    for row in rows:
        event = by_name[row["name"]].event
        assert event.application == row["application"]
        assert event.batch_size == int(row["batch_size"])
        assert event.roles["worker"].replicas == int(row["num_replicas"])
        assert event.job.uuid == row["name"]


def test_fifo_admission_waits_behind_a_gang_that_does_not_fit() -> None:
    text = (
        "name,time,application,num_replicas,batch_size\n"
        "a,0,cifar10,4,2048\n"
        "b,10,cifar10,4,2048\n"
        "c,20,ncf,1,32768\n"
    )
    result = run_static(parse_workload(text), num_nodes=1, gpus_per_node=4)
    jobs = {j.name: j for j in result.jobs}
    assert result.all_completed
    assert jobs["b"].started is not None
    assert jobs["a"].completed is not None
    assert jobs["c"].started is not None
    assert jobs["b"].completed is not None
    assert jobs["b"].started >= jobs["a"].completed
    assert jobs["c"].started >= jobs["b"].completed, "strict FIFO: c waits behind b"


def test_workload_6_on_16_nodes_of_4_gpus_finishes_every_job() -> None:
    result = run_static(read_workload(workload_path("workload-6")), num_nodes=16, gpus_per_node=4)
    assert len(result.jobs) == 160
    assert result.all_completed
    assert {j.state for j in result.jobs} == {JobPhase.COMPLETED}
    for job in result.jobs:
        assert job.started is not None
        assert job.completed is not None
        assert job.submitted <= job.started < job.completed
    assert result.average_jct > 0
    again = run_static(read_workload(workload_path("workload-6")), num_nodes=16, gpus_per_node=4)
    assert again == result, "the same workload gives the same run"


def test_submissions_carry_the_traced_batch_limits() -> None:
    for sub in read_workload(workload_path("workload-6")):
        event = sub.event
        app = load_application(event.application)
        assert (event.min_local_batch_size, event.max_local_batch_size) == (
            app.min_local_bsz,
            app.max_local_bsz,
        )
        assert event.batch_size is not None
        if event.application == "ncf":
            # as the artifact runs it under Pollux: its workload batch, on one GPU
            assert not event.adaptive_batch_size
            assert event.min_batch_size == event.batch_size == event.max_batch_size
            assert event.roles["worker"].max_replicas == event.roles["worker"].replicas == 1
            continue
        assert event.adaptive_batch_size
        assert event.max_batch_size == app.max_batch_size
        assert event.batch_size <= event.max_batch_size
        # Pollux trains from the traced initial batch, not the baseline's (often the largest)
        assert event.min_batch_size == min(app.init_batch_size, event.batch_size)
        assert event.roles["worker"].max_replicas is None
