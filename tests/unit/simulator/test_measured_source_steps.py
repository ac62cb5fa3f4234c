"""How long a replayed job trains when it does not say: the replay adds the last global
step of its samples in the source to the submission it copies, and the simulator reads
it, under the same key, only when the job states no total_steps."""

from __future__ import annotations

from handlers.simulator import measured
from schemas.jobs import JobMeta, JobStarted, JobSubmitted, RuntimeSample
from streams.replay import core

JOB = JobMeta(uuid="j-1")


def sample(job: str, step: int) -> RuntimeSample:
    return RuntimeSample(env="prod", job=JobMeta(uuid=job), global_step=step, speed=1.0)


def test_both_sides_use_one_key() -> None:
    assert measured.SOURCE_STEPS == core.SOURCE_STEPS


def test_the_source_steps_are_each_jobs_largest_step() -> None:
    events = [sample("j-1", 5), sample("j-2", 7), sample("j-1", 300), sample("j-1", 200)]
    assert core.source_steps([*events, JobStarted(env="prod", job=JOB)]) == {
        "j-1": 300,
        "j-2": 7,
    }


def test_a_submission_carries_them_only_when_it_states_no_length() -> None:
    steps = {"j-1": 300}
    bare = JobSubmitted(env="prod", job=JOB, config={"lr": 0.1})
    carried = core.with_source_steps(bare, steps)
    assert isinstance(carried, JobSubmitted)
    assert carried.config == {"lr": 0.1, core.SOURCE_STEPS: 300}
    assert carried.event_id == bare.event_id, "the same event, for every arm alike"
    assert measured.total_steps(carried) == 300
    stated = bare.model_copy(update={"config": {"total_steps": 50}})
    assert core.with_source_steps(stated, steps) is stated
    assert measured.total_steps(stated) == 50
    assert core.with_source_steps(bare, {}) is bare, "no sample in the source: nothing"
    assert measured.total_steps(bare) is None
    other = JobStarted(env="prod", job=JOB)
    assert core.with_source_steps(other, steps) is other
