"""Experiments in virtual envs in one process (tests/unit/ab/experiments_in_lockstep.py,
the path docs/experiments.md's measurements were made on): the real searcher core, the
virtual operator's rules and one order, the simulated cluster and, under a cluster
scheduler, the brain in lockstep. Small runs here; the measurements with their seeds are
`python -m tests.unit.ab.experiments_in_lockstep` (a minute each)."""

from __future__ import annotations

from dataclasses import replace

from schemas.experiments import DecisionKind
from streams.evaluators import kpis
from tests.unit.ab.experiments_in_lockstep import (
    ASHA_VS_RANDOM,
    ELASTIC_VS_FIXED,
    Setup,
    run,
    target_quantile,
)

SMALL = replace(ASHA_VS_RANDOM, max_trials=24, budget=6400.0, curve_scale=200.0, max_rungs=3)


def _summary(setup: Setup) -> list[tuple[int, str, int | None, float | None]]:
    return [(d.seq, d.decision.value, d.trial, d.budget) for d in run(setup).decisions]


def test_an_experiment_runs_to_its_done_the_same_every_time() -> None:
    first = run(SMALL)
    kinds = [d.decision for d in first.decisions]
    assert kinds.count(DecisionKind.CREATE) == 24 and kinds[-1] is DecisionKind.DONE
    assert all(j.done for j in first.trials) and len(first.trials) == 24
    assert [d.seq for d in first.decisions] == list(range(len(first.decisions)))
    assert _summary(SMALL) == [
        (d.seq, d.decision.value, d.trial, d.budget) for d in first.decisions
    ]


def test_asha_spends_less_on_the_same_trials_than_random_search() -> None:
    asha = run(SMALL)
    rand = run(replace(SMALL, searcher="random"))
    # the same points (one seed), every random trial to the full budget
    created = {(d.trial, tuple(sorted(d.hparams.items()))) for d in asha.decisions if d.hparams}
    assert created <= {
        (d.trial, tuple(sorted(d.hparams.items()))) for d in rand.decisions if d.hparams
    }
    assert all(
        d.budget == SMALL.budget for d in rand.decisions if d.decision is DecisionKind.CREATE
    )
    gpu_s = [sum(j.gpu_seconds(None) for j in r.trials) for r in (asha, rand)]
    assert gpu_s[0] < gpu_s[1] / 2
    assert target_quantile(SMALL, 0.01) < target_quantile(SMALL, 0.5)
    assert kpis.progress(asha.jobs) and kpis.progress(rand.jobs)


def test_elastic_trials_grow_under_the_cluster_scheduler_and_fixed_ones_do_not() -> None:
    small = replace(ELASTIC_VS_FIXED, jobs=6, max_trials=8, budget=6400.0, curve_scale=200.0)
    elastic, fixed = run(small), run(replace(small, max_gpus=1))
    for result, most in ((elastic, 4), (fixed, 1)):
        assert all(j.done for j in result.jobs)
        peaks = [max(g for _, g in j.timeline()) for j in result.trials]
        assert max(peaks) <= most
        if most > 1:
            assert max(peaks) > 1  # the scheduler gave a trial more than its template
