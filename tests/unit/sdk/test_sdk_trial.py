"""A trial's pure parts: its variables, the fold of its decisions, what a wait answers,
and a metrics report checked in the caller."""

from __future__ import annotations

import json
import math
import threading
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_events.sdk.identity import JobIdentity
from dlrover_events.sdk.reporter import Reporter
from dlrover_events.sdk.trial import (
    WAIT,
    NotATrial,
    Trial,
    TrialError,
    TrialSpec,
    TrialState,
    TrialStatus,
    metrics_event,
)
from dlrover_events.sdk.trial_env import (
    EXPERIMENT_ENV,
    TRIAL_BUDGET_ENV,
    TRIAL_BUDGET_UNIT_ENV,
    TRIAL_ENV,
    TRIAL_HPARAMS_ENV,
    TRIAL_VARIABLES,
)
from dlrover_events.settings import Settings
from schemas.experiments import BudgetUnit, DecisionKind, TrialDecision
from schemas.jobs import JobMeta

ENVIRON = {
    EXPERIMENT_ENV: "mlp-sweep",
    TRIAL_ENV: "3",
    TRIAL_HPARAMS_ENV: '{"lr": 0.01, "width": 64, "act": "relu", "bn": true}',
    TRIAL_BUDGET_ENV: "25",
    TRIAL_BUDGET_UNIT_ENV: "steps",
}
IDENTITY = JobIdentity(job=JobMeta(uuid="mlp-sweep-t3"), env="prod")


def spec(unit: BudgetUnit = BudgetUnit.STEPS) -> TrialSpec:
    return TrialSpec("mlp-sweep", 3, {"lr": 0.01}, 25.0, unit)


def decision(seq: int, kind: DecisionKind, trial: int | None = 3, **kw: Any) -> TrialDecision:
    return TrialDecision(
        env="prod", experiment=kw.pop("experiment", "mlp-sweep"), seq=seq, decision=kind,
        trial=trial, **kw,
    )  # fmt: skip


# -- the variables ----------------------------------------------------------------------


def test_the_variables_make_the_spec() -> None:
    got = TrialSpec.from_environ(ENVIRON)
    assert got == TrialSpec(
        "mlp-sweep", 3, {"lr": 0.01, "width": 64, "act": "relu", "bn": True}, 25.0, BudgetUnit.STEPS
    )
    assert got.job_name == "mlp-sweep-t3"
    assert type(got.hparams["width"]) is int and type(got.hparams["bn"]) is bool


def test_a_process_without_an_experiment_is_not_a_trial() -> None:
    with pytest.raises(NotATrial, match=f"not a trial: {EXPERIMENT_ENV} is not set"):
        TrialSpec.from_environ({k: v for k, v in ENVIRON.items() if k != EXPERIMENT_ENV})
    with pytest.raises(NotATrial):
        Trial.from_env({})


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        (EXPERIMENT_ENV, "Not_A_Label", "an experiment's name"),
        (TRIAL_ENV, "", f"{TRIAL_ENV} is not set"),
        (TRIAL_ENV, "-1", "a trial's index"),
        (TRIAL_ENV, "1000000", "a trial's index"),
        (TRIAL_HPARAMS_ENV, "{lr: 1}", "is not JSON"),
        (TRIAL_HPARAMS_ENV, "[1, 2]", "a JSON object"),
        (TRIAL_HPARAMS_ENV, '{"lr": [1]}', f"{TRIAL_HPARAMS_ENV}: lr:"),
        (TRIAL_HPARAMS_ENV, '{"1lr": 1}', f"{TRIAL_HPARAMS_ENV}: 1lr:"),
        (TRIAL_BUDGET_ENV, "nan", "a number >= 0"),
        (TRIAL_BUDGET_ENV, "-5", "a number >= 0"),
        (TRIAL_BUDGET_ENV, "lots", "a number >= 0"),
        (TRIAL_BUDGET_UNIT_ENV, "epochs", "one of steps, samples, seconds"),
    ],
)
def test_a_wrong_variable_is_one_error_naming_it(name: str, value: str, says: str) -> None:
    with pytest.raises(TrialError, match=says) as caught:
        TrialSpec.from_environ({**ENVIRON, name: value})
    assert name in str(caught.value)
    assert not isinstance(caught.value, NotATrial)
    assert "\n" not in str(caught.value)


@given(st.sampled_from(TRIAL_VARIABLES), st.text(max_size=40))
def test_any_value_of_a_variable_is_a_spec_or_a_trial_error(name: str, value: str) -> None:
    try:
        got = TrialSpec.from_environ({**ENVIRON, name: value})
    except TrialError as err:
        assert "\n" not in str(err)
    else:
        assert got.budget >= 0 and math.isfinite(got.budget)


scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    # what a searcher can hand a trial: the contract refuses a NUL (Postgres cannot store it)
    st.text(st.characters(exclude_characters="\x00"), max_size=20),
)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,10}", fullmatch=True)


@given(st.dictionaries(names, scalars, max_size=8))
def test_hyperparameters_come_through_json_as_they_were(hparams: dict[str, Any]) -> None:
    got = TrialSpec.from_environ({**ENVIRON, TRIAL_HPARAMS_ENV: json.dumps(hparams)})
    assert got.hparams == hparams
    assert {k: type(v) for k, v in got.hparams.items()} == {k: type(v) for k, v in hparams.items()}


def test_a_hyperparameter_holding_a_nul_is_refused_in_one_line() -> None:
    with pytest.raises(TrialError, match="NUL") as caught:
        TrialSpec.from_environ({**ENVIRON, TRIAL_HPARAMS_ENV: json.dumps({"act": "re\x00lu"})})
    assert "\n" not in str(caught.value)


# -- the decisions ----------------------------------------------------------------------


def test_a_trial_follows_its_own_decisions_in_order() -> None:
    state = TrialState.of(spec())
    assert (state.budget, state.status, state.decision) == (25.0, TrialStatus.RUNNING, None)
    state = state.fold(decision(0, DecisionKind.CREATE, budget=25.0, hparams={"lr": 0.01}))
    state = state.fold(decision(4, DecisionKind.RUN, budget=100.0))
    assert (state.budget, state.status, state.seq) == (100.0, TrialStatus.RUNNING, 4)
    state = state.fold(decision(9, DecisionKind.PAUSE, rung=1))
    assert (state.budget, state.status) == (100.0, TrialStatus.PAUSED)
    state = state.fold(decision(15, DecisionKind.RESUME, budget=400.0))
    assert (state.budget, state.status) == (400.0, TrialStatus.RUNNING)
    assert state.decision is not None and state.decision.seq == 15


def test_repeats_others_and_older_decisions_change_nothing() -> None:
    state = TrialState.of(spec()).fold(decision(4, DecisionKind.RUN, budget=100.0))
    for ignored in (
        decision(4, DecisionKind.STOP),  # a repeat of seq 4 (a restarted searcher's)
        decision(2, DecisionKind.RUN, budget=50.0),  # older
        decision(7, DecisionKind.RUN, trial=4, budget=999.0),  # another trial's
        decision(8, DecisionKind.STOP, experiment="other"),  # another experiment's
    ):
        assert state.fold(ignored) is state
    done = state.fold(decision(20, DecisionKind.DONE, trial=None, reason="max_trials reached"))
    assert done.status is TrialStatus.DONE and done.budget == 100.0


@pytest.mark.parametrize(
    ("kind", "budget", "used", "answer"),
    [
        (DecisionKind.RUN, 100.0, 25.0, 100.0),  # promoted in place
        (DecisionKind.RESUME, 100.0, 25.0, 100.0),
        (DecisionKind.RUN, 25.0, 25.0, WAIT),  # at its budget: the searcher has not said
        (DecisionKind.PAUSE, None, 25.0, WAIT),  # the suspension's SIGTERM ends the wait
        (DecisionKind.STOP, None, 25.0, None),
        (DecisionKind.COMPLETE, None, 400.0, None),
    ],
)
def test_what_a_wait_answers(
    kind: DecisionKind, budget: float | None, used: float, answer: object
) -> None:
    state = TrialState.of(spec()).fold(decision(1, kind, budget=budget))
    if answer is WAIT:
        assert state.answer(used) is WAIT
    else:
        assert state.answer(used) == answer


# -- a report ---------------------------------------------------------------------------


def test_a_report_is_a_trial_metrics_event_keyed_by_the_experiment() -> None:
    event = metrics_event(spec(), IDENTITY, 25, {"val_loss": 0.5, "acc": 1}, validation=True)
    assert (event.key, event.experiment, event.trial, event.step, event.budget) == (
        "mlp-sweep",
        "mlp-sweep",
        3,
        25,
        25.0,
    )
    assert event.validation and event.metrics == {"val_loss": 0.5, "acc": 1.0}
    assert event.env == "prod" and event.source == IDENTITY.source
    assert metrics_event(spec(), IDENTITY, 25, {"x": 1.0}, budget_used=12.5).budget == 12.5


