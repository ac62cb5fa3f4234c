"""What makes a job's process a trial: the variables the searcher's trial template sets.

The searcher writes them on every container of every role of a trial's job (so a trial
needs no arguments to know its hyperparameters and budget), and the SDK's ``Trial``
reads them. Spelled out here once: the searcher, the SDK and the docs use these names.
"""

from __future__ import annotations

#: the experiment's name (the key of its topics)
EXPERIMENT_ENV = "DLROVER_EVENTS_EXPERIMENT"
#: the trial's index in its experiment (its job is ``<experiment>-t<index>``)
TRIAL_ENV = "DLROVER_EVENTS_TRIAL"
#: the trial's hyperparameters, a JSON object of names to scalars
TRIAL_HPARAMS_ENV = "DLROVER_EVENTS_TRIAL_HPARAMS"
#: the budget the trial was created with (later ones come on ``<env>.trial.decisions``)
TRIAL_BUDGET_ENV = "DLROVER_EVENTS_TRIAL_BUDGET"
#: what the budget counts: ``steps``, ``samples`` or ``seconds`` (schemas' BudgetUnit)
TRIAL_BUDGET_UNIT_ENV = "DLROVER_EVENTS_TRIAL_BUDGET_UNIT"

TRIAL_VARIABLES = (
    EXPERIMENT_ENV,
    TRIAL_ENV,
    TRIAL_HPARAMS_ENV,
    TRIAL_BUDGET_ENV,
    TRIAL_BUDGET_UNIT_ENV,
)

__all__ = [
    "EXPERIMENT_ENV",
    "TRIAL_BUDGET_ENV",
    "TRIAL_BUDGET_UNIT_ENV",
    "TRIAL_ENV",
    "TRIAL_HPARAMS_ENV",
    "TRIAL_VARIABLES",
]
