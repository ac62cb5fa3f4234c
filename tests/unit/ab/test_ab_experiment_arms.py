"""An arm's experiment (streams/ab/experiment.py): the `experiment:` section of an arm's
settings changes the searcher or the trials' size and is not an env setting; what is
wrong with it is one line naming the arm. The example arms of examples/ab/experiments/
parse as `ab run --experiment` reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover_events.envs.env_settings import parse_settings
from dlrover_events.errors import UserError
from dlrover_events.experiments.document import experiment_yaml
from streams.ab.arms import parse_arm
from streams.ab.experiment import arm_experiment, env_settings_of
from streams.ab.runner import ABTest
from streams.searcher.core.registry import SEARCHERS

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "ab" / "experiments"


def test_the_example_arms_change_the_experiment_and_leave_valid_env_settings() -> None:
    base = experiment_yaml((EXAMPLES / "sweep.yaml").read_text(), searchers=list(SEARCHERS))
    made = {}
    for name in ("asha", "random", "elastic", "fixed"):
        arm = parse_arm(f"{name}={EXAMPLES / f'{name}.yaml'}")
        made[name] = arm_experiment(base, name, arm.settings)
        assert "experiment" not in env_settings_of(arm.settings)
        # what the arm's env gets (the cluster's shape filled in) is a valid env's
        env = ABTest(None, "", [arm]).env_settings(arm)  # type: ignore[arg-type]
        assert "experiment" not in env
        parse_settings(env)  # (raises on what an env does not take)
    assert made["asha"] == base
    assert made["random"].spec.searcher.name == "random"
    assert made["random"].spec.searcher.max_trials == base.spec.searcher.max_trials
    worker = made["elastic"].spec.trial["spec"]["roles"]["worker"]
    assert (worker["minReplicas"], worker["maxReplicas"]) == (1, 4)
    assert made["elastic"].spec.searcher.max_trials == 16
    assert made["fixed"].spec.trial["spec"]["roles"]["worker"]["maxReplicas"] == 1


def test_what_is_wrong_with_an_arms_experiment_names_the_arm() -> None:
    base = experiment_yaml((EXAMPLES / "sweep.yaml").read_text())
    for section, message in (
        ({"seed": 3}, "experiment.seed is not something an arm changes"),
        ({"max_gpus": 0}, "max_gpus must be a whole number"),
        ({"searcher": {"max_trials": 0}}, "spec.searcher.max_trials"),
        ("random", "experiment must be a mapping"),
    ):
        with pytest.raises(UserError, match=message) as err:
            arm_experiment(base, "b", {"experiment": section})
        assert str(err.value).startswith("arm b: ")
    bare = base.model_copy(deep=True)
    bare.spec.trial["spec"]["roles"] = {"chief": {"replicas": 1}}
    with pytest.raises(UserError, match="worker role"):
        arm_experiment(bare, "b", {"experiment": {"max_gpus": 2}})
