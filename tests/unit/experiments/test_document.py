"""An experiment document is valid or one error naming its field, in the user's words."""

from __future__ import annotations

from typing import Any

import pytest

from dlrover_events.errors import UserError
from dlrover_events.experiments.document import (
    ExperimentInvalid,
    experiment_document,
    experiment_yaml,
)
from tests.unit.experiments.documents import document


def refused(data: Any, **kw: Any) -> ExperimentInvalid:
    with pytest.raises(ExperimentInvalid) as err:
        experiment_document(data, **kw)
    assert isinstance(err.value, UserError)  # the CLI prints it as one line
    assert "\n" not in str(err.value)
    return err.value


def test_a_valid_document_is_taken() -> None:
    doc = experiment_document(document("sweep"))
    assert doc.metadata.name == "sweep" and doc.spec.searcher.metric == "val_loss"


def test_an_unknown_field_is_named() -> None:
    err = refused(document(metirc="x"))
    assert (err.field, err.problem) == ("spec.searcher.metirc", "unknown field")
    assert str(err) == "spec.searcher.metirc: unknown field"


def test_a_wrong_type_is_named() -> None:
    doc = document()
    doc["spec"]["searcher"]["max_trials"] = "many"
    err = refused(doc)
    assert err.field == "spec.searcher.max_trials" and "integer" in err.problem


def test_a_missing_field_is_named() -> None:
    doc = document()
    del doc["spec"]["searcher"]["budget"]
    assert str(refused(doc)) == "spec.searcher.budget: required field missing"


def test_a_hyperparameters_kind_is_no_part_of_its_path() -> None:
    """pydantic puts the union's tag in the location (``lr.log.minval``); the document
    has no key ``log`` there."""
    doc = document()
    doc["spec"]["hyperparameters"]["lr"]["minval"] = "low"
    assert refused(doc).field == "spec.hyperparameters.lr.minval"
    doc = document()
    doc["spec"]["hyperparameters"]["lr"]["maxval"] = -9
    err = refused(doc)
    assert err.field == "spec.hyperparameters.lr" and "above maxval" in err.problem


def test_a_check_that_names_its_field_names_it_in_the_path() -> None:
    doc = document()
    doc["spec"]["trial"] = {"kind": "TrainingJob"}
    err = refused(doc)
    assert (err.field, err.problem) == ("spec.trial", "a TrainingJob document with a spec")


def test_more_errors_are_counted_not_listed() -> None:
    doc = document(metirc="x", seed=-1)
    assert refused(doc).problem.endswith("(and 1 more)")


def test_not_a_mapping() -> None:
    for data in ([], "x", 3, None):
        err = refused(data)
        assert err.field == "" and "mapping" in err.problem


def test_an_unknown_searcher_is_refused_where_the_registry_is_known() -> None:
    err = refused(document(name="nope"), searchers=["asha", "grid"])
    assert err.field == "spec.searcher.name"
    assert err.problem == "unknown searcher 'nope'; known: asha, grid"
    assert experiment_document(document(name="nope")).spec.searcher.name == "nope"


def test_yaml_problems_are_one_line() -> None:
    with pytest.raises(ExperimentInvalid, match=r"^not YAML: line 2: ") as err:
        experiment_yaml("a: [1, 2\nb: 3\n")
    assert "\n" not in str(err.value)
    with pytest.raises(ExperimentInvalid, match="one experiment per file, not 2"):
        experiment_yaml("a: 1\n---\nb: 2\n")
    with pytest.raises(ExperimentInvalid, match="one experiment per file, not 0"):
        experiment_yaml("")
    with pytest.raises(ExperimentInvalid, match=r"^spec\.searcher: required field missing$"):
        experiment_yaml(
            "metadata: {name: x}\nspec:\n  hyperparameters: {a: {type: const, val: 1}}\n"
            "  trial: {spec: {}}\n"
        )


def test_a_path_names_one_place_whatever_its_keys_hold() -> None:
    doc = document()
    doc["spec"]["hyperparameters"]["opt.lr"] = {"type": "int", "minval": "x", "maxval": 2}
    assert refused(doc).field == 'spec.hyperparameters["opt.lr"].minval'
    doc = document()
    doc["."] = 1
    assert str(refused(doc)) == '["."]: unknown field'
    doc = document()
    doc["spec"]["hyperparameters"]["act"]["vals"] = ["relu", [1]]  # a plain union's labels
    assert refused(doc).field == "spec.hyperparameters.act.vals[1]"


def test_a_refused_key_is_the_field() -> None:
    doc = document()
    doc["spec"]["hyperparameters"]["bad name"] = {"type": "const", "val": 1}
    err = refused(doc)
    assert err.field == 'spec.hyperparameters["bad name"]'
    assert err.problem.startswith("not a valid name: String should match pattern")
