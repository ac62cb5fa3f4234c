"""The processor without a broker: bad input dead-lettered, offsets skipped after a
restart, snapshots of what changed, errors said once."""

from __future__ import annotations

import orjson
import pytest

from schemas import encode
from schemas.codec import CodecError, decode
from schemas.dlq import FailureKind
from schemas.envelope import Event
from schemas.jobs import (
    JobCompleted,
    JobFailed,
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeOOM,
    NodeRef,
    OOMKind,
    RoleSpec,
)
from schemas.plans import OptimizePlan, OptimizeRequest, ScalePlan
from streams.brain.core.inputs import SAMPLE_DECODES, SampleDecode, input_reader
from streams.brain.core.optimizers.numeric import GiB
from streams.brain.core.processor import BrainProcessor
from streams.brain.core.snapshot import Loaded
from streams.brain.core.state import JobStatus
from tests.unit.brain.builders import ENV, T0, Rec

TOPIC = f"{ENV}.job.events"
JOB = JobMeta(uuid="job-p")


def records(values: list[bytes | None], start: int = 0, partition: int = 1) -> list[Rec]:
    return [Rec(TOPIC, partition, start + i, JOB.uuid.encode(), v) for i, v in enumerate(values)]


def lifecycle() -> list[Event]:
    role = RoleSpec(replicas=2, cpu=8, memory=16 * GiB)
    return [
        JobSubmitted(env=ENV, job=JOB, occurred_at=T0, roles={"worker": role}),
        JobStarted(env=ENV, job=JOB, occurred_at=T0),
        NodeOOM(
            env=ENV,
            job=JOB,
            occurred_at=T0,
            node=NodeRef(type="worker", id=0),
            kind=OOMKind.HOST_MEMORY,
            memory=16 * GiB,
        ),
    ]


def processor() -> BrainProcessor:
    return BrainProcessor(ENV, f"{ENV}.brain")


def test_plans_come_out_in_order_and_offsets_advance() -> None:
    p = processor()
    out = p.process(records([encode(e) for e in lifecycle()]))
    assert [type(x) for x in out.plans] == [OptimizePlan, ScalePlan]
    assert out.plans[0].optimizer == "host-oom"  # type: ignore[union-attr]
    assert p.offsets == {(TOPIC, 1): 3}
    assert p.counters.processed == 3 and p.counters.scale_plans == 1


def test_bad_input_is_dead_lettered_and_passed() -> None:
    other_env = JobStarted(env="elsewhere", job=JOB, occurred_at=T0)
    newer = {**orjson.loads(encode(JobStarted(env=ENV, job=JOB))), "schema_version": 99}
    p = processor()
    out = p.process(
        records([b"\xff", None, encode(other_env), orjson.dumps(newer), b'{"type":"nope"}'])
    )
    assert [letter.error_kind for letter in out.letters] == [
        FailureKind.MALFORMED,
        FailureKind.MALFORMED,
        FailureKind.WRONG_ENV,
        FailureKind.UNSUPPORTED_VERSION,
        FailureKind.UNKNOWN_TYPE,
    ]
    assert out.letters[0].value_bytes() == b"\xff"
    assert [letter.offset for letter in out.letters] == [0, 1, 2, 3, 4]
    assert p.offsets == {(TOPIC, 1): 5}
    assert p.counters.dead_lettered == 5 and p.states == {}


@pytest.mark.parametrize("way", SAMPLE_DECODES)
def test_the_brains_read_fails_exactly_as_decode(way: SampleDecode) -> None:
    read = input_reader(way)
    for raw in (b"[1]", b'{"type": "job.started"}', b"", b'{"type": "job.started", "env": 1}'):
        try:
            decode(raw)
        except CodecError as expected:
            try:
                read(raw)
            except CodecError as got:
                assert (got.kind, got.message) == (expected.kind, expected.message)
            else:
                raise AssertionError(f"the {way} read accepted {raw!r}")


def test_a_restart_skips_what_its_checkpoint_includes() -> None:
    first = processor()
    values = [encode(e) for e in lifecycle()]
    first.process(records(values[:2]))
    snap = first.snapshot()
    assert set(snap.states) == {JOB.uuid} and snap.offsets == {(TOPIC, 1): 2}
    assert first.snapshot().states == {}  # only what changed since

    restarted = processor()
    states = {u: (part, state) for u, (part, state) in snap.states.items()}
    restarted.install({1}, Loaded(states, snap.offsets))
    out = restarted.process(records(values))  # the broker gives everything again
    assert restarted.counters.skipped == 2 and restarted.counters.processed == 1
    assert [type(x) for x in out.plans] == [OptimizePlan, ScalePlan]

    restarted.drop({1})
    assert restarted.states == {} and restarted.offsets == {} and restarted.loaded == set()


