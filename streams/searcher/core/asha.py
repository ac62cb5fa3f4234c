"""Asynchronous successive halving (ASHA), as Determined runs it (``adaptive_asha.go``,
``asha.go``), with a paused trial suspended on the shared queue instead of idle.

Rungs. A bracket of R rungs gives a trial budget ``max / divisor**(R-1-r)`` at rung r
(rounded down to whole units, as Determined's lengths are; the last rung is ``max``
itself). The experiment's rungs are ``max_rungs``, capped as Determined caps them: so
that the lowest rung's budget is at least one unit (``divisor**(R-1) <= max``) and so
that ``max_trials`` trials can fill the lowest rung's promotions up to the top
(``divisor**(R-1) <= max_trials``).

Brackets (``mode``), Determined's reading of Hyperband: ``aggressive`` is one bracket of
all R rungs (every trial starts at the lowest budget); ``standard`` is the brackets of R,
R-1, ... down to ``(R-1)//2 + 1`` rungs; ``conservative`` those of R down to 1 rung (a
one-rung bracket is random search at the full budget). Brackets with fewer rungs start
their trials at a larger budget and stop fewer early. ``max_trials`` is split across the
brackets so each gets about the same total budget (bracket weight
``divisor**(rungs-1) / rungs``, at least one trial each, the remainder to the first), and
``max_concurrent_trials`` evenly (at least one each, the remainder to the first brackets);
with no limit given (0), each bracket may run ``max(trials of the last bracket, divisor)``
at once, as Determined's default. Brackets are served most rungs first, each up to its
share; a slot that no bracket can use within its share goes to any bracket that has work,
so the experiment's slots are never idle while work waits. ``max_concurrent_trials``
bounds the whole experiment in every case.

Promotions. When a trial reports its validation value at its rung's budget, it enters the
rung, ranked (best first, ``smaller_is_better`` respected; a tie ranks after those who
reported first, as Determined's insertion does). The top ``n // divisor`` of the n
trials at a rung are promoted, each once: the reporter, when it is among them and the rung
is not the last, runs on in place to the next rung's budget (``run``); otherwise it waits
(``pause``: suspended, its slots free). When a report or an end makes a paused trial one
of the top ``n // divisor``, it is promoted (Determined's asynchronous rule: with one more
trial at a rung, at most one more is owed a promotion) and resumed to the next rung's
budget (``resume``) as soon as a slot is free; promotions go before new trials. A trial at
the last rung's budget is ``complete``. A trial whose job ends before its budget enters
the rung it was heading to as the worst there (Determined's exited-early value), so the
rung still fills and others still get promoted.

The end. A bracket creates new trials at its lowest rung while it has fewer than its
share. Once it has created them all, a rung none of whose trials (nor any below it) is
still on its way there can promote no more (Determined's close-out): its paused trials
that were not promoted are ``stop``ped (a reporter that would wait at such a rung is
stopped at once). The experiment is done when every trial has been created and none is
live.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from schemas.experiments import AshaMode, ExperimentSpec, SearcherSpec
from streams.searcher.core.api import (
    Answer,
    Complete,
    Create,
    JsonValue,
    Operation,
    Pause,
    Resume,
    Run,
    SearchContext,
    Searcher,
    SearcherError,
    Stop,
    Trial,
    TrialStatus,
    number,
)
from streams.searcher.core.space import sample


@dataclass(frozen=True, slots=True)
class BracketPlan:
    """One bracket: its rungs' budgets, its share of the trials and of the slots."""

    budgets: tuple[float, ...]
    max_trials: int
    max_concurrent: int

    @property
    def rungs(self) -> int:
        return len(self.budgets)


def rung_count(searcher: SearcherSpec) -> int:
    """The experiment's rungs: ``max_rungs`` capped as Determined caps them (module
    docstring), at least one."""
    divisor = searcher.divisor
    by_budget = 1
    while divisor**by_budget <= searcher.budget.max:
        by_budget += 1
    by_trials = 1
    while divisor**by_trials <= searcher.max_trials:
        by_trials += 1
    return max(1, min(searcher.max_rungs, by_budget, by_trials))


