"""A trial of an experiment, from its own side: its hyperparameters, its budget, its reports.

The searcher creates a trial as an ordinary job whose pods carry the trial's variables
(``trial_env``): the experiment, the trial's index, its hyperparameters and the budget it
was created with. Later budgets come as decisions on ``<env>.trial.decisions`` (``run``:
promoted in place; ``resume``: promoted after a pause, in a new process), so ``Trial``
follows them in a background reader (``follow_trial``) and the training loop asks
``budget()`` at a step boundary, which is one attribute read.

A trial trains while ``used < trial.budget()``; at its budget it reports a validation
metric and waits for the searcher (``wait_for_budget``):

- a larger budget (``run``, or ``resume`` after a pause the operator had not yet carried
  out): returned, and the trial goes on in place;
- ``stop``, ``complete``, or the experiment ``done``: None, and the trial saves its
  checkpoint and exits 0;
- ``pause``: the operator suspends the trial's job, so its processes get SIGTERM. The
  wait goes on until then (``stop``, given the checkpoint's ``stop_requested``, turns the
  SIGTERM into None), because a process that left with 0 by itself before the suspension
  would end its job as Succeeded, and the trial could never be promoted. The resumed job
  starts from the checkpoint and reads its new budget here.

Only one process needs to read the decisions and report: torch's rank 0 (``follow``'s
default). Another rank's ``report_metrics`` checks its arguments and sends nothing, and
its ``budget()`` is the budget it was created with; a torch job makes every rank agree
on rank 0's budget with ``dlrover_events.sdk.torch.TrialSync`` (a broadcast at the step
boundaries where the budget may change: the start and each wait).

Reporting goes through the job's ``Reporter`` (its bounded buffer and sender), so a broker
away never blocks or fails training: the metrics wait in the buffer like any event.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import TracebackType
from typing import Self

from pydantic import TypeAdapter, ValidationError

from dlrover_events.errors import UserError
from dlrover_events.sdk.follow_trial import DecisionFollower
from dlrover_events.sdk.identity import JOB_ID_ENV, IdentityError, JobIdentity
from dlrover_events.sdk.reporter import Reporter
from dlrover_events.sdk.trial_env import (
    EXPERIMENT_ENV,
    TRIAL_BUDGET_ENV,
    TRIAL_BUDGET_UNIT_ENV,
    TRIAL_ENV,
    TRIAL_HPARAMS_ENV,
)
from dlrover_events.settings import Settings, load_settings
from schemas.experiments import (
    MAX_TRIAL_INDEX,
    BudgetUnit,
    DecisionKind,
    ExperimentName,
    ParamName,
    ParamValue,
    TrialDecision,
    TrialMetrics,
    trial_job_name,
)

log = logging.getLogger(__name__)

#: Seconds ``start`` waits for the decisions so far, so a resumed trial's first
#: ``budget()`` is the one it was resumed with (the bus away: the variable's, and the
#: first wait reads the rest).
DEFAULT_CATCH_UP_S = 10.0
#: How often a wait looks at its ``stop``.
_STOP_POLL_S = 0.1

#: The namespace of reports' event ids (``report_id``).
REPORTS = uuid.UUID("6f1d3b0e-4c2a-5b8e-9a47-0d5e2c7b1a93")

_EXPERIMENT: TypeAdapter[str] = TypeAdapter(ExperimentName)
_HPARAMS: TypeAdapter[dict[str, ParamValue]] = TypeAdapter(dict[ParamName, ParamValue])


class TrialError(IdentityError):
    """The trial's variables are there but wrong; the message names the variable."""


class NotATrial(TrialError):
    """This process is not a trial of an experiment (no DLROVER_EVENTS_EXPERIMENT)."""


