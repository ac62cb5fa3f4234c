"""Properties of config matching and merging (dlrover_events/config/matching.py)."""

from __future__ import annotations

import string
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover_events.config.matching import (
    Index,
    compile_doc,
    make_job,
    matches,
    norm_key,
    resolve,
)
from schemas.config import ConfigDocument

ATTRS = ["user", "group", "cluster", "namespace", "app", "scenario", "job", "labels.team"]
VALUES = ["a", "b", "c", "1", "x-y"]
CONF_KEYS = ["A", "B", "C", "lr", "nested"]


def recase(draw: st.DrawFn, key: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(key), max_size=len(key)))
    return "".join(c.upper() if f else c for c, f in zip(key, flips, strict=True))


@st.composite
def cond_values(draw: st.DrawFn) -> Any:
    one = st.sampled_from(VALUES)
    return draw(st.one_of(one, st.lists(one, min_size=1, max_size=3, unique=True)))


@st.composite
def conditions(draw: st.DrawFn, max_size: int = 3) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(ATTRS), max_size=max_size, unique=True))
    return {recase(draw, k): draw(cond_values()) for k in keys}


configure_values = st.recursive(
    st.one_of(st.integers(-5, 5), st.sampled_from(["s", "t"]), st.booleans()),
    lambda inner: st.dictionaries(st.sampled_from(CONF_KEYS), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def documents(draw: st.DrawFn, name: str | None = None) -> ConfigDocument:
    return ConfigDocument(
        name=name or draw(st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True)),
        include=draw(conditions()),
        exclude=draw(conditions(max_size=2)),
        configure=draw(st.dictionaries(st.sampled_from(CONF_KEYS), configure_values, max_size=3)),
        priority=draw(st.integers(-2, 2)),
        version=draw(st.integers(1, 5)),
    )


@st.composite
def doc_sets(draw: st.DrawFn, max_size: int = 8) -> list[ConfigDocument]:
    names = draw(
        st.lists(
            st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True), max_size=max_size, unique=True
        )
    )
    return [draw(documents(name=n)) for n in names]


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, str]:
    keys = draw(st.lists(st.sampled_from(ATTRS), max_size=len(ATTRS), unique=True))
    return {recase(draw, k): draw(st.sampled_from(VALUES)) for k in keys}


def answer(docs: list[ConfigDocument], job: dict[str, str]) -> dict[str, Any]:
    return resolve(docs, make_job(job)).as_json()


@given(doc_sets(), jobs(), st.randoms(use_true_random=False))
def test_order_of_documents_does_not_matter(
    docs: list[ConfigDocument], job: dict[str, str], rnd: Any
) -> None:
    shuffled = list(docs)
    rnd.shuffle(shuffled)
    a = resolve(docs, make_job(job))
    b = resolve(shuffled, make_job(job))
    assert a.as_json() == b.as_json()
    assert a.etag() == b.etag()


@given(documents(), jobs(), st.data())
def test_exclude_always_wins(doc: ConfigDocument, job: dict[str, str], data: st.DataObject) -> None:
    # Make the Include hold for this job, then add an Exclude condition that also holds.
    include = {k: v for k, v in job.items()}
    key = data.draw(st.sampled_from([*job, "user"]), label="excluded attribute")
    job = {**job, key: job.get(key, "a")}
    exclude = {**doc.exclude, recase(data.draw, key): job[key]}
    both = doc.model_copy(update={"include": include, "exclude": exclude})
    assert not matches(both, make_job(job))
    assert matches(doc.model_copy(update={"include": include, "exclude": {}}), make_job(job))


@given(documents(), jobs())
def test_any_exclude_that_holds_rejects(doc: ConfigDocument, job: dict[str, str]) -> None:
    j = make_job(job)
    c = compile_doc(doc)
    if any(k in j and not j[k].isdisjoint(v) for k, v in c.exclude):
        assert not matches(doc, j)


@given(jobs(), st.dictionaries(st.sampled_from(CONF_KEYS), configure_values, max_size=3))
def test_empty_include_matches_every_job(job: dict[str, str], configure: dict[str, Any]) -> None:
    doc = ConfigDocument(name="everyone", configure=configure)
    assert matches(doc, make_job(job))
    res = resolve([doc], make_job(job))
    assert res.config == configure
    assert [s.name for s in res.sources] == ["everyone"]


