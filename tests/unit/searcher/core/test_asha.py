"""ASHA: Determined's rungs, brackets and shares, its promotions decision by decision,
and whole experiments on a known loss curve."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.experiments import AshaMode, SearcherSpec
from streams.searcher.core.api import TrialStatus
from streams.searcher.core.asha import AshaMemo, AshaSearcher, bracket_rungs, plan, rung_count
from tests.unit.searcher.core.driver import Sim, loss, spec


def searcher(**overrides: Any) -> SearcherSpec:
    raw: dict[str, Any] = {"name": "asha", "metric": "val_loss", "budget": {"max": 800}}
    raw.update(overrides)
    return SearcherSpec.model_validate(raw)


def test_rungs_are_capped_as_determined_caps_them() -> None:
    # divisor 4: 4**4 = 256 <= 800 < 1024 fits 5 rungs by budget; 16 trials fit 3
    assert rung_count(searcher(max_trials=16)) == 3
    assert rung_count(searcher(max_trials=10**5, budget={"max": 10_000})) == 5  # max_rungs
    # 4**6 <= 10,000 < 4**7: 7 rungs by budget; 4**8 <= 100,000: 9 by trials
    assert rung_count(searcher(max_trials=10**5, budget={"max": 10_000}, max_rungs=9)) == 7
    assert rung_count(searcher(max_trials=1000, budget={"max": 10_000}, max_rungs=9)) == 5
    assert rung_count(searcher(max_trials=1000, budget={"max": 3})) == 1  # 4 > 3 units
    assert rung_count(searcher(max_trials=1, budget={"max": 0.5})) == 1


def test_brackets_of_each_mode() -> None:
    assert bracket_rungs(AshaMode.AGGRESSIVE, 5) == [5]
    assert bracket_rungs(AshaMode.STANDARD, 5) == [5, 4, 3]
    assert bracket_rungs(AshaMode.STANDARD, 4) == [4, 3, 2]
    assert bracket_rungs(AshaMode.CONSERVATIVE, 3) == [3, 2, 1]


def test_budgets_trials_and_slots_are_split_as_adaptive_asha_splits_them() -> None:
    standard = plan(searcher(max_trials=16, max_concurrent_trials=4))
    assert [p.budgets for p in standard] == [(50.0, 200.0, 800.0), (200.0, 800.0)]
    assert [p.max_trials for p in standard] == [12, 4]  # weights 16/3 and 4/2, remainder first
    assert [p.max_concurrent for p in standard] == [2, 2]
    conservative = plan(searcher(max_trials=16, max_concurrent_trials=2, mode="conservative"))
    assert [p.rungs for p in conservative] == [3, 2, 1]
    assert [p.max_trials for p in conservative] == [12, 3, 1]
    assert [p.max_concurrent for p in conservative] == [1, 1, 1]  # at least one each
    # no limit given: Determined's default, max(trials of the last bracket, divisor) each
    assert [p.max_concurrent for p in plan(searcher(max_trials=16))] == [4, 4]
    aggressive = plan(searcher(max_trials=1000, budget={"max": 10_000}, mode="aggressive"))
    assert aggressive[0].budgets == (39.0, 156.0, 625.0, 2500.0, 10_000.0)
    assert aggressive[0].max_trials == 1000
    for mode in AshaMode:
        for trials in range(1, 60):
            shares = plan(searcher(max_trials=trials, divisor=2, mode=mode, max_rungs=6))
            assert sum(p.max_trials for p in shares) == trials


def small(**overrides: Any) -> dict[str, Any]:
    """divisor 2, one bracket of rungs at budgets 1, 2, 4, four trials"""
    fields: dict[str, Any] = {
        "divisor": 2,
        "mode": "aggressive",
        "max_trials": 4,
        "max_concurrent_trials": 4,
        "budget": {"max": 4},
    }
    fields.update(overrides)
    return spec("asha", **fields)


def test_the_top_half_is_promoted_the_others_wait_and_closed_rungs_stop() -> None:
    sim = Sim.start(small(), restart=True)
    assert [(d.decision.value, d.trial, d.budget, d.rung) for d in sim.decisions] == [
        ("create", i, 1.0, 0) for i in range(4)
    ]
    assert sim.kinds(sim.report(0, 1, 0.5)) == [("pause", 0)]  # 1 trial there: top 0
    [run] = sim.report(1, 1, 0.3)
    assert (run.decision.value, run.trial, run.budget, run.rung) == ("run", 1, 2.0, 1)
    assert run.reason == (
        "rung 0 (budget 1): val_loss 0.3 is in the top 1/2 of 2 trials there: promoted to "
        "rung 1 (budget 2)"
    )
    assert sim.kinds(sim.report(2, 1, 0.9)) == [("pause", 2)]
    # the fourth: the top 2 are trial 3 and trial 1 (promoted already); nobody else can
    # reach rung 0 now, so trials 0 and 2 stop
    decisions = sim.report(3, 1, 0.1)
    assert sim.kinds(decisions) == [("run", 3), ("stop", 0), ("stop", 2)]
    assert decisions[1].reason.startswith(
        "rung 0 (budget 1): val_loss 0.5 is not in the top 1/2 of 4 trials there, and no "
        "trial can enter the rung any more"
    )
    assert sim.kinds(sim.report(1, 2, 0.25)) == [("pause", 1)]  # trial 3 may still come
    assert sim.kinds(sim.report(3, 2, 0.05)) == [("run", 3), ("stop", 1)]
    decisions = sim.report(3, 4, 0.04)
    assert sim.kinds(decisions) == [("complete", 3), ("done", None)]
    assert decisions[-1].reason.startswith(
        "done: 4 trials (3 stopped, 1 completed); best: trial 3, val_loss 0.04 at budget 4 ("
    )


def test_a_paused_trial_is_promoted_later_and_resumed_when_a_slot_frees() -> None:
    sim = Sim.start(small(max_concurrent_trials=1), restart=True)
    assert sim.kinds() == [("create", 0)]
    assert sim.kinds(sim.report(0, 1, 0.1)) == [("pause", 0), ("create", 1)]
    # trial 1 is worse: trial 0 is now the top 1/2 of 2 and resumes in trial 1's slot
    decisions = sim.report(1, 1, 0.5)
    assert sim.kinds(decisions) == [("pause", 1), ("resume", 0)]
    resume = decisions[1]
    assert (resume.budget, resume.rung) == (2.0, 1)
    assert resume.hparams == sim.hparams[0]
    assert resume.reason.startswith("rung 0 (budget 1): val_loss 0.1 is in the top 1/2 of 2")
    assert sim.kinds(sim.report(0, 2, 0.08)) == [("pause", 0), ("create", 2)]
    assert sim.kinds(sim.report(2, 1, 0.05)) == [("run", 2)]
    assert sim.kinds(sim.report(2, 2, 0.04)) == [("run", 2)]
    assert sim.kinds(sim.report(2, 4, 0.03)) == [("complete", 2), ("create", 3)]
    # the last trial can be promoted nowhere: stopped at once, and every waiting one too
    assert sim.kinds(sim.report(3, 1, 0.9)) == [
        ("stop", 3),
        ("stop", 1),
        ("stop", 0),
        ("done", None),
    ]
    assert sim.max_running == 1
    assert "best: trial 2, val_loss 0.03 at budget 4" in sim.decisions[-1].reason


def test_a_failed_trial_enters_its_rung_as_the_worst_so_others_are_promoted() -> None:
    sim = Sim.start(small(), restart=True)
    assert sim.kinds(sim.report(0, 1, 0.5)) == [("pause", 0)]
    decisions = sim.end(1, "failed")
    assert sim.kinds(decisions) == [("resume", 0)]  # top 1/2 of 2: trial 0, trial 1 last
    assert sim.state.trials[1].status is TrialStatus.FAILED
    memo = sim.state.memo
    assert isinstance(memo, AshaMemo)
    assert [(e.trial, e.value, e.promoted) for e in memo.brackets[0].rungs[0]] == [
        (0, 0.5, True),
        (1, None, False),
    ]
    # no trial is created in its place: it counts toward max_trials
    assert len(sim.of("create")) == 4


def test_a_promotion_waits_through_a_pause_and_a_restart() -> None:
    sim = Sim.start(small(), restart=True)
    sim.report(0, 1, 0.5)  # waits at rung 0
    sim.act("pause")
    # trial 1 fails while held: trial 0 is now the top 1/2 of 2, but nothing resumes yet
    assert sim.end(1, "failed") == []
    memo = sim.state.memo
    assert isinstance(memo, AshaMemo)
    assert [w.trial for w in memo.brackets[0].waiting] == [0]
    decisions = sim.act("activate")  # the state went through JSON before this input
    assert sim.kinds(decisions) == [("resume", 2), ("resume", 3), ("resume", 0)]
    assert (decisions[-1].budget, decisions[-1].rung) == (2.0, 1)


@pytest.mark.parametrize(
    ("mode", "limit"),
    [("aggressive", 4), ("standard", 4), ("conservative", 2), ("standard", 0), ("aggressive", 1)],
)
def test_a_whole_experiment_on_a_known_curve(mode: str, limit: int) -> None:
    sim = Sim.start(spec("asha", mode=mode, max_concurrent_trials=limit, max_trials=16))
    sim.run()
    state = sim.state
    assert state.status == "completed" and sim.done
    assert len(sim.of("create")) == 16
    assert sim.max_running <= (limit or AshaSearcher().concurrency(state.spec) or 0)
    assert all(not t.live for t in state.trials)
    paused = {d.trial for d in sim.of("pause")}
    later = {d.trial for d in sim.of("resume")} | {d.trial for d in sim.of("stop")}
    assert paused <= later, "every trial that waited was resumed or stopped"
    best = min(
        (t for t in state.trials if t.validations),
        key=lambda t: (min(v for _, v in t.validations), t.index),
    )
    assert sim.best_trial() == best.index
    assert f"best: trial {best.index}, val_loss " in sim.decisions[-1].reason
    # the trial with the best curve at full budget reached it
    completed = {d.trial for d in sim.of("complete")}
    assert completed and best.index in completed
    memo = state.memo
    assert isinstance(memo, AshaMemo)
    for bracket in memo.brackets:
        for r, rung in enumerate(bracket.rungs[:-1]):
            top = len(rung) // state.spec.searcher.divisor
            assert all(e.promoted for e in rung[:top]), "the top 1/divisor of each rung went on"
            for e in rung:
                if e.promoted:
                    assert any(x.trial == e.trial for x in bracket.rungs[r + 1])


def test_asha_and_random_with_one_seed_try_the_same_points() -> None:
    asha = Sim.start(spec("asha", mode="aggressive"))
    random = Sim.start(spec("random"))
    assert [d.hparams for d in asha.of("create")] == [d.hparams for d in random.of("create")]
    assert loss(asha.hparams[0], 800) == loss(random.hparams[0], 800)
