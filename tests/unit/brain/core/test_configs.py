"""The brain's copy of the config service: index, per-job cache, precedence."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover_events.config.matching import Change, job_attributes, make_job
from handlers.gateway.state import GatewayState
from schemas.config import ConfigChange, ConfigDocument
from schemas.jobs import JobMeta
from streams.brain.core.config_index import ConfigIndex, effective_config

ALICE = JobMeta(uuid="j1", user="alice", scenario="bert", labels={"team": "speech"})
BOB = JobMeta(uuid="j2", user="bob", group="g")


def upsert(
    name: str,
    version: int,
    include: dict[str, Any] | None = None,
    exclude: dict[str, Any] | None = None,
    priority: int = 0,
    **conf: Any,
) -> ConfigChange:
    doc = ConfigDocument(
        name=name,
        version=version,
        include=include or {},
        exclude=exclude or {},
        configure=conf,
        priority=priority,
    )
    return ConfigChange(env="e", op="upsert", name=name, version=version, document=doc)


def delete(name: str, version: int) -> ConfigChange:
    return ConfigChange(env="e", op="delete", name=name, version=version)


def test_a_matching_document_gives_its_configure_and_others_get_nothing() -> None:
    idx = ConfigIndex()
    assert idx.config_for(ALICE) == {}
    idx.apply([upsert("a", 1, {"user": "alice"}, optimizer="goodput")])
    assert idx.config_for(ALICE) == {"optimizer": "goodput"}
    assert idx.config_for(BOB) == {}


def test_documents_target_every_job_attribute_as_the_gateway_does() -> None:
    idx = ConfigIndex()
    idx.apply(
        [
            upsert("team", 1, {"labels.team": "speech"}, a=1),
            upsert("scen", 1, {"Scenario": "bert"}, b=2),
            upsert("one", 1, {"job": "j1"}, c=3),
            upsert("ns", 1, {"namespace": "default"}, d=4),
            upsert("not-bob", 1, exclude={"group": "g"}, e=5),
            upsert("empty-cluster", 1, {"cluster": ""}, f=6),
        ]
    )
    assert idx.config_for(ALICE) == {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}
    assert idx.config_for(BOB) == {"d": 4}


def test_job_attributes_leave_out_empty_fields_and_spell_labels() -> None:
    assert job_attributes(ALICE) == {
        "job": "j1",
        "namespace": "default",
        "user": "alice",
        "scenario": "bert",
        "labels.team": "speech",
    }


def test_merge_of_documents_is_the_gateways() -> None:
    idx = ConfigIndex()
    idx.apply(
        [
            upsert("all", 1, optimizer="static", optimizer_params={"goodput": {"a": 1, "b": 1}}),
            upsert("mine", 1, {"user": "alice"}, optimizer_params={"goodput": {"b": 2}}),
        ]
    )
    assert idx.config_for(ALICE) == {
        "optimizer": "static",
        "optimizer_params": {"goodput": {"a": 1, "b": 2}},
    }


def test_delete_and_tombstone_remove_a_document() -> None:
    idx = ConfigIndex()
    idx.apply([upsert("a", 1, {"user": "alice"}, x=1), upsert("b", 1, {"user": "alice"}, y=2)])
    assert idx.apply([delete("a", 2)]) == 1
    assert idx.config_for(ALICE) == {"y": 2}
    assert idx.apply([("b", None)]) == 1
    assert idx.config_for(ALICE) == {}
    assert len(idx) == 0
    assert idx.apply([delete("gone", 3)]) == 0  # nothing held: nothing changes


def test_an_exact_replay_is_skipped_and_keeps_the_cache() -> None:
    idx = ConfigIndex()
    idx.apply([upsert("a", 2, {"user": "alice"}, x=1)])
    first = idx.config_for(ALICE)
    assert idx.apply([upsert("a", 2, {"user": "alice"}, x=1)]) == 0
    assert idx.ignored == 1
    assert idx.config_for(ALICE) is first


def test_a_lower_version_after_a_higher_one_wins_as_on_the_gateway() -> None:
    """The gateway's reconcile republishes Postgres' version over one whose commit
    failed; the brain must end where the gateway ends."""
    idx = ConfigIndex()
    idx.apply([upsert("a", 3, {"user": "alice"}, x=3), upsert("a", 2, {"user": "alice"}, x=2)])
    assert idx.config_for(ALICE) == {"x": 2}


def test_the_answer_is_cached_until_the_index_or_the_job_changes() -> None:
    idx = ConfigIndex()
    idx.apply([upsert("a", 1, {"user": "alice"}, x=1)])
    first = idx.config_for(ALICE)
    assert idx.config_for(ALICE) is first
    assert idx.config_for(ALICE.model_copy()) is first  # a restored state's equal meta
    idx.apply([upsert("other", 1, {"user": "carol"}, z=0)])  # not alice's, still a change
    second = idx.config_for(ALICE)
    assert second == first and second is not first
    idx.apply([upsert("a", 2, {"user": "alice"}, x=2)])
    assert idx.config_for(ALICE) == {"x": 2}
    moved = ALICE.model_copy(update={"user": "carol"})  # same job, new attributes
    assert idx.config_for(moved) == {"z": 0}


def test_precedence_env_default_then_documents_then_the_jobs_own() -> None:
    env = {"optimizer": "static", "optimizer_params": {"goodput": {"a": 0, "b": 0}}, "e": 1}
    service = {"optimizer": "goodput", "optimizer_params": {"goodput": {"b": 1, "c": 1}}}
    own = {"optimizer_params": {"goodput": {"c": 2}}, "total_steps": 10}
    assert effective_config(env, service, own) == {
        "optimizer": "goodput",
        "optimizer_params": {"goodput": {"a": 0, "b": 1, "c": 2}},
        "e": 1,
        "total_steps": 10,
    }
    # a job that names its optimizer keeps it; a value that is not an object replaces one
    assert effective_config(env, service, {"optimizer": {"running": "hot-ps"}})["optimizer"] == {
        "running": "hot-ps"
    }
    assert effective_config({}, {}, {}) == {}


# -- properties ---------------------------------------------------------------------------

KEYS = ["optimizer", "optimizer_params", "goodput", "a", "b"]
json_values = st.recursive(
    st.one_of(st.integers(-3, 3), st.sampled_from(["s", "t"]), st.booleans(), st.none()),
    lambda inner: st.dictionaries(st.sampled_from(KEYS), inner, max_size=3),
    max_leaves=8,
)
configs = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4)

Path = tuple[str, ...]


def leaves(conf: Mapping[str, Any], prefix: Path = ()) -> dict[Path, Any]:
    out: dict[Path, Any] = {}
    for key, value in conf.items():
        if isinstance(value, Mapping):
            out.update(leaves(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = value
    return out


def decides(conf: Mapping[str, Any], path: Path) -> bool:
    """Whether ``conf``, merged over something, decides what is at ``path``: it holds
    the path itself or replaces an object on the way with a value."""
    node: Any = conf
    for key in path:
        if key not in node:
            return False
        node = node[key]
        if not isinstance(node, Mapping):
            return True
    return True


def at(conf: Mapping[str, Any], path: Path) -> Any:
    node: Any = conf
    for key in path:
        node = node[key]
    return node


@settings(max_examples=300)
@given(configs, configs, configs)
def test_each_value_comes_from_the_highest_layer_that_has_it(
    env: dict[str, Any], service: dict[str, Any], own: dict[str, Any]
) -> None:
    merged = effective_config(env, service, own)
    for path, value in leaves(own).items():
        assert at(merged, path) == value
    for path, value in leaves(service).items():
        if not decides(own, path):
            assert at(merged, path) == value
    for path, value in leaves(env).items():
        if not decides(own, path) and not decides(service, path):
            assert at(merged, path) == value
    for path, value in leaves(merged).items():
        layers = [c for c in (own, service, env) if decides(c, path)]
        assert layers and at(layers[0], path) == value


ATTR_VALUES = ["a", "b"]
metas = st.builds(
    JobMeta,
    uuid=st.sampled_from(["j1", "j2"]),
    user=st.sampled_from(["", *ATTR_VALUES]),
    group=st.sampled_from(["", *ATTR_VALUES]),
    scenario=st.sampled_from(["", *ATTR_VALUES]),
    labels=st.dictionaries(st.sampled_from(["team"]), st.sampled_from(ATTR_VALUES)),
)
conditions = st.dictionaries(
    st.sampled_from(["user", "group", "scenario", "labels.team", "job"]),
    st.sampled_from([*ATTR_VALUES, "j1"]),
    max_size=2,
)
NAMES = ["d1", "d2", "d3"]


@st.composite
def changes(draw: st.DrawFn) -> Change:
    name = draw(st.sampled_from(NAMES))
    version = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["upsert", "upsert", "delete", "tombstone"]))
    if kind == "tombstone":
        return (name, None)
    if kind == "delete":
        return delete(name, version)
    return upsert(
        name,
        version,
        draw(conditions),
        draw(conditions),
        draw(st.integers(0, 1)),
        **draw(configs),
    )


@settings(max_examples=200)
@given(st.lists(changes(), max_size=12), st.lists(metas, min_size=1, max_size=3))
def test_the_brain_sees_what_the_gateway_serves(feed: list[Change], jobs: list[JobMeta]) -> None:
    idx = ConfigIndex()
    gateway = GatewayState("e")
    for change in feed:  # one at a time, asking in between: the cache must keep up
        idx.apply([change])
        gateway.apply([change])
        for job in jobs:
            served = gateway.index.resolve(make_job(job_attributes(job))).config
            assert idx.config_for(job) == served


@settings(max_examples=200)
@given(st.lists(changes(), max_size=12), st.lists(metas, min_size=1, max_size=3), st.data())
def test_deleting_every_document_leaves_nothing(
    feed: list[Change], jobs: list[JobMeta], data: st.DataObject
) -> None:
    idx = ConfigIndex()
    idx.apply(feed)
    for job in jobs:
        idx.config_for(job)  # fill the cache
    names = data.draw(st.permutations(NAMES))
    idx.apply(
        [(n, None) if data.draw(st.booleans()) else delete(n, 5) for n in names]  # any order
    )
    assert len(idx) == 0
    for job in jobs:
        assert idx.config_for(job) == {}
