"""The retention policy (dlrover_events/checkpoints/retention.py), pure: Determined's
save_trial_latest, save_trial_best and save_experiment_best with their defaults, the
newest of each job and every referenced checkpoint always kept, and, over any catalog
(hypothesis), a decision that splits it, keeps what each rule keeps, and keeps itself when
decided again."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover_events.checkpoints.retention import (
    Candidate,
    Goal,
    RetentionPolicy,
    decide,
)

T0 = datetime(2026, 11, 29, tzinfo=UTC)


def ck(
    id_: str,
    step: int,
    *,
    job: str = "j1",
    experiment: str | None = None,
    loss: float | None = None,
    referenced: bool = False,
) -> Candidate:
    return Candidate(
        checkpoint_id=id_,
        job=job,
        experiment=experiment,
        step=step,
        committed_at=T0 + timedelta(seconds=step),
        metrics={} if loss is None else {"loss": loss},
        referenced=referenced,
    )


def test_determined_s_defaults() -> None:
    policy = RetentionPolicy()
    assert (policy.save_experiment_best, policy.save_trial_best, policy.save_trial_latest) == (
        0,
        1,
        1,
    )


def test_a_job_outside_experiments_keeps_its_latest() -> None:
    cks = [ck(f"c{s}", s) for s in (10, 20, 30, 40)]
    d = decide(cks, RetentionPolicy(save_trial_latest=2), {})
    assert set(d.keep) == {"c40", "c30"}
    assert set(d.delete) == {"c10", "c20"}
    assert "not among the latest 2 of job j1" in d.delete["c10"]


def test_a_trial_keeps_its_latest_and_its_best_by_the_experiment_s_metric() -> None:
    losses = {10: 0.9, 20: 0.2, 30: 0.5, 40: 0.7}
    cks = [ck(f"c{s}", s, experiment="sweep", loss=v) for s, v in losses.items()]
    d = decide(cks, RetentionPolicy(), {"sweep": Goal(metric="loss")})
    assert set(d.keep) == {"c40", "c20"}
    assert any("best 1 of its trial by loss" in why for why in d.keep["c20"])
    # larger is better: the best is another one
    d = decide(cks, RetentionPolicy(), {"sweep": Goal(metric="loss", smaller_is_better=False)})
    assert set(d.keep) == {"c40", "c10"}


def test_the_experiment_s_best_over_all_its_trials() -> None:
    cks = [
        ck("a1", 1, job="a", experiment="sweep", loss=0.3),
        ck("a2", 2, job="a", experiment="sweep", loss=0.4),
        ck("a3", 3, job="a", experiment="sweep", loss=0.8),
        ck("b1", 1, job="b", experiment="sweep", loss=0.1),
        ck("b2", 2, job="b", experiment="sweep", loss=0.2),
        ck("b3", 3, job="b", experiment="sweep", loss=0.9),
    ]
    policy = RetentionPolicy(save_experiment_best=3, save_trial_best=0, save_trial_latest=1)
    d = decide(cks, policy, {"sweep": Goal(metric="loss")})
    assert set(d.keep) == {"a3", "b3", "b1", "b2", "a1"}
    assert set(d.delete) == {"a2"}


def test_the_newest_of_a_job_and_referenced_ones_are_always_kept() -> None:
    cks = [ck("c1", 1, referenced=True), ck("c2", 2), ck("c3", 3)]
    policy = RetentionPolicy(save_experiment_best=0, save_trial_best=0, save_trial_latest=0)
    d = decide(cks, policy, {})
    assert set(d.keep) == {"c1", "c3"}
    assert d.keep["c1"] == ["a model version references it"]
    assert d.delete == {"c2": "not among the latest 0 of job j1"}


def test_checkpoints_without_the_metric_are_not_ranked() -> None:
    cks = [
        ck("c1", 1, experiment="e", loss=0.5),
        ck("c2", 2, experiment="e"),
        ck("c3", 3, experiment="e"),
    ]
    d = decide(cks, RetentionPolicy(), {"e": Goal(metric="loss")})
    assert set(d.keep) == {"c1", "c3"}
    assert "no value of loss" in d.delete["c2"]


def test_an_experiment_not_recorded_yet_loses_nothing() -> None:
    cks = [ck(f"c{s}", s, experiment="e", loss=1 / s) for s in (1, 2, 3)]
    d = decide(cks, RetentionPolicy(), {})
    assert set(d.keep) == {"c1", "c2", "c3"}
    assert d.keep["c1"] == ["experiment e's metric is not known yet"]


def test_a_checkpoint_twice_is_a_mistake() -> None:
    with pytest.raises(ValueError, match="twice"):
        decide([ck("c1", 1), ck("c1", 2)], RetentionPolicy(), {})


# -- any catalog ------------------------------------------------------------------------

JOBS = ("a", "b", "c", "d")
#: jobs a and b are trials of experiment x, c of y, d of none
EXPERIMENT_OF = {"a": "x", "b": "x", "c": "y", "d": None}


@st.composite
def catalogs(draw: st.DrawFn) -> list[Candidate]:
    n = draw(st.integers(min_value=0, max_value=25))
    out = []
    for i in range(n):
        job = draw(st.sampled_from(JOBS))
        loss = draw(st.none() | st.sampled_from([0.1, 0.2, 0.3, 0.5, 1.0]))  # ties on purpose
        out.append(
            Candidate(
                checkpoint_id=f"k{i}",
                job=job,
                experiment=EXPERIMENT_OF[job],
                step=draw(st.integers(min_value=0, max_value=6)),  # equal steps too
                committed_at=T0 + timedelta(seconds=draw(st.integers(0, 3))),
                metrics={} if loss is None else {"loss": loss},
                referenced=draw(st.booleans()),
            )
        )
    return out


policies = st.builds(
    RetentionPolicy,
    save_experiment_best=st.integers(0, 4),
    save_trial_best=st.integers(0, 3),
    save_trial_latest=st.integers(0, 3),
)
goal_sets = st.fixed_dictionaries(
    {},
    optional={
        "x": st.builds(Goal, metric=st.just("loss"), smaller_is_better=st.booleans()),
        "y": st.builds(Goal, metric=st.sampled_from(["loss", "acc"])),
    },
)


def _order(c: Candidate) -> tuple[int, float, str]:
    at = c.committed_at.timestamp() if c.committed_at else 0.0
    return (-c.step, -at, c.checkpoint_id)


@settings(max_examples=100, deadline=None)
@given(catalogs(), policies, goal_sets)
def test_any_catalog(cks: list[Candidate], policy: RetentionPolicy, goals: dict[str, Goal]) -> None:
    d = decide(cks, policy, goals)
    ids = {c.checkpoint_id for c in cks}
    # every checkpoint is kept or deleted, never both
    assert set(d.keep) | set(d.delete) == ids
    assert not set(d.keep) & set(d.delete)
    # never a referenced one deleted
    assert not {c.checkpoint_id for c in cks if c.referenced} & set(d.delete)
    # nothing of an experiment whose metric is not known
    unknown = {c.checkpoint_id for c in cks if c.experiment and c.experiment not in goals}
    assert not unknown & set(d.delete)
    by_job: dict[str, list[Candidate]] = defaultdict(list)
    for c in cks:
        by_job[c.job].append(c)
    for own in by_job.values():
        own.sort(key=_order)
        # the newest, and the latest N, of each job kept
        assert own[0].checkpoint_id in d.keep
        assert {c.checkpoint_id for c in own[: policy.save_trial_latest]} <= set(d.keep)
        goal = goals.get(own[0].experiment or "")
        if goal is not None:
            rated = [c for c in own if goal.metric in c.metrics]
            sign = 1 if goal.smaller_is_better else -1
            kept_best = sorted(
                rated, key=lambda c: (sign * c.metrics[goal.metric], -c.step, c.checkpoint_id)
            )
            assert {c.checkpoint_id for c in kept_best[: policy.save_trial_best]} <= set(d.keep)
    for experiment, goal in goals.items():
        rated = [c for c in cks if c.experiment == experiment and goal.metric in c.metrics]
        if rated and policy.save_experiment_best:
            sign = 1 if goal.smaller_is_better else -1
            values = sorted(sign * c.metrics[goal.metric] for c in rated)
            cutoff = values[min(policy.save_experiment_best, len(values)) - 1]
            # nothing strictly better than the N-th best is deleted
            assert all(
                c.checkpoint_id in d.keep for c in rated if sign * c.metrics[goal.metric] < cutoff
            )
    # a job's checkpoints are deleted only when more than it keeps exist
    for own in by_job.values():
        assert len(own) - sum(c.checkpoint_id in d.delete for c in own) >= 1
    # the kept set keeps itself: deciding again on it deletes nothing
    again = decide([c for c in cks if c.checkpoint_id in d.keep], policy, goals)
    assert again.delete == {}
    # the order of the input does not matter
    assert decide(list(reversed(cks)), policy, goals).delete.keys() == d.delete.keys()