def test_an_unwritten_snapshot_is_written_next_time() -> None:
    p = processor()
    p.process(records([encode(e) for e in lifecycle()]))
    snap = p.snapshot()
    p.restore(snap)
    again = p.snapshot()
    assert set(again.states) == set(snap.states)
    assert again.offsets == snap.offsets
    assert [x.plan_id for x in again.plans] == [x.plan_id for x in snap.plans]


def test_a_route_error_is_said_once_per_change() -> None:
    def request(optimizer: str) -> OptimizeRequest:
        return OptimizeRequest(
            env=ENV, job=JOB, occurred_at=T0, stage="worker-initial", optimizer=optimizer
        )

    p = processor()
    events = [lifecycle()[0], request("nope"), request("nope"), request("nada")]
    out = p.process(records([encode(e) for e in events]))
    assert p.counters.errors == 3
    prefix = "brain: unknown_optimizer: unknown optimizer"
    assert [letter.error.split(";")[0] for letter in out.letters] == [
        f"{prefix} 'nope'",
        f"{prefix} 'nada'",
    ]
    assert all(letter.error_kind == FailureKind.HANDLER for letter in out.letters)


def test_free_gpus_are_the_clusters_less_what_jobs_hold_or_wait_for() -> None:
    from schemas import JobCompleted, JobMeta, JobStarted, JobSubmitted, encode
    from schemas.env_settings import BrainSettings
    from schemas.jobs import RoleSpec
    from streams.brain.core.policy import Policy
    from streams.brain.core.processor import BrainProcessor

    class Rec:
        def __init__(self, offset: int, value: bytes) -> None:
            self.topic, self.partition, self.offset, self.key, self.value = (
                "e.job.events",
                0,
                offset,
                None,
                value,
            )

    proc = BrainProcessor("e", "e.brain", Policy(BrainSettings(cluster_gpus=16)))
    assert proc.free_gpus() == 16
    assert BrainProcessor("e", "e.brain").free_gpus() is None
    events = []
    for i, replicas in enumerate((4, 6)):
        job = JobMeta(uuid=f"j{i}")
        events.append(
            JobSubmitted(env="e", job=job, roles={"worker": RoleSpec(replicas=replicas, gpu_num=1)})
        )
        events.append(JobStarted(env="e", job=job))
    proc.process(Rec(i, encode(e)) for i, e in enumerate(events[:2]))
    assert proc.free_gpus() == 12  # j0 runs on 4
    proc.process(Rec(i + 2, encode(e)) for i, e in enumerate(events[2:3]))
    assert proc.free_gpus() == 6  # j1 waits for 6: not free for j0 to grow into
    proc.process(Rec(i + 3, encode(e)) for i, e in enumerate(events[3:]))
    assert proc.free_gpus() == 6  # ...and holds them once it runs
    done = JobCompleted(env="e", job=JobMeta(uuid="j0"))
    proc.process([Rec(5, encode(done))])
    assert proc.free_gpus() == 10


def test_a_finished_job_leaves_memory_once_checkpointed() -> None:
    events = [*lifecycle(), JobCompleted(env=ENV, job=JOB, occurred_at=T0)]
    p = processor()
    p.process(records([encode(e) for e in events]))
    assert JOB.uuid in p.states  # not checkpointed yet: still here

    snap = p.snapshot()
    assert snap.states[JOB.uuid][1].status == JobStatus.COMPLETED  # its last state is saved
    assert JOB.uuid not in p.states and p.finished == {JOB.uuid: 1}

    p.restore(snap)  # that checkpoint failed: the state is back until one is written
    assert p.snapshot().states[JOB.uuid][1].status == JobStatus.COMPLETED
    assert JOB.uuid not in p.states

    late = JobStarted(env=ENV, job=JOB, occurred_at=T0)
    out = p.process(records([encode(late)], start=len(events)))
    assert out.plans == [] and JOB.uuid not in p.states and p.counters.ignored == 1

    again = processor()  # a restart loads the finished job as finished, not as a state
    again.install([1], Loaded({JOB.uuid: (1, snap.states[JOB.uuid][1])}, {(TOPIC, 1): 5}))
    assert again.states == {} and again.finished == {JOB.uuid: 1}