@dataclass(frozen=True)
class TrialSpec:
    """What the searcher gave the trial when it created its job."""

    experiment: str
    index: int
    hparams: Mapping[str, ParamValue]
    budget: float
    unit: BudgetUnit

    @property
    def job_name(self) -> str:
        return trial_job_name(self.experiment, self.index)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> TrialSpec:
        """The trial's variables, each checked; one error naming the first wrong one."""
        experiment = environ.get(EXPERIMENT_ENV, "").strip()
        if not experiment:
            raise NotATrial(
                f"not a trial: {EXPERIMENT_ENV} is not set (the searcher sets it, with "
                f"{TRIAL_ENV}, {TRIAL_HPARAMS_ENV}, {TRIAL_BUDGET_ENV} and "
                f"{TRIAL_BUDGET_UNIT_ENV}, on every pod of a trial's job)"
            )
        try:
            _EXPERIMENT.validate_python(experiment)
        except ValidationError:
            raise TrialError(
                f"{EXPERIMENT_ENV} must be an experiment's name (a DNS label of at most 50 "
                f"characters), got {experiment!r}"
            ) from None
        index = _required(environ, TRIAL_ENV)
        if not index.isdecimal() or int(index) > MAX_TRIAL_INDEX:
            raise TrialError(
                f"{TRIAL_ENV} must be a trial's index (0 to {MAX_TRIAL_INDEX}), got {index!r}"
            )
        return cls(
            experiment=experiment,
            index=int(index),
            hparams=_hparams(_required(environ, TRIAL_HPARAMS_ENV)),
            budget=_budget(_required(environ, TRIAL_BUDGET_ENV)),
            unit=_unit(_required(environ, TRIAL_BUDGET_UNIT_ENV)),
        )


def _required(environ: Mapping[str, str], name: str) -> str:
    raw = environ.get(name, "").strip()
    if not raw:
        raise TrialError(f"{name} is not set: the searcher sets it on a trial's pods")
    return raw


def _hparams(raw: str) -> dict[str, ParamValue]:
    try:
        parsed = json.loads(raw)
    except ValueError as err:
        raise TrialError(f"{TRIAL_HPARAMS_ENV} is not JSON: {err}") from None
    if not isinstance(parsed, dict):
        raise TrialError(f"{TRIAL_HPARAMS_ENV} must be a JSON object of names to values")
    try:
        return _HPARAMS.validate_python(parsed, strict=True)
    except ValidationError as err:
        errors = err.errors(include_url=False)
        # a value of the right type that breaks a rule (a NUL in a string) says more than
        # the union's first member it is not (a boolean)
        first = next((e for e in errors if e["type"] == "value_error"), errors[0])
        where = ".".join(str(p) for p in first["loc"][:1])
        raise TrialError(f"{TRIAL_HPARAMS_ENV}: {where}: {first['msg']}") from None


def _budget(raw: str) -> float:
    try:
        budget = float(raw)
    except ValueError:
        budget = math.nan
    if not math.isfinite(budget) or budget < 0:
        raise TrialError(f"{TRIAL_BUDGET_ENV} must be a number >= 0, got {raw!r}")
    return budget


def _unit(raw: str) -> BudgetUnit:
    try:
        return BudgetUnit(raw)
    except ValueError:
        units = ", ".join(u.value for u in BudgetUnit)
        raise TrialError(f"{TRIAL_BUDGET_UNIT_ENV} must be one of {units}, got {raw!r}") from None


class TrialStatus(StrEnum):
    """Where the searcher left the trial, by its latest decision about it."""

    RUNNING = "running"  # created, run or resumed: train to ``budget``
    PAUSED = "paused"  # its job is being suspended at a rung
    STOPPED = "stopped"  # stopped early
    COMPLETED = "completed"  # reached its final budget
    DONE = "done"  # the experiment ended

    @property
    def finished(self) -> bool:
        return self in (TrialStatus.STOPPED, TrialStatus.COMPLETED, TrialStatus.DONE)


