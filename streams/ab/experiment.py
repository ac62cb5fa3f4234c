"""An experiment in every arm of an A/B test: searchers and sharing policies compared on
the same trials' learning curves (docs/experiments.md, Trials in a virtual env).

`ab run --experiment FILE` gives every arm the experiment (the YAML `experiment create`
takes); an arm's settings file may change it in its own ``experiment`` section, which
is not an env setting (it is taken out before the arm's env is made):

```yaml
experiment:
  searcher: {name: random}   # merged into spec.searcher
  max_gpus: 4                # trials' workers elastic from 1 to 4 GPUs (1: fixed size)
operator: {trials: {curves: {kind: table, path: curves.csv}}}   # an env setting
```

Each arm's searcher runs beside its operator and brain; the arm is done when its
experiment is (the searcher's ``done``) and every job of the input has ended. Its
experiment KPIs: the experiments evaluator's (best metric and when it was first reached,
the trials' GPU-hours, the other jobs' mean JCT), and, with ``--target`` and
``--deadline``, the time to reach the target and the best value by the deadline.

Pure: reading the file is the CLI's.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from dlrover_events.errors import UserError
from dlrover_events.experiments.document import ExperimentInvalid, experiment_document
from schemas.experiments import ExperimentDocument, ExperimentSubmitted
from streams.evaluators import kpis
from streams.evaluators.api import Metrics
from streams.evaluators.ledger import JobRecord

#: The section of an arm's settings that changes its experiment.
ARM_KEY = "experiment"
_ARM_FIELDS = frozenset({"searcher", "max_gpus"})


def env_settings_of(settings: Mapping[str, Any]) -> dict[str, Any]:
    """An arm's settings without its experiment section: what its env gets."""
    return {k: v for k, v in settings.items() if k != ARM_KEY}


def arm_experiment(
    base: ExperimentDocument, arm: str, settings: Mapping[str, Any]
) -> ExperimentDocument:
    """The experiment arm ``arm`` runs: ``base`` changed by the arm's ``experiment``
    section; a UserError names the arm and what is wrong."""
    section = settings.get(ARM_KEY) or {}
    if not isinstance(section, Mapping):
        raise UserError(f"arm {arm}: experiment must be a mapping (searcher, max_gpus)")
    unknown = sorted(set(section) - _ARM_FIELDS)
    if unknown:
        raise UserError(
            f"arm {arm}: experiment.{unknown[0]} is not something an arm changes "
            f"({', '.join(sorted(_ARM_FIELDS))})"
        )
    data = base.model_dump(mode="json")
    searcher = section.get("searcher")
    if searcher is not None:
        if not isinstance(searcher, Mapping):
            raise UserError(f"arm {arm}: experiment.searcher must be a mapping")
        data["spec"]["searcher"] = {**data["spec"]["searcher"], **searcher}
    if "max_gpus" in section:
        gpus = section["max_gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise UserError(f"arm {arm}: experiment.max_gpus must be a whole number >= 1")
        data["spec"]["trial"] = _elastic(data["spec"]["trial"], gpus)
    try:
        return experiment_document(data)
    except ExperimentInvalid as err:
        raise UserError(f"arm {arm}: {err}") from None


def _elastic(trial: Mapping[str, Any], gpus: int) -> dict[str, Any]:
    """The trial template with its workers elastic from 1 to ``gpus`` (1: fixed size)."""
    out = copy.deepcopy(dict(trial))
    roles = out.get("spec", {}).get("roles")
    if not isinstance(roles, dict) or not isinstance(roles.get("worker"), dict):
        raise UserError("experiment.max_gpus resizes the trial template's worker role: it has none")
    roles["worker"] |= {"minReplicas": 1, "maxReplicas": gpus}
    replicas = roles["worker"].get("replicas", 1)
    if isinstance(replicas, int) and replicas > gpus:
        roles["worker"]["replicas"] = gpus
    return out


def submitted(env: str, document: ExperimentDocument) -> ExperimentSubmitted:
    return ExperimentSubmitted(
        env=env, source="ab", experiment=document.metadata.name, spec=document.spec
    )


def experiment_metrics(
    jobs: Sequence[JobRecord], *, target: float | None, deadline_s: float | None
) -> Metrics:
    """The KPIs that need a target or a deadline (time to the target, best by the
    deadline), where they are asked for and reached."""
    out: Metrics = {}
    if target is not None and (reached := kpis.time_to_target(jobs, target)) is not None:
        out["time_to_target_s"] = reached
    if deadline_s is not None and (best := kpis.best_by(jobs, deadline_s)) is not None:
        out["best_by_deadline"] = best
    return out


__all__ = [
    "ARM_KEY",
    "arm_experiment",
    "env_settings_of",
    "experiment_metrics",
    "submitted",
]