@given(documents(), jobs(), st.data())
def test_keys_compare_case_insensitively(
    doc: ConfigDocument, job: dict[str, str], data: st.DataObject
) -> None:
    recased_job = {recase(data.draw, k): v for k, v in job.items()}
    recased_doc = doc.model_copy(
        update={
            "include": {recase(data.draw, k): v for k, v in doc.include.items()},
            "exclude": {recase(data.draw, k): v for k, v in doc.exclude.items()},
        }
    )
    expected = matches(doc, make_job(job))
    assert matches(recased_doc, make_job(job)) == expected
    assert matches(doc, make_job(recased_job)) == expected
    assert matches(recased_doc, make_job(recased_job)) == expected


@given(jobs(), st.lists(st.sampled_from(VALUES), min_size=2, max_size=4, unique=True))
def test_a_list_means_any_of(job: dict[str, str], values: list[str]) -> None:
    as_list = ConfigDocument(name="l", include={"User": values})
    each = [ConfigDocument(name="l", include={"user": v}) for v in values]
    j = make_job(job)
    assert matches(as_list, j) == any(matches(d, j) for d in each)


@given(jobs(), st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=8))
def test_unknown_attributes_can_be_targeted(job: dict[str, str], attr: str) -> None:
    name = "x" + "".join(c for c in attr if c.isalnum())
    doc = ConfigDocument(name="t", include={name: "v"})
    assert matches(doc, make_job({**job, name.upper(): "v"}))
    if norm_key(name) not in {norm_key(k) for k in job}:
        assert not matches(doc, make_job(job))


@st.composite
def matching_pair(draw: st.DrawFn) -> tuple[dict[str, str], ConfigDocument, ConfigDocument]:
    """A job and two documents that both match it and both set ``A``."""
    job = draw(jobs())
    keys = list(job)

    def doc(name: str) -> ConfigDocument:
        chosen = draw(st.lists(st.sampled_from(keys), unique=True)) if keys else []
        return ConfigDocument(
            name=name,
            include={k: job[k] for k in chosen},
            configure={"A": name},
            priority=draw(st.integers(-2, 2)),
        )

    n1, n2 = draw(
        st.lists(st.from_regex(r"[a-z]{1,4}", fullmatch=True), min_size=2, max_size=2, unique=True)
    )
    return job, doc(n1), doc(n2)


@given(matching_pair())
def test_precedence_specific_then_priority_then_name(
    case: tuple[dict[str, str], ConfigDocument, ConfigDocument],
) -> None:
    job, d1, d2 = case
    res = resolve([d1, d2], make_job(job))
    assert {s.name for s in res.sources} == {d1.name, d2.name}

    def rank(d: ConfigDocument) -> tuple[int, int, str]:
        return (-len(d.include), -d.priority, d.name)

    winner = min(d1, d2, key=rank)
    assert res.config["A"] == winner.name
    assert res.origin["A"] == winner.name
    assert res.sources[0].name == winner.name


@given(doc_sets(), jobs())
def test_merged_config_comes_only_from_matching_documents(
    docs: list[ConfigDocument], job: dict[str, str]
) -> None:
    j = make_job(job)
    res = resolve(docs, j)
    matched = {d.name for d in docs if matches(d, j)}
    assert {s.name for s in res.sources} == matched
    keys = {k for d in docs if d.name in matched for k in d.configure}
    assert set(res.config) == keys
    assert set(res.origin) == keys
    for key, name in res.origin.items():
        assert key in next(d for d in docs if d.name == name).configure


@settings(max_examples=200)
@given(doc_sets(max_size=12), st.lists(jobs(), min_size=1, max_size=5), st.data())
def test_index_agrees_with_checking_every_document(
    docs: list[ConfigDocument], job_list: list[dict[str, str]], data: st.DataObject
) -> None:
    index = Index(docs)
    live = {d.name: d for d in docs}
    # Some changes after the build: re-targeted documents and removals.
    for d in data.draw(st.lists(st.sampled_from(docs), max_size=4)) if docs else []:
        if data.draw(st.booleans(), label="remove"):
            index.remove(d.name)
            live.pop(d.name, None)
        else:
            changed = data.draw(documents(name=d.name))
            index.upsert(changed)
            live[d.name] = changed
    assert len(index) == len(live)
    for job in job_list:
        j = make_job(job)
        assert index.resolve(j).as_json() == resolve(live.values(), j).as_json()


@given(doc_sets(), jobs())
def test_etag_follows_the_answer(docs: list[ConfigDocument], job: dict[str, str]) -> None:
    j = make_job(job)
    res = resolve(docs, j)
    bumped = [d.model_copy(update={"version": d.version + 1}) for d in docs]
    again = resolve(bumped, j)
    assert (res.etag() == again.etag()) == (not res.sources)