_STATUS_OF = {
    DecisionKind.CREATE: TrialStatus.RUNNING,
    DecisionKind.RUN: TrialStatus.RUNNING,
    DecisionKind.RESUME: TrialStatus.RUNNING,
    DecisionKind.PAUSE: TrialStatus.PAUSED,
    DecisionKind.STOP: TrialStatus.STOPPED,
    DecisionKind.COMPLETE: TrialStatus.COMPLETED,
    DecisionKind.DONE: TrialStatus.DONE,
}


class _Waiting:
    """``TrialState.answer``'s "not yet": the searcher has not said."""

    def __repr__(self) -> str:
        return "WAIT"


WAIT = _Waiting()


@dataclass(frozen=True)
class TrialState:
    """The trial as its decisions so far left it (pure: a fold over decisions).

    Decisions come at least once, and a restarted searcher publishes the same ones again
    with the same ``seq``: a decision not newer than the last one folded changes nothing.
    """

    experiment: str
    trial: int
    budget: float
    status: TrialStatus = TrialStatus.RUNNING
    #: the ``seq`` of the last decision folded (-1: none yet, the variables' budget)
    seq: int = -1
    decision: TrialDecision | None = field(default=None, compare=False)

    @classmethod
    def of(cls, spec: TrialSpec) -> TrialState:
        return cls(spec.experiment, spec.index, spec.budget)

    def concerns(self, decision: TrialDecision) -> bool:
        """Whether ``decision`` is about this trial (or ends its experiment)."""
        if decision.experiment != self.experiment:
            return False
        return decision.decision is DecisionKind.DONE or decision.trial == self.trial

    def fold(self, decision: TrialDecision) -> TrialState:
        if not self.concerns(decision) or decision.seq <= self.seq:
            return self
        budget = self.budget if decision.budget is None else decision.budget
        return replace(
            self,
            budget=budget,
            status=_STATUS_OF[decision.decision],
            seq=decision.seq,
            decision=decision,
        )

    def answer(self, used: float) -> float | _Waiting | None:
        """What ``wait_for_budget(used)`` returns now: a budget above ``used`` to go on
        to, None when the trial is finished, or WAIT (a pause waits for its SIGTERM)."""
        if self.status.finished:
            return None
        if self.status is TrialStatus.RUNNING and self.budget > used:
            return self.budget
        return WAIT


def report_id(
    experiment: str, trial: int, step: int, validation: bool, names: Iterable[str]
) -> uuid.UUID:
    """A report's event id, derived from what it reports: a trial resumed from its
    checkpoint that reports the same step again (its last life may or may not have)
    makes the same event, which consumers keep once, as they keep a resent one."""
    kind = "validation" if validation else "training"
    return uuid.uuid5(REPORTS, f"{experiment}/{trial}/{step}/{kind}/{','.join(sorted(names))}")


