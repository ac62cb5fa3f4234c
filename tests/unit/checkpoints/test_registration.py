"""What a registration may say, pure: a body of ``POST /v1/models/{name}/versions``
(handlers/experiments/models.py `registration`) and a model's name, notes and labels
(dlrover_events/checkpoints/store.py): any JSON is either taken or refused with a 4xx and
a message, never a traceback."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_events.checkpoints.store import (
    MAX_LABELS,
    RegistrationRefused,
    check_model_name,
    check_registration,
)
from handlers.experiments.http import Refused
from handlers.experiments.models import registration

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=12,
)
fields = st.sampled_from(["checkpoint", "best_of", "notes", "labels", "description", "other"])


@given(st.dictionaries(fields, json_values, max_size=5) | json_values)
def test_any_body_is_taken_or_refused_with_a_4xx(body: object) -> None:
    try:
        taken = registration(body)
    except Refused as e:
        assert 400 <= e.status < 500 and str(e)
        return
    assert isinstance(taken, dict) and ("checkpoint" in taken) != ("best_of" in taken)
    assert all(isinstance(x, str) for x in taken.get("labels", []))


def test_a_body_names_one_checkpoint_or_one_experiment() -> None:
    assert registration({"checkpoint": "c1", "labels": ["a"]}) == {
        "checkpoint": "c1",
        "labels": ["a"],
    }
    with pytest.raises(Refused, match="give one of"):
        registration({"checkpoint": "c1", "best_of": "e"})
    with pytest.raises(Refused, match="unknown field 'colour'"):
        registration({"checkpoint": "c1", "colour": "red"})


@pytest.mark.parametrize("name", ["m", "resnet-50", "gpt_2.small", "A1"])
def test_model_names(name: str) -> None:
    assert check_model_name(name) == name


@pytest.mark.parametrize("name", ["", "-m", "a b", "a/b", "x" * 129, "m\x00", "m\n"])
def test_bad_model_names(name: str) -> None:
    with pytest.raises(RegistrationRefused, match="model name"):
        check_model_name(name)


def test_labels_kept_once_in_order_and_bounded() -> None:
    assert check_registration("notes", ["b", "a", "b"]) == ["b", "a"]
    with pytest.raises(RegistrationRefused, match="at most"):
        check_registration("", [f"l{i}" for i in range(MAX_LABELS + 1)])
    with pytest.raises(RegistrationRefused, match="NUL"):
        check_registration("a\x00", [])
    with pytest.raises(RegistrationRefused, match="label"):
        check_registration("", [""])