def bracket_rungs(mode: AshaMode, rungs: int) -> list[int]:
    """The rungs of each bracket, most first (Determined's modes)."""
    if mode is AshaMode.AGGRESSIVE:
        return [rungs]
    lowest = 1 if mode is AshaMode.CONSERVATIVE else (rungs - 1) // 2 + 1
    return list(range(rungs, lowest - 1, -1))


def budgets(maximum: float, divisor: int, rungs: int) -> tuple[float, ...]:
    """The budget of each rung of a bracket of ``rungs``: the last is ``maximum``, each
    below ``divisor`` times smaller, in whole units."""
    return tuple(
        float(maximum)
        if r == rungs - 1
        else float(max(math.floor(maximum / divisor ** (rungs - 1 - r)), 1))
        for r in range(rungs)
    )


def _trial_shares(max_trials: int, divisor: int, rungs: Sequence[int]) -> list[int]:
    weights = [divisor ** (n - 1) / n for n in rungs]
    total = sum(weights)
    shares = [max(int(w / total * max_trials), 1) for w in weights]
    shares[0] += max(max_trials - sum(shares), 0)
    # never more than max_trials in all: take back from the last brackets
    i = len(shares) - 1
    while sum(shares) > max_trials and i >= 0:
        take = min(sum(shares) - max_trials, shares[i] - (1 if i == 0 else 0))
        shares[i] -= take
        i -= 1
    return shares