def test_late_events_of_a_finished_job_change_nothing_before_the_checkpoint() -> None:
    """Issue 15: until the next checkpoint evicted it, a finished job's state took in its
    late events (a sample, an OOM, even a failure after its success)."""
    done = JobCompleted(env=ENV, job=JOB, occurred_at=T0)
    p = processor()
    p.process(records([encode(e) for e in [*lifecycle(), done]]))
    final = p.states[JOB.uuid]
    assert final.status == JobStatus.COMPLETED
    late: list[Event] = [
        NodeOOM(
            env=ENV,
            job=JOB,
            occurred_at=T0,
            node=NodeRef(type="worker", id=1),
            kind=OOMKind.HOST_MEMORY,
            memory=16 * GiB,
        ),
        OptimizeRequest(env=ENV, job=JOB, occurred_at=T0, stage="running", optimizer="host-oom"),
        JobStarted(env=ENV, job=JOB, occurred_at=T0),
        JobFailed(env=ENV, job=JOB, occurred_at=T0, reason="after the end"),
    ]
    before = p.counters.processed
    out = p.process(records([encode(e) for e in late], start=4))
    assert out.plans == [] and out.letters == []
    assert p.states[JOB.uuid] is final  # not one field of it changed
    assert p.counters.late == len(late) and p.counters.processed == before
    snap = p.snapshot()
    assert snap.states[JOB.uuid][1] is final  # the final state is what is saved
    assert snap.offsets == {(TOPIC, 1): 8}  # the late events are behind the offsets too
    # once evicted, the same: ignored and counted
    p.process(records([encode(late[0])], start=8))
    assert p.counters.late == len(late) + 1 and JOB.uuid not in p.states


def test_config_errors_are_dead_lettered_once_and_the_job_decided() -> None:
    p = processor()
    bad = lifecycle()[0].model_copy(update={"config": {"total_steps": "many"}})
    request = OptimizeRequest(env=ENV, job=JOB, occurred_at=T0, stage="worker-initial")
    out = p.process(records([encode(e) for e in (bad, request, request)]))
    assert [letter.error for letter in out.letters] == [
        "brain: invalid_config: config total_steps must be an integer >= 1, got 'many'"
        " (decided without it)"
    ]
    assert out.letters[0].error_kind == FailureKind.HANDLER
    assert p.counters.decisions == 3 and JOB.uuid in p.states


def _samples_of(job: JobMeta, count: int, start: int = 0) -> list[bytes]:
    from schemas.jobs import NodeUsage, RuntimeSample

    return [
        encode(
            RuntimeSample(
                env=ENV,
                job=job,
                occurred_at=T0,
                global_step=i,
                speed=1,
                nodes=[NodeUsage(type="worker", id=k, step_time=1.0 + k / 10) for k in range(3)],
            )
        )
        for i in range(start, start + count)
    ]


def test_a_jobs_memo_is_its_own_and_goes_with_it() -> None:
    """Each job's entry has its own memo, two processors in one process share none, and
    a job's memo leaves with the job (finished and checkpointed, or partition dropped)."""
    first, second = processor(), processor()
    for p in (first, second):
        p.process(records([encode(e) for e in lifecycle()[:2]]))
        p.process(records(_samples_of(JOB, 12), start=2))
    other = JobMeta(uuid="job-q")
    first.process(
        [Rec(TOPIC, 2, i, other.uuid.encode(), v) for i, v in enumerate(_samples_of(other, 3))]
    )
    memos = [first.jobs[JOB.uuid].memo, first.jobs["job-q"].memo, second.jobs[JOB.uuid].memo]
    assert len({id(m) for m in memos}) == 3
    assert len(memos[0]) > 0 and len(memos[2]) > 0  # the decisions derived through them
    first.drop([2])
    assert "job-q" not in first.jobs
    first.process(records([encode(JobCompleted(env=ENV, job=JOB, occurred_at=T0))], start=14))
    assert JOB.uuid in first.jobs  # until its last state is checkpointed
    first.snapshot()
    assert first.jobs == {} and first.states == {}
    assert second.states[JOB.uuid].stage == "running"  # the other processor unaffected


def _module_state() -> dict[str, object]:
    """What every module of the brain holds at module level in containers and caches."""
    import collections
    import importlib
    import pkgutil
    from functools import _lru_cache_wrapper

    import streams.brain as package

    found: dict[str, object] = {}
    for info in pkgutil.walk_packages(package.__path__, "streams.brain."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.startswith("__"):
                continue
            if isinstance(value, _lru_cache_wrapper):
                found[f"{info.name}.{name}"] = value.cache_info().currsize
            elif isinstance(value, dict | list | set | bytearray | collections.deque):
                found[f"{info.name}.{name}"] = repr(value)
    return found


def test_processing_leaves_no_state_at_module_level() -> None:
    """What the brain keeps, a processor keeps (per job): nothing at module level, which
    every brain of a process would share (`up` runs several services, `ab run` one brain
    per arm). Jobs that decide (goodput, stragglers, OOMs, requests) leave every
    module's containers and caches as they were."""
    before = _module_state()
    for p in (processor(), processor()):
        p.process(records([encode(e) for e in lifecycle()]))
        p.process(records(_samples_of(JOB, 30), start=3))
        request = OptimizeRequest(env=ENV, job=JOB, occurred_at=T0, stage="job_stage_running")
        p.process(records([encode(request)], start=33))
        assert p.counters.decisions > 5
        p.snapshot()
    assert _module_state() == before