@pytest.mark.parametrize(
    ("step", "metrics", "kw", "says"),
    [
        (1, {"val_loss": math.nan}, {}, "metric 'val_loss' must be a finite number"),
        (1, {"val_loss": math.inf}, {}, "metric 'val_loss' must be a finite number"),
        (1, {"ok": 1.0, "val_loss": "0.5"}, {}, "metric 'val_loss' must be a number"),
        (1, {"val_loss": True}, {}, "metric 'val_loss' must be a number"),
        (1, {"val loss": 1.0}, {}, "metrics.val loss"),
        (1, {}, {}, "at least one metric"),
        (-1, {"val_loss": 1.0}, {}, "step must be an integer >= 0"),
        (1.5, {"val_loss": 1.0}, {}, "step must be an integer >= 0"),
        (1, {"val_loss": 1.0}, {"budget_used": -2.0}, "budget"),
        (1, {"val_loss": 1.0}, {"budget_used": math.nan}, "budget"),
    ],
)
def test_a_bad_report_raises_at_once_naming_what(
    step: Any, metrics: dict[str, Any], kw: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        metrics_event(spec(), IDENTITY, step, metrics, **kw)


def test_a_report_made_again_is_the_same_event() -> None:
    first = metrics_event(spec(), IDENTITY, 25, {"val_loss": 0.5, "acc": 0.9}, validation=True)
    again = metrics_event(spec(), IDENTITY, 25, {"acc": 0.8, "val_loss": 0.4}, validation=True)
    assert again.event_id == first.event_id
    others = {
        metrics_event(spec(), IDENTITY, 25, {"val_loss": 0.5}, validation=True).event_id,
        metrics_event(spec(), IDENTITY, 25, {"val_loss": 0.5, "acc": 0.9}).event_id,
        metrics_event(
            spec(), IDENTITY, 26, {"val_loss": 0.5, "acc": 0.9}, validation=True
        ).event_id,
        metrics_event(
            replace(spec(), index=4), IDENTITY, 25, {"val_loss": 0.5, "acc": 0.9}, validation=True
        ).event_id,
    }
    assert first.event_id not in others and len(others) == 4


def test_a_budget_of_samples_or_seconds_needs_what_was_used() -> None:
    with pytest.raises(ValueError, match=r"budget_used is required: .* counts samples"):
        metrics_event(spec(BudgetUnit.SAMPLES), IDENTITY, 10, {"val_loss": 1.0})
    got = metrics_event(spec(BudgetUnit.SECONDS), IDENTITY, 10, {"v": 1.0}, budget_used=3.5)
    assert got.budget == 3.5


# -- the facade, without a bus ----------------------------------------------------------

NOWHERE = Settings(bootstrap_servers="127.0.0.1:9", request_timeout_ms=1000)


def test_other_ranks_check_their_reports_and_send_none() -> None:
    rank1 = JobIdentity(job=JobMeta(uuid="mlp-sweep-t3"), env="prod", process_rank=1)
    reporter = Reporter(rank1, settings=NOWHERE)
    trial = Trial(spec(), rank1, reporter=reporter, settings=NOWHERE)
    assert not trial.follows and not trial.reports
    assert trial.report_metrics(5, {"val_loss": 1.0}) is False
    with pytest.raises(ValueError, match="metric 'val_loss'"):
        trial.report_metrics(5, {"val_loss": math.nan})
    assert reporter.stats().queued == 0
    with pytest.raises(RuntimeError, match="only rank 0 does"):
        trial.wait_for_budget(25.0)
    assert trial.budget() == 25.0 and trial.hparams() == {"lr": 0.01}


def test_a_wait_ends_by_a_decision_by_stop_or_by_its_timeout() -> None:
    reporter = Reporter(IDENTITY, settings=NOWHERE)
    trial = Trial(spec(), IDENTITY, reporter=reporter, settings=NOWHERE, catch_up_s=0.0)
    trial.start()
    try:
        with pytest.raises(TimeoutError, match=r"no budget above 25 within 0\.2 s"):
            trial.wait_for_budget(25.0, timeout_s=0.2)
        stopping = threading.Event()
        threading.Timer(0.2, stopping.set).start()
        trial._fold(decision(3, DecisionKind.PAUSE))
        assert trial.wait_for_budget(25.0, timeout_s=30, stop=stopping.is_set) is None
        assert stopping.is_set()
        promote = threading.Timer(0.2, trial._fold, [decision(5, DecisionKind.RESUME, budget=64)])
        promote.start()
        assert trial.wait_for_budget(25.0, timeout_s=30) == 64.0
        assert trial.describe() == (
            "trial mlp-sweep-t3: running, budget 64 steps, last decision resume (#5)"
        )
    finally:
        trial.close(timeout_s=0.5)
        reporter.close(timeout_s=0.1)