def metrics_event(
    spec: TrialSpec,
    identity: JobIdentity,
    step: int,
    metrics: Mapping[str, float],
    *,
    validation: bool = False,
    budget_used: float | None = None,
) -> TrialMetrics:
    """The TrialMetrics event of one report, or ValueError naming what is wrong (pure)."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    if budget_used is None:
        if spec.unit is not BudgetUnit.STEPS:
            raise ValueError(
                f"budget_used is required: this experiment's budget counts {spec.unit.value}"
            )
        budget_used = float(step)
    if not metrics:
        raise ValueError("metrics must name at least one metric")
    values: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"metric {name!r} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"metric {name!r} must be a finite number, got {value!r}")
        values[name] = float(value)
    if isinstance(budget_used, bool) or not isinstance(budget_used, numbers.Real):
        raise ValueError(f"budget_used must be a number, got {budget_used!r}")
    try:
        return TrialMetrics(
            event_id=report_id(spec.experiment, spec.index, int(step), validation, values),
            env=identity.env,
            source=identity.source,
            experiment=spec.experiment,
            trial=spec.index,
            step=int(step),
            budget=float(budget_used),
            validation=validation,
            metrics=values,
        )
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where}: {first['msg']}") from None


class Trial:
    """This process's trial: ``hparams()``, ``budget()``, ``report_metrics()`` and
    ``wait_for_budget()``. ``start()`` before (or ``with``), ``close()`` after.

    ``reporter`` is the job's own (its TorchHook's, say) when it has one; otherwise the
    trial makes one and closes it. ``follow``: read the trial's decisions in this
    process (default: when this is torch's rank 0).
    """

    def __init__(
        self,
        spec: TrialSpec,
        identity: JobIdentity,
        *,
        reporter: Reporter | None = None,
        settings: Settings | None = None,
        follow: bool | None = None,
        catch_up_s: float = DEFAULT_CATCH_UP_S,
    ) -> None:
        self.spec = spec
        self.identity = identity
        #: whether this process reports (the others' reports are checked and not sent)
        self.reports = identity.process_rank == 0
        self.follows = self.reports if follow is None else follow
        self.catch_up_s = catch_up_s
        self._owns_reporter = reporter is None
        self._reporter = reporter
        #: the bus's settings as given (None: the environment's, read by whoever needs them)
        self._settings = settings
        settings_error: UserError | None = None
        if settings is None and self.follows:
            try:
                settings = load_settings()
            except UserError as err:  # said once by the follower; never raised into training
                settings, settings_error = Settings.model_construct(), err
        self._changed = threading.Condition()
        self._state = TrialState.of(spec)
        self._follower: DecisionFollower | None = None
        if self.follows:
            assert settings is not None
            self._follower = DecisionFollower(
                settings,
                identity.env,
                spec.experiment,
                self._fold,
                settings_error=settings_error,
            )
        self._started = False
        self._closed = False

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        reporter: Reporter | None = None,
        settings: Settings | None = None,
        follow: bool | None = None,
        catch_up_s: float = DEFAULT_CATCH_UP_S,
    ) -> Trial:
        """This pod's trial, as the searcher described it; NotATrial when this process is
        none (a training script may then run on its own arguments). Without
        DLROVER_EVENTS_JOB_ID the job's id is the trial's job name."""
        env = os.environ if environ is None else environ
        spec = TrialSpec.from_environ(env)
        if reporter is not None:
            identity = reporter.identity
        else:
            identity = JobIdentity.from_env(
                env, job_id=env.get(JOB_ID_ENV, "").strip() or spec.job_name
            )
        return cls(
            spec,
            identity,
            reporter=reporter,
            settings=settings,
            follow=follow,
            catch_up_s=catch_up_s,
        )

    # -- what the training loop asks -----------------------------------------------------

    @property
    def experiment(self) -> str:
        return self.spec.experiment

    @property
    def index(self) -> int:
        return self.spec.index

    @property
    def unit(self) -> BudgetUnit:
        return self.spec.unit

    def hparams(self) -> dict[str, ParamValue]:
        return dict(self.spec.hparams)

    def budget(self) -> float:
        """The latest budget the searcher gave this trial (one attribute read)."""
        return self._state.budget

    @property
    def status(self) -> TrialStatus:
        return self._state.status

    @property
    def decision(self) -> TrialDecision | None:
        """The searcher's latest decision about this trial (None: only its variables)."""
        return self._state.decision

    def describe(self) -> str:
        """One line for a log: the trial, its budget and what the searcher last said."""
        d = self._state.decision
        said = "created by its variables" if d is None else f"{d.decision.value} (#{d.seq})"
        reason = f": {d.reason}" if d is not None and d.reason else ""
        return (
            f"trial {self.spec.job_name}: {self._state.status.value}, budget "
            f"{self._state.budget:g} {self.spec.unit.value}, last decision {said}{reason}"
        )

    def report_metrics(
        self,
        step: int,
        metrics: Mapping[str, float],
        *,
        validation: bool = False,
        budget_used: float | None = None,
    ) -> bool:
        """Report what the trial measured at ``step`` (validation metrics are what the
        searcher decides on). ``budget_used`` defaults to ``step`` when the budget counts
        steps. Bad values raise ValueError here, naming the metric; True when the report
        was queued for the bus (this process reports: rank 0). The same report made again
        (a trial resumed at that step) is the same event (``report_id``)."""
        event = metrics_event(
            self.spec,
            self.identity,
            step,
            metrics,
            validation=validation,
            budget_used=budget_used,
        )
        if not self.reports:
            return False
        reporter = self._reporter_now()
        reporter.publish(event.model_copy(update={"env": reporter.identity.env}))
        return True

    def wait_for_budget(
        self,
        used: float,
        timeout_s: float | None = None,
        *,
        stop: Callable[[], bool] | None = None,
    ) -> float | None:
        """Block until the searcher gives a budget above ``used`` and return it (promoted
        in place: go on), or return None when the trial is finished (stopped, complete,
        the experiment done) or ``stop()`` says the process is stopping (the SIGTERM of
        a pause's suspension: pass ``lambda: checkpoint.stop_requested``). On None save the
        checkpoint and leave: exit 0, or as SIGTERM asked when ``stop()`` said so.

        A pause alone does not return: the operator suspends the job, and its SIGTERM
        ends the wait. TimeoutError after ``timeout_s``; RuntimeError in a process that
        does not follow the decisions (a rank other than 0: ``TrialSync`` waits for all).
        """
        if self._follower is None:
            raise RuntimeError(
                f"{self.spec.job_name}: this process does not follow the trial's decisions "
                "(only rank 0 does); torch ranks wait together with TrialSync"
            )
        if not self._started:
            self.start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        said = False
        with self._changed:
            while True:
                answer = self._state.answer(used)
                if not isinstance(answer, _Waiting):
                    return answer
                if stop is not None and stop():
                    return None
                if not said:
                    said = True
                    log.info("%s: waiting for the searcher at %g", self.describe(), used)
                pause = _STOP_POLL_S if stop is not None else None
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(
                            f"{self.spec.job_name}: no budget above {used:g} within "
                            f"{timeout_s:g} s ({self.describe()})"
                        )
                    pause = left if pause is None else min(pause, left)
                self._changed.wait(pause)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Self:
        """Start reporting and following; wait up to ``catch_up_s`` for the decisions so
        far, so that ``budget()`` is the searcher's latest from the first step."""
        if self._started or self._closed:
            return self
        self._started = True
        if self._owns_reporter and self.reports:
            self._reporter_now().start()
        if self._follower is not None:
            self._follower.start()
            if not self._follower.caught_up.wait(self.catch_up_s):
                log.warning(
                    "%s: the searcher's decisions not read within %.0f s; going on with "
                    "what is known (%s)",
                    self.spec.job_name,
                    self.catch_up_s,
                    self._follower.last_error or "no error",
                )
        if self.follows:
            hparams = json.dumps(dict(self.spec.hparams))
            log.info("%s, hyperparameters %s", self.describe(), hparams)
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop following, and send what is left of the reports (the trial's own
        reporter) for up to ``timeout_s``."""
        if self._closed:
            return
        self._closed = True
        if self._follower is not None:
            self._follower.close(timeout_s)
        if self._owns_reporter and self._reporter is not None:
            self._reporter.close(timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _reporter_now(self) -> Reporter:
        if self._reporter is None:
            self._reporter = Reporter(self.identity, settings=self._settings)
        return self._reporter

    def _fold(self, decision: TrialDecision) -> None:
        """Called on the follower's thread for each decision of the experiment."""
        with self._changed:
            before = self._state
            self._state = after = before.fold(decision)
            if after is not before:
                log.info("%s", self.describe())
                self._changed.notify_all()


__all__ = [
    "WAIT",
    "NotATrial",
    "Trial",
    "TrialError",
    "TrialSpec",
    "TrialState",
    "TrialStatus",
    "metrics_event",
    "report_id",
]
