"""ConfigMap -> document and desired-vs-current planning: pure, no cluster, no store."""

from __future__ import annotations

from typing import Any

import pytest

from handlers.gateway.configmaps import (
    ENV_LABEL,
    LABEL,
    Create,
    Delete,
    Desired,
    Skipped,
    Update,
    desired,
    document_name,
    owned_prefix,
    plan,
    to_document,
    wanted,
)
from schemas.config import ConfigDocument

NS = "team-a"
ENV = "prod"


def cm(name: str, text: str | None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {LABEL: "true"} if labels is None else labels,
        }
    }
    if text is not None:
        out["data"] = {"document.yaml": text}
    return out


DOC = """
Include: {User: user1, Group: [g1, g2]}
Exclude: {Cluster: cluster4}
Configure: {A: 1, B: C, when: 2024-05-01}
priority: 3
"""


def stored(doc: ConfigDocument, version: int) -> ConfigDocument:
    """The document as the store gives it back: JSON round trip, its version."""
    back = ConfigDocument.model_validate(doc.model_dump(mode="json", by_alias=True))
    return back.model_copy(update={"version": version})


def test_a_configmap_becomes_a_document_named_after_namespace_and_name() -> None:
    doc = to_document(cm("knobs", DOC), NS)
    assert isinstance(doc, ConfigDocument)
    assert doc.name == "cm.team-a.knobs" == document_name(NS, "knobs")
    assert doc.include == {"User": "user1", "Group": ["g1", "g2"]}
    assert doc.exclude == {"Cluster": "cluster4"}
    assert doc.priority == 3
    # YAML's date is carried as JSON would carry it, so the stored copy compares equal.
    assert doc.configure == {"A": 1, "B": "C", "when": "2024-05-01"}


def test_an_empty_document_is_a_document_that_matches_every_job() -> None:
    doc = to_document(cm("empty", ""), NS)
    assert isinstance(doc, ConfigDocument)
    assert (doc.include, doc.exclude, doc.configure) == ({}, {}, {})


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (None, "no 'document.yaml' key"),
        ("Include: [unclosed", "not valid YAML"),
        ("- a\n- b\n", "must be a mapping"),
        ("name: other\nConfigure: {a: 1}\n", "not name"),
        ("Configure: {a: 1}\nversion: 7\n", "not version"),
        ("priority: high\n", "does not validate"),
        ("Include: {user: {nested: 1}}\n", "does not validate"),
        ("Include: {User: a, user: b}\n", "name the same attribute"),
        ("Include: {user: []}\n", "empty list"),
        ("priority: 3000000000\n", "priority must be within"),
        ("Configure: {1: a}\n", "not representable as JSON"),
    ],
)
def test_an_unusable_document_is_skipped_with_a_reason(text: str | None, why: str) -> None:
    got = to_document(cm("bad", text), NS)
    assert isinstance(got, Skipped)
    assert got.configmap == "bad"
    assert why in got.reason


def test_a_name_too_long_for_a_document_is_skipped() -> None:
    got = to_document(cm("x" * 250, "Configure: {a: 1}"), NS)
    assert isinstance(got, Skipped)
    assert "name" in got.reason


@pytest.mark.parametrize(
    ("labels", "taken"),
    [
        ({LABEL: "true"}, True),
        ({LABEL: "true", ENV_LABEL: ENV}, True),
        ({LABEL: "true", ENV_LABEL: "shadow"}, False),
        ({LABEL: "false"}, False),
        ({}, False),
    ],
)
def test_an_env_takes_configmaps_for_it_or_for_any_env(labels: dict[str, str], taken: bool) -> None:
    assert wanted(cm("c", DOC, labels), ENV) is taken


def test_desired_splits_documents_from_skipped_and_drops_others() -> None:
    want = desired(
        [
            cm("good", DOC),
            cm("bad", "priority: high"),
            cm("elsewhere", DOC, {LABEL: "true", ENV_LABEL: "shadow"}),
        ],
        NS,
        ENV,
    )
    assert set(want.documents) == {"cm.team-a.good"}
    assert set(want.skipped) == {"cm.team-a.bad"}


def _doc(name: str, **configure: Any) -> ConfigDocument:
    return ConfigDocument.model_validate({"name": name, "Configure": configure})


def test_plan_creates_updates_and_deletes_only_what_differs() -> None:
    prefix = owned_prefix(NS)
    want = Desired(
        {
            "cm.team-a.new": _doc("cm.team-a.new", a=1),
            "cm.team-a.same": _doc("cm.team-a.same", a=1),
            "cm.team-a.changed": _doc("cm.team-a.changed", a=2),
        }
    )
    current = {
        "cm.team-a.same": stored(_doc("cm.team-a.same", a=1), 4),
        "cm.team-a.changed": stored(_doc("cm.team-a.changed", a=1), 2),
        "cm.team-a.gone": stored(_doc("cm.team-a.gone", a=1), 7),
        "cm.team-b.theirs": stored(_doc("cm.team-b.theirs"), 1),
        "admin-doc": stored(_doc("admin-doc"), 1),
    }
    assert plan(want, current, prefix) == [
        Update(want.documents["cm.team-a.changed"], 2),
        Delete("cm.team-a.gone", 7),
        Create(want.documents["cm.team-a.new"]),
    ]


def test_a_skipped_configmap_keeps_its_last_good_document() -> None:
    current = {"cm.team-a.typo": stored(_doc("cm.team-a.typo", a=1), 3)}
    want = Desired({}, {"cm.team-a.typo": Skipped("typo", "not valid YAML")})
    assert plan(want, current, owned_prefix(NS)) == []


def test_planning_again_from_the_result_plans_nothing() -> None:
    """The idempotence a re-list relies on: what the store holds after the writes (JSON
    round trip, new versions, timestamps) is what the ConfigMaps ask for."""
    want = desired([cm("a", DOC), cm("b", "Configure: {x: [1, 2.5, true, null]}")], NS, ENV)
    actions = plan(want, {}, owned_prefix(NS))
    assert all(isinstance(a, Create) for a in actions)
    after = {a.document.name: stored(a.document, 1) for a in actions if isinstance(a, Create)}
    assert plan(want, after, owned_prefix(NS)) == []
