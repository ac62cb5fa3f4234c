"""`updated`, the folds' copy of a job's state, is pydantic's `model_copy(update=...)`:
the same values, the same fields set, the same JSON, and the original left as it was."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.plans import NodeResource
from streams.brain.core.state import JobStatus, Stage, updated
from tests.unit.brain.builders import state


@pytest.mark.parametrize(
    "update",
    [
        {},
        {"last_event_id": "e-1"},
        {"stage": Stage.RUNNING, "stage_samples": 3, "status": JobStatus.RUNNING},
        {"samples": [], "training": {"local_batch_size": 8}},
    ],
)
def test_updated_copies_as_model_copy_does(update: dict[str, Any]) -> None:
    before = state(stage_samples=1)
    want = before.model_copy(update=update)
    got = updated(before, update)
    assert type(got) is type(want)
    assert got.__dict__ == want.__dict__
    assert got.model_fields_set == want.model_fields_set
    assert got.model_dump_json() == want.model_dump_json()
    assert got.model_dump_json(exclude_unset=True) == want.model_dump_json(exclude_unset=True)
    assert got is not before and before.stage_samples == 1
    assert before.model_fields_set != got.model_fields_set or not update


def test_a_model_with_extra_fields_takes_pydantics_copy() -> None:
    class Open(NodeResource, extra="allow"):
        pass

    model = Open.model_validate({"cpu": 2, "more": 1})
    got = updated(model, {"cpu": 3})
    assert got.cpu == 3 and got.model_extra == {"more": 1}
    assert got.model_extra is not model.model_extra
