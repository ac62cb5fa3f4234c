"""The evaluator extension point (`streams/evaluators/api.py`): the evaluators are named in
one registry, each says which of its metrics are better higher, and an unknown name is
refused in one line."""

from __future__ import annotations

import pytest

from streams.evaluators import kpis
from streams.evaluators.api import EvaluatorError, UnknownEvaluator
from streams.evaluators.registry import EVALUATORS, HIGHER_IS_BETTER, evaluate


def test_each_evaluator_is_a_kpi_function_and_says_its_better_higher_metrics() -> None:
    assert set(EVALUATORS) == {"jct", "queueing", "gpu_hours", "throughput", "oom", "churn"} | {
        "failures",
        "experiments",
    }
    for name, spec in EVALUATORS.items():
        assert spec.name == name and spec.description
        assert spec.fn.__module__ == kpis.__name__
        answered = set(spec.fn([], None))
        assert spec.higher_is_better <= answered, name  # it names metrics it answers
    assert {"throughput_per_gpu", "jobs_completed", "other_jobs_completed"} == HIGHER_IS_BETTER


def test_the_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        EVALUATORS["mine"] = EVALUATORS["jct"]  # type: ignore[index]


def test_an_unknown_evaluator_is_one_line_with_the_known_ones() -> None:
    with pytest.raises(UnknownEvaluator) as err:
        evaluate([], None, ["jct", "nope"])
    assert isinstance(err.value, KeyError) and isinstance(err.value, EvaluatorError)
    assert str(err.value) == (
        "unknown evaluator(s) ['nope']; known: "
        "['churn', 'experiments', 'failures', 'gpu_hours', 'jct', 'oom', 'queueing', "
        "'throughput']"
    )
