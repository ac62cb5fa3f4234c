"""Examples of matching and merging, as the issue states them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dlrover_events.config.matching import (
    Index,
    deep_merge,
    make_job,
    matches,
    norm_value,
    problems,
    resolve,
)
from schemas.config import ConfigDocument


def doc(name: str, **kw: object) -> ConfigDocument:
    return ConfigDocument.model_validate({"name": name, **kw})


ISSUE = doc(
    "issue",
    Include={"User": "user1", "Group": "group2"},
    Exclude={"Cluster": "cluster4"},
    Configure={"A": 1, "B": "C"},
)


def test_issue_example() -> None:
    assert matches(ISSUE, make_job({"user": "user1", "group": "group2", "cluster": "c1"}))
    assert matches(ISSUE, make_job({"user": "user1", "group": "group2"}))
    assert not matches(ISSUE, make_job({"user": "user1", "group": "group2", "cluster": "cluster4"}))
    assert not matches(ISSUE, make_job({"user": "user1"}))
    assert not matches(ISSUE, make_job({"user": "user2", "group": "group2"}))


def test_values_compare_in_their_json_spelling() -> None:
    d = doc("n", Include={"gpus": 8, "preemptible": True, "ratio": 2.0})
    assert matches(d, make_job({"GPUS": "8", "Preemptible": "true", "ratio": "2"}))
    assert not matches(d, make_job({"gpus": "8", "preemptible": "True", "ratio": "2"}))
    assert norm_value(2.5) == "2.5"


def test_values_are_case_sensitive_names_are_not() -> None:
    d = doc("n", Include={"USER": "Alice"})
    assert matches(d, make_job({"user": "Alice"}))
    assert not matches(d, make_job({"user": "alice"}))


def test_labels_and_lists() -> None:
    d = doc("n", Include={"labels.team": ["vision", "speech"]}, Exclude={"app": ["debug"]})
    assert matches(d, make_job({"Labels.Team": "speech", "app": "train"}))
    assert not matches(d, make_job({"labels.team": "speech", "app": "debug"}))
    assert not matches(d, make_job({"labels.team": "nlp"}))


def test_a_job_attribute_with_several_values() -> None:
    d = doc("n", Include={"group": "b"})
    assert matches(d, make_job({"group": ["a", "b"]}))


def test_merge_is_deep_and_specific_wins() -> None:
    docs = [
        doc("base", Configure={"opt": {"lr": 0.1, "momentum": 0.9}, "workers": 2}),
        doc("user", Include={"user": "u"}, Configure={"opt": {"lr": 0.01}}),
        doc(
            "user-cluster",
            Include={"user": "u", "cluster": "c"},
            Configure={"workers": 8},
        ),
        doc("loud", Include={"user": "u"}, Configure={"workers": 4}, priority=10),
    ]
    res = resolve(docs, make_job({"user": "u", "cluster": "c"}))
    assert res.config == {"opt": {"lr": 0.01, "momentum": 0.9}, "workers": 8}
    assert [s.name for s in res.sources] == ["user-cluster", "loud", "user", "base"]
    assert res.origin == {"opt": "user", "workers": "user-cluster"}


def test_ties_broken_by_priority_then_name() -> None:
    a = doc("a", Include={"user": "u"}, Configure={"k": "a"})
    b = doc("b", Include={"user": "u"}, Configure={"k": "b"})
    job = make_job({"user": "u"})
    assert resolve([b, a], job).config == {"k": "a"}
    b2 = b.model_copy(update={"priority": 1})
    assert resolve([a, b2], job).config == {"k": "b"}


def test_deep_merge_replaces_non_objects() -> None:
    assert deep_merge({"a": {"b": 1}}, {"a": 2}) == {"a": 2}
    assert deep_merge({"a": 2}, {"a": {"b": 1}}) == {"a": {"b": 1}}
    assert deep_merge({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}


def test_index_candidates_are_few() -> None:
    docs = [doc(f"d{i}", Include={"user": f"u{i}"}, Configure={"i": i}) for i in range(1000)]
    index = Index([*docs, doc("all", Configure={"x": 1})])
    job = make_job({"user": "u7", "group": "g"})
    assert index.candidates(job) == {"d7", "all"}
    assert index.resolve(job).config == {"i": 7, "x": 1}
    index.remove("d7")
    assert index.resolve(job).config == {"x": 1}
    gen = index.generation
    index.upsert(doc("d7", Include={"user": "u7"}, Configure={"i": 70}))
    assert index.generation > gen
    assert index.resolve(job).config == {"i": 70, "x": 1}


def test_problems_are_explained() -> None:
    assert problems(ISSUE) == []
    bad = doc("bad", Include={"User": "a", "user": "b", "group": [], "app": "a\x00"})
    found = problems(bad)
    assert any("same attribute" in p for p in found)
    assert any("empty list" in p for p in found)
    assert any("NUL" in p for p in found)
    # Configure is a bounded document at the contract itself: NUL, depth, int64
    for configure in ({"k": "a\x00"}, {"k": 2**63}, {"k": _nested(40)}):
        with pytest.raises(ValidationError):
            doc("bad", Configure=configure)


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def test_duplicate_spellings_still_have_a_meaning() -> None:
    # Include needs both spellings to hold; Exclude either.
    inc = doc("i", Include={"User": "a", "user": "b"})
    assert not matches(inc, make_job({"user": "a"}))
    assert matches(inc, make_job({"user": ["a", "b"]}))
    exc = doc("e", Exclude={"User": "a", "user": "b"})
    assert not matches(exc, make_job({"user": "b"}))
    assert matches(exc, make_job({"user": "c"}))
