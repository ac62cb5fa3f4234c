"""The experiment example (examples/experiments): its document is a valid experiment whose
trials are TrainingJobs the operator takes, and its model's validation loss truly depends
on the hyperparameters searched, deterministically given the seed."""

from __future__ import annotations

import functools
import importlib.util
import shlex
import sys
from pathlib import Path
from types import ModuleType

import torch

from dlrover_events.experiments.document import experiment_yaml
from dlrover_events.sdk.trial import TrialSpec
from handlers.operator.document.trainingjob import parse_job
from schemas.experiments import BudgetUnit, IntParam, LogParam
from streams.searcher.trials import trial_document

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "experiments"


@functools.cache
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_trial", EXAMPLE / "train_trial.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_sweep_is_an_asha_experiment_whose_trials_run_the_example() -> None:
    doc = experiment_yaml((EXAMPLE / "mlp-sweep.yaml").read_text())
    searcher = doc.spec.searcher
    assert (searcher.name, searcher.metric, searcher.smaller_is_better) == (
        "asha",
        "val_loss",
        True,
    )
    assert (searcher.max_trials, searcher.max_concurrent_trials) == (16, 4)
    assert searcher.budget.unit is BudgetUnit.STEPS
    assert isinstance(doc.spec.hyperparameters["lr"], LogParam)
    assert isinstance(doc.spec.hyperparameters["width"], IntParam)

    body = trial_document(doc.spec, doc.metadata.name, 5, {"lr": 0.01, "width": 64}, 25)
    job = parse_job(body)
    assert job.name == "mlp-sweep-t5" and job.roles["worker"].replicas == 1
    command = body["spec"]["roles"]["worker"]["elastic"]["command"]
    assert (ROOT / command[1]).is_file(), shlex.join(command)
    (container,) = body["spec"]["roles"]["worker"]["template"]["spec"]["containers"]
    variables = {v["name"]: v["value"] for v in container["env"]}
    spec = TrialSpec.from_environ(variables)  # what the trial's process reads
    assert (spec.job_name, spec.budget, dict(spec.hparams)) == (
        "mlp-sweep-t5",
        25.0,
        {"lr": 0.01, "width": 64},
    )


def test_the_ranks_parts_make_the_same_global_batch() -> None:
    task = example().Task(seed=3)
    x, y = task.batch(7)
    parts = [task.batch(7, rank, 2) for rank in range(2)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    assert torch.equal(torch.cat([p[1] for p in parts]), y)


def test_the_validation_loss_depends_on_lr_and_width_and_only_on_them() -> None:
    curve = example().learning_curve
    good = curve(1e-2, 64, 200, validate_every=50)
    assert [s for s, _ in good] == [50, 100, 150, 200]
    assert curve(1e-2, 64, 200, validate_every=50) == good  # deterministic given the seed
    best = good[-1][1]
    assert curve(1e-4, 64, 200)[-1][1] > 3 * best  # too small a learning rate
    assert curve(1e-2, 8, 200)[-1][1] > 1.5 * best  # too narrow
    assert curve(1e-2, 64, 200, seed=1)[-1][1] != best  # another seed, another task