def _slot_shares(max_concurrent: int, divisor: int, trials: Sequence[int]) -> list[int]:
    count = len(trials)
    if max_concurrent == 0:
        return [max(trials[-1], divisor)] * count
    spread = max(max_concurrent, count)
    return [spread // count + (1 if i < spread % count else 0) for i in range(count)]


def plan(searcher: SearcherSpec) -> tuple[BracketPlan, ...]:
    """The brackets of an experiment (module docstring); a bracket left no trial by the
    split is dropped."""
    rungs = bracket_rungs(searcher.mode, rung_count(searcher))
    trials = _trial_shares(searcher.max_trials, searcher.divisor, rungs)
    kept = [(n, t) for n, t in zip(rungs, trials, strict=True) if t > 0]
    slots = _slot_shares(searcher.max_concurrent_trials, searcher.divisor, [t for _, t in kept])
    return tuple(
        BracketPlan(budgets(searcher.budget.max, searcher.divisor, n), t, s)
        for (n, t), s in zip(kept, slots, strict=True)
    )


@dataclass(frozen=True, slots=True)
class Entry:
    """A trial at a rung: its value there (None: it ended before reporting there, the
    worst), and whether it was promoted from there."""

    trial: int
    value: float | None
    promoted: bool = False


@dataclass(frozen=True, slots=True)
class Waiting:
    """A paused trial promoted while no slot was free: resumed when one is, for ``reason``."""

    trial: int
    reason: str


@dataclass(frozen=True, slots=True)
class Bracket:
    """A bracket's plan and what happened in it: its trials (in creation order), its rungs'
    entries (best first) and its promotions waiting for a slot (first promoted first)."""

    plan: BracketPlan
    trials: tuple[int, ...] = ()
    rungs: tuple[tuple[Entry, ...], ...] = ()
    waiting: tuple[Waiting, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "budgets": list(self.plan.budgets),
            "max_trials": self.plan.max_trials,
            "max_concurrent": self.plan.max_concurrent,
            "trials": list(self.trials),
            "rungs": [[[e.trial, e.value, e.promoted] for e in rung] for rung in self.rungs],
            "waiting": [[w.trial, w.reason] for w in self.waiting],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Bracket:
        return cls(
            BracketPlan(
                tuple(float(b) for b in raw["budgets"]),
                int(raw["max_trials"]),
                int(raw["max_concurrent"]),
            ),
            tuple(int(t) for t in raw["trials"]),
            tuple(
                tuple(Entry(int(t), None if v is None else float(v), bool(p)) for t, v, p in rung)
                for rung in raw["rungs"]
            ),
            tuple(Waiting(int(t), str(r)) for t, r in raw["waiting"]),
        )


@dataclass(frozen=True, slots=True)
class AshaMemo:
    """ASHA's memory of an experiment: its brackets, and each trial's bracket by index."""

    brackets: tuple[Bracket, ...]
    bracket_of: tuple[int, ...] = ()

    def to_json(self) -> JsonValue:
        return {
            "brackets": [b.to_json() for b in self.brackets],
            "bracket_of": list(self.bracket_of),
        }

    @classmethod
    def from_json(cls, raw: JsonValue) -> AshaMemo:
        return cls(
            tuple(Bracket.from_json(b) for b in raw["brackets"]),
            tuple(int(b) for b in raw["bracket_of"]),
        )


class AshaSearcher(Searcher[AshaMemo]):
    name = "asha"
    description = (
        "asynchronous successive halving as Determined's (divisor, max_rungs, mode): the "
        "top 1/divisor of each rung promoted, the others paused, their slots free"
    )

    def check(self, spec: ExperimentSpec) -> str | None:
        if spec.searcher.early_stopping is not None:
            return (
                "spec.searcher.early_stopping: asha stops trials itself, at its rungs; the "
                "median-stop assessor is for grid and random"
            )
        return None

    def concurrency(self, spec: ExperimentSpec) -> int | None:
        return sum(b.max_concurrent for b in plan(spec.searcher))

    def start(self, spec: ExperimentSpec) -> AshaMemo:
        return AshaMemo(tuple(Bracket(p, (), ((),) * p.rungs) for p in plan(spec.searcher)))

    def fill(self, ctx: SearchContext, memo: AshaMemo) -> Answer[AshaMemo]:
        work = _Work(ctx, memo)
        for b in range(len(work.plans)):
            work.close_out(b)
        if not ctx.paused:
            work.use_slots()
        return work.answer()

    def validated(
        self, ctx: SearchContext, memo: AshaMemo, trial: int, budget: float, value: float
    ) -> Answer[AshaMemo]:
        work = _Work(ctx, memo)
        work.reached(ctx.trials[trial], budget, value)
        return work.answer()

    def ended(self, ctx: SearchContext, memo: AshaMemo, trial: int) -> Answer[AshaMemo]:
        work = _Work(ctx, memo)
        work.ended(ctx.trials[trial])
        return work.answer()

    def exhausted(self, ctx: SearchContext, memo: AshaMemo) -> bool:
        return all(len(b.trials) >= b.plan.max_trials and not b.waiting for b in memo.brackets)

    def memo_from_json(self, raw: JsonValue) -> AshaMemo:
        return AshaMemo.from_json(raw)


class _Work:
    """One call's working copy of the memo (lists where the memo has tuples), and the
    operations it answers; ``answer`` freezes it again."""

    def __init__(self, ctx: SearchContext, memo: AshaMemo) -> None:
        self.ctx = ctx
        searcher = ctx.searcher
        self.divisor = searcher.divisor
        self.smaller = searcher.smaller_is_better
        self.metric = searcher.metric
        self.plans = [b.plan for b in memo.brackets]
        self.trials = [list(b.trials) for b in memo.brackets]
        self.rungs = [[list(rung) for rung in b.rungs] for b in memo.brackets]
        self.waiting = [list(b.waiting) for b in memo.brackets]
        self.bracket_of = list(memo.bracket_of)
        self.ops: list[Operation] = []

    def answer(self) -> Answer[AshaMemo]:
        memo = AshaMemo(
            tuple(
                Bracket(p, tuple(ts), tuple(tuple(r) for r in rs), tuple(ws))
                for p, ts, rs, ws in zip(
                    self.plans, self.trials, self.rungs, self.waiting, strict=True
                )
            ),
            tuple(self.bracket_of),
        )
        return Answer(memo, tuple(self.ops))

    # -- rungs ---------------------------------------------------------------------------

    def _key(self, value: float | None) -> tuple[bool, float]:
        if value is None:
            return (True, 0.0)
        return (False, value if self.smaller else -value)

    def _enter(self, b: int, r: int, entry: Entry) -> None:
        rung = self.rungs[b][r]
        keys = [self._key(e.value) for e in rung]
        rung.insert(bisect_right(keys, self._key(entry.value)), entry)

    def _has_entry(self, b: int, r: int, trial: int) -> bool:
        return any(e.trial == trial for e in self.rungs[b][r])

    def _where(self, b: int, r: int, value: float) -> str:
        plan = self.plans[b]
        return f"rung {r} (budget {number(plan.budgets[r])}): {self.metric} {number(value)}"

    def _promote(self, b: int, r: int, reporter: int | None) -> str | None:
        """Promote the top ``n // divisor`` of rung r not promoted yet; the reason when the
        reporter is one of them (it runs on in place: the caller answers ``Run``)."""
        plan = self.plans[b]
        if r >= plan.rungs - 1:
            return None
        rung = self.rungs[b][r]
        n = len(rung)
        top = n // self.divisor
        mine: str | None = None
        for pos in range(top):
            entry = rung[pos]
            if entry.promoted:
                continue
            rung[pos] = replace(entry, promoted=True)
            if entry.value is None or not self.ctx.trials[entry.trial].live:
                # it ended: it enters the next rung as the worst, as Determined's exited trials do
                self._enter(b, r + 1, Entry(entry.trial, None))
                self._promote(b, r + 1, None)
                continue
            why = (
                f"{self._where(b, r, entry.value)} is in the top 1/{self.divisor} of {n} "
                f"trials there: promoted to rung {r + 1} (budget {number(plan.budgets[r + 1])})"
            )
            if entry.trial == reporter:
                mine = why
            elif self.ctx.trials[entry.trial].status is TrialStatus.PAUSED:
                self.waiting[b].append(Waiting(entry.trial, why))
            else:
                raise SearcherError(
                    f"asha: trial {entry.trial} is {self.ctx.trials[entry.trial].status} at "
                    f"rung {r} without having been promoted from it"
                )
        return mine

    # -- where trials are ----------------------------------------------------------------

    def _heading(self, trial: Trial, waiting: set[int]) -> int | None:
        """The rung a live trial is on its way to; None if it waits at its rung or ended."""
        if not trial.live or trial.rung is None:
            return None
        if trial.index in waiting:
            return trial.rung + 1
        if trial.status is TrialStatus.PAUSED and not trial.held:
            return None
        return trial.rung

    def _open_below(self, b: int, exclude: int | None = None) -> int:
        """The lowest rung of bracket b that some trial is still on its way to (its number
        of rungs if none): every rung below it can promote no more, once the bracket has
        created all its trials."""
        waiting = {w.trial for w in self.waiting[b]}
        lowest = self.plans[b].rungs
        for index in self.trials[b]:
            if index == exclude or index >= len(self.ctx.trials):
                continue
            heading = self._heading(self.ctx.trials[index], waiting)
            if heading is not None:
                lowest = min(lowest, heading)
        return lowest

    def _all_created(self, b: int) -> bool:
        return len(self.trials[b]) >= self.plans[b].max_trials

    def _closed_text(self, b: int, r: int, value: float) -> str:
        n = len(self.rungs[b][r])
        return (
            f"{self._where(b, r, value)} is not in the top 1/{self.divisor} of {n} trials "
            f"there, and no trial can enter the rung any more (all {self.plans[b].max_trials} "
            "of its bracket created, none on its way there): stopped"
        )

    # -- the calls -----------------------------------------------------------------------

    def reached(self, trial: Trial, budget: float, value: float) -> None:
        if budget < trial.budget or trial.rung is None:
            return  # not at its rung's budget yet: ASHA decides at rungs only
        b, r = self.bracket_of[trial.index], trial.rung
        if self._has_entry(b, r, trial.index):
            return  # a report repeated
        self._enter(b, r, Entry(trial.index, value))
        plan = self.plans[b]
        if r == plan.rungs - 1:
            why = f"{self._where(b, r, value)}: reached the last rung"
            self.ops.append(Complete(trial.index, why))
            return
        promoted = self._promote(b, r, trial.index)
        if promoted is not None:
            self.ops.append(Run(trial.index, plan.budgets[r + 1], promoted, rung=r + 1))
        elif self._all_created(b) and self._open_below(b, exclude=trial.index) > r:
            self.ops.append(Stop(trial.index, self._closed_text(b, r, value)))
        else:
            n = len(self.rungs[b][r])
            why = (
                f"{self._where(b, r, value)} is not in the top 1/{self.divisor} of {n} "
                "trials there: paused at the rung until it is"
            )
            self.ops.append(Pause(trial.index, why))

    def ended(self, trial: Trial) -> None:
        if trial.rung is None or trial.index >= len(self.bracket_of):
            return
        b = self.bracket_of[trial.index]
        waits = [w for w in self.waiting[b] if w.trial == trial.index]
        if waits:
            self.waiting[b] = [w for w in self.waiting[b] if w.trial != trial.index]
            heading: int | None = trial.rung + 1
        elif self._has_entry(b, trial.rung, trial.index):
            heading = None  # it waited at its rung: its value there stands
        else:
            heading = trial.rung
        if heading is not None and heading < self.plans[b].rungs:
            self._enter(b, heading, Entry(trial.index, None))
            self._promote(b, heading, None)

    def close_out(self, b: int) -> None:
        if not self._all_created(b):
            return
        waiting = {w.trial for w in self.waiting[b]}
        for r in range(self._open_below(b)):
            for entry in self.rungs[b][r]:
                trial = self.ctx.trials[entry.trial]
                if (
                    entry.promoted
                    or entry.value is None
                    or trial.status is not TrialStatus.PAUSED
                    or trial.held
                    or trial.index in waiting
                ):
                    continue
                self.ops.append(Stop(trial.index, self._closed_text(b, r, entry.value)))

    def use_slots(self) -> None:
        slots = self.ctx.slots
        active = [0] * len(self.plans)
        for index, b in enumerate(self.bracket_of):
            if self.ctx.trials[index].active:
                active[b] += 1
        # each bracket up to its share, most rungs first; then any slot left to whoever has work
        for b, plan in enumerate(self.plans):
            while slots > 0 and active[b] < plan.max_concurrent and self._start_one(b):
                slots -= 1
                active[b] += 1
        for b in range(len(self.plans)):
            while slots > 0 and self._start_one(b):
                slots -= 1

    def _start_one(self, b: int) -> bool:
        """Resume bracket b's first waiting promotion, else create its next trial."""
        plan = self.plans[b]
        if self.waiting[b]:
            waiting = self.waiting[b].pop(0)
            rung = self.ctx.trials[waiting.trial].rung
            assert rung is not None
            self.ops.append(
                Resume(waiting.trial, plan.budgets[rung + 1], waiting.reason, rung=rung + 1)
            )
            return True
        if self._all_created(b):
            return False
        index = len(self.bracket_of)
        spec = self.ctx.spec
        hparams = sample(spec.hyperparameters, spec.searcher.seed, index)
        self.bracket_of.append(b)
        self.trials[b].append(index)
        rungs = ", ".join(number(x) for x in plan.budgets)
        where = f" of bracket {b + 1} of {len(self.plans)}" if len(self.plans) > 1 else ""
        why = (
            f"new trial at rung 0 (budget {number(plan.budgets[0])}){where}; rungs at "
            f"budgets {rungs}"
        )
        self.ops.append(Create(index, hparams, plan.budgets[0], why, rung=0))
        return True


__all__ = [
    "AshaMemo",
    "AshaSearcher",
    "Bracket",
    "BracketPlan",
    "Entry",
    "Waiting",
    "bracket_rungs",
    "budgets",
    "plan",
    "rung_count",
]
