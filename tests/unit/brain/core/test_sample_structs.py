"""The runtime sample is declared once (`schemas.jobs.RuntimeSample`): the brain's structs
are written from it, and a change of the contract reaches them or fails here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import AfterValidator, Field, model_validator

from schemas.bounds import Rate
from schemas.jobs import RuntimeSample
from streams.brain.core import sample_structs
from streams.brain.core.sample_codegen import CodegenError, render

REGENERATE = (
    ".venv/bin/python -m streams.brain.core.sample_codegen > streams/brain/core/sample_structs.py"
)


def test_the_committed_structs_are_written_from_the_contract() -> None:
    committed = Path(sample_structs.__file__).read_text("utf-8")
    assert committed == render(), f"the contract changed: run {REGENERATE}"


class _WithField(RuntimeSample):
    tokens_per_s: Rate | None = Field(default=None, description="a field added to the contract")


def test_a_field_added_to_the_contract_is_read_and_kept() -> None:
    source = render(_WithField)
    line = "    tokens_per_s: Annotated[float, Meta(ge=0, le=1000000000000.0)] | None = None"
    assert line in source  # in SampleValues: read off the bus and kept in the state
    assert "        tokens_per_s=of.tokens_per_s," in source  # copied into the stored sample
    assert "tokens_per_s" not in render()


def _odd(value: str) -> str:
    return value


class _WithValidator(RuntimeSample):
    tag: Annotated[str, AfterValidator(_odd)] = ""


class _WithModelCheck(RuntimeSample):
    @model_validator(mode="after")
    def _steps_even(self) -> _WithModelCheck:
        return self


class _WithUnboundedFloat(RuntimeSample):
    loss: float = 0.0


class _WithUnion(RuntimeSample):
    phase: Literal["a"] | int = 0


@pytest.mark.parametrize(
    ("model", "said"),
    [
        (_WithValidator, "SampleValues.tag: validator"),
        (_WithModelCheck, "_WithModelCheck._steps_even has no struct form"),
        (_WithUnboundedFloat, "SampleValues.loss: a float needs both bounds"),
        (_WithUnion, "SampleValues.phase: only `X | None` unions"),
    ],
)
def test_what_the_structs_cannot_state_exactly_fails_with_the_field(
    model: type[RuntimeSample], said: str
) -> None:
    """A field the fast read could not take exactly as pydantic does fails at once, named,
    instead of being read otherwise."""
    with pytest.raises(CodegenError, match=said.replace("|", r"\|")):
        render(model)
