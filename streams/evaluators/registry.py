"""The evaluators by name, written out here (no import side effects register anything),
so the evaluator service, `evaluate`, the A/B runs and the tests find the same ones.

A new KPI is a function over the contract of `api.py` in `kpis.py`, named below with the
metrics of it that are better higher.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from dlrover_events.registry import Registry
from streams.evaluators import kpis
from streams.evaluators.api import EvaluatorSpec, Metrics, UnknownEvaluator
from streams.evaluators.ledger import JobRecord

EVALUATORS: Registry[EvaluatorSpec] = Registry.of(
    "evaluator",
    EvaluatorSpec(
        "jct",
        "job completion time (submit -> finish) of the jobs that finished",
        kpis.jct,
        higher_is_better=frozenset({"jobs_completed"}),
    ),
    EvaluatorSpec("queueing", "delay from submission to start", kpis.queueing),
    EvaluatorSpec(
        "gpu_hours",
        "GPU-hours allocated to the jobs (running ones up to the window end)",
        kpis.gpu_hours,
    ),
    EvaluatorSpec(
        "throughput",
        "samples/s per allocated GPU, averaged over runtime samples",
        kpis.throughput,
        higher_is_better=frozenset({"throughput_per_gpu"}),
    ),
    EvaluatorSpec(
        "oom",
        "OOM events, and recurrences: OOMs of a node that had already OOMed",
        kpis.oom,
    ),
    EvaluatorSpec("churn", "plans per job-hour of running time", kpis.churn),
    EvaluatorSpec(
        "failures", "jobs that failed, and their share of the finished jobs", kpis.failures
    ),
    EvaluatorSpec(
        "experiments",
        "an experiment's best validation metric (lower is better: a loss) and when it was "
        "reached, its trials' GPU-hours, and the other jobs' mean JCT beside them",
        kpis.experiments,
        higher_is_better=frozenset({"other_jobs_completed"}),
    ),
    unknown=UnknownEvaluator,
)

#: The metrics better higher, of every registered evaluator (the rest are better lower).
HIGHER_IS_BETTER: frozenset[str] = frozenset().union(
    *(spec.higher_is_better for spec in EVALUATORS.values())
)


def evaluate(
    jobs: Sequence[JobRecord], until: datetime | None, names: Sequence[str] | None = None
) -> Metrics:
    """The metrics of the evaluators `names` (default: all) over `jobs`, with their
    count; an UnknownEvaluator (a KeyError) naming the known ones for a name not
    registered."""
    chosen = names or list(EVALUATORS)
    unknown = [n for n in chosen if n not in EVALUATORS]
    if unknown:
        raise UnknownEvaluator(f"unknown evaluator(s) {unknown}; known: {sorted(EVALUATORS)}")
    out: Metrics = {"jobs": float(len(jobs))}
    for name in chosen:
        out.update(EVALUATORS[name].fn(jobs, until))
    return out


__all__ = ["EVALUATORS", "HIGHER_IS_BETTER", "evaluate"]
