"""One envelope check for every reader: another env's event is refused the same way."""

from __future__ import annotations

import pytest

from schemas.codec import CodecError, check_env
from schemas.dlq import FailureKind
from schemas.jobs import JobMeta, JobStarted


def test_an_event_of_the_env_passes_unchanged() -> None:
    event = JobStarted(env="prod", job=JobMeta(uuid="j"))
    assert check_env(event, "prod", "prod.job.events") is event


def test_another_envs_event_is_refused_with_where_it_was_read() -> None:
    event = JobStarted(env="shadow", job=JobMeta(uuid="j"))
    with pytest.raises(CodecError) as refused:
        check_env(event, "prod", "prod.job.events")
    assert refused.value.kind == FailureKind.WRONG_ENV
    assert refused.value.message == (
        "event of env 'shadow' on topic 'prod.job.events' of env 'prod'"
    )
