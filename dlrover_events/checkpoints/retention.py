"""Which checkpoints the env keeps, pure: Determined's retention policy over the catalog.

Determined's ``checkpoint_storage`` keeps, of an experiment, the ``save_experiment_best``
best checkpoints over all its trials, the ``save_trial_best`` best of each trial, and
the ``save_trial_latest`` latest of each trial (defaults 0, 1, 1); "best" by the
searcher's metric, among the checkpoints that have a value of it. Here a trial is a job
(a job outside any experiment is a trial of its own, with no metric: only its latest
count), and the value is the one the job measured at the save (the event's ``metrics``).

On top of Determined's rules, two checkpoints are always kept: the newest of each job
(what it resumes from: a running job never loses its place, whatever the counts say) and
every checkpoint a model version references; and a trial's checkpoints are all kept while
its experiment's metric is not known (the experiment not recorded yet), since its best
cannot be told. Everything else is deleted, each with the
rules that no longer keep it. The order is total (value, then the later step, then the
id), so the decision does not depend on the input's order, and the kept set, decided
again, keeps itself (the property tests hold it to that).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class RetentionPolicy(BaseModel):
    """How many checkpoints to keep (Determined's names and defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    save_experiment_best: int = Field(default=0, ge=0, le=1_000_000)
    save_trial_best: int = Field(default=1, ge=0, le=1_000_000)
    save_trial_latest: int = Field(default=1, ge=0, le=1_000_000)


class Goal(BaseModel):
    """An experiment's metric and which way is better (its searcher's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str
    smaller_is_better: bool = True


class Candidate(BaseModel):
    """A checkpoint the catalog still keeps, as the policy sees it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoint_id: str
    job: str = Field(description="the job's uuid: checkpoints of one job are one trial")
    experiment: str | None = None
    step: int
    committed_at: datetime | None = None
    metrics: Mapping[str, float] = Field(default_factory=dict)
    referenced: bool = Field(default=False, description="a model version references it")


class Decision(BaseModel):
    """What the policy keeps, each with why, and what it deletes, each with why not kept."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    keep: dict[str, list[str]]
    delete: dict[str, str]


def _newest_first(c: Candidate) -> tuple[int, float, str]:
    at = c.committed_at.timestamp() if c.committed_at is not None else 0.0
    return (-c.step, -at, c.checkpoint_id)


def _best_first(goal: Goal) -> Callable[[Candidate], tuple[float, int, str]]:
    sign = 1.0 if goal.smaller_is_better else -1.0

    def key(c: Candidate) -> tuple[float, int, str]:
        return (sign * c.metrics[goal.metric], -c.step, c.checkpoint_id)

    return key


def _rated(candidates: Iterable[Candidate], goal: Goal) -> list[Candidate]:
    """The candidates that have a value of the goal's metric, best first."""
    rated = [c for c in candidates if goal.metric in c.metrics]
    rated.sort(key=_best_first(goal))
    return rated


def decide(
    candidates: Sequence[Candidate],
    policy: RetentionPolicy,
    goals: Mapping[str, Goal],
) -> Decision:
    """Keep and delete among ``candidates``: every kept checkpoint of each job named
    (and, for a job of an experiment, of every job of that experiment, for the
    experiment's best). ``goals``: each experiment's metric; the checkpoints of an
    experiment without one (not recorded yet) are all kept until it is known."""
    ids = [c.checkpoint_id for c in candidates]
    if len(set(ids)) != len(ids):
        raise ValueError("a checkpoint appears twice among the candidates")
    keep: dict[str, list[str]] = defaultdict(list)
    by_job: dict[str, list[Candidate]] = defaultdict(list)
    by_experiment: dict[str, list[Candidate]] = defaultdict(list)
    for c in candidates:
        by_job[c.job].append(c)
        if c.experiment is not None:
            by_experiment[c.experiment].append(c)
        if c.referenced:
            keep[c.checkpoint_id].append("a model version references it")
        if c.experiment is not None and c.experiment not in goals:
            # the experiment is not recorded yet: its best cannot be told, so none goes
            keep[c.checkpoint_id].append(f"experiment {c.experiment}'s metric is not known yet")
    for job, own in by_job.items():
        own.sort(key=_newest_first)
        keep[own[0].checkpoint_id].append(f"the newest of job {job} (what it resumes from)")
        for c in own[: policy.save_trial_latest]:
            keep[c.checkpoint_id].append(f"among the latest {policy.save_trial_latest} of its job")
        experiment = own[0].experiment
        goal = goals.get(experiment) if experiment is not None else None
        if goal is not None:
            for c in _rated(own, goal)[: policy.save_trial_best]:
                keep[c.checkpoint_id].append(
                    f"among the best {policy.save_trial_best} of its trial by {goal.metric}"
                )
    for experiment, own in by_experiment.items():
        goal = goals.get(experiment)
        if goal is not None:
            for c in _rated(own, goal)[: policy.save_experiment_best]:
                keep[c.checkpoint_id].append(
                    f"among the best {policy.save_experiment_best} of experiment"
                    f" {experiment} by {goal.metric}"
                )
    delete: dict[str, str] = {}
    for c in candidates:
        if c.checkpoint_id in keep:
            continue
        goal = goals.get(c.experiment) if c.experiment is not None else None
        why = [f"not among the latest {policy.save_trial_latest} of job {c.job}"]
        if goal is not None:
            if goal.metric not in c.metrics:
                why.append(f"no value of {goal.metric} to rank it by")
            else:
                why.append(f"nor the best {policy.save_trial_best} of its trial")
                why.append(
                    f"nor the best {policy.save_experiment_best} of experiment {c.experiment}"
                )
        delete[c.checkpoint_id] = ", ".join(why)
    return Decision(keep=dict(keep), delete=delete)


__all__ = ["Candidate", "Decision", "Goal", "RetentionPolicy", "decide"]
