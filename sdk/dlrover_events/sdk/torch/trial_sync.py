"""A trial's budget, agreed by every rank of a torch job (``TrialSync``).

Only rank 0 follows the trial's decisions (``dlrover_events.sdk.trial``); the ranks of a
data-parallel job must still stop at the same step and go on together when the trial is
promoted, or one rank waits in an all-reduce the others never join. So rank 0's view is
broadcast where the budget may change for the loop: once at the start (a resumed trial's
budget comes from the searcher, not from its variables) and at each wait at the budget.
Between those the budget is a local read on every rank, so a step pays nothing.

A wait is cut in slices of ``slice_s``: rank 0 waits a slice for the searcher, then tells
every rank "still waiting", so no collective is left open longer than that (keep the
process group's timeout above it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from dlrover_events.sdk.torch.ranks import world
from dlrover_events.sdk.trial import Trial

#: What rank 0 tells the others after a slice of a wait.
_GO_ON, _FINISHED, _WAITING, _TIMED_OUT = 0.0, 1.0, 2.0, 3.0
DEFAULT_SLICE_S = 10.0


class TrialSync:
    """``budget()`` and ``wait_for_budget()`` that every rank calls at the same step."""

    def __init__(self, trial: Trial, *, src: int = 0, slice_s: float = DEFAULT_SLICE_S) -> None:
        if slice_s <= 0:
            raise ValueError(f"slice_s must be > 0, got {slice_s}")
        self.trial = trial
        self.src = src
        self.slice_s = slice_s
        self._budget = trial.budget()

    def budget(self) -> float:
        """The budget every rank agreed on last (no collective)."""
        return self._budget

    def refresh(self) -> float:
        """Every rank takes rank 0's budget now (a collective: every rank calls it)."""
        _, budget = self._share(_GO_ON, self.trial.budget() if self._is_src() else 0.0)
        self._budget = budget
        return budget

    def wait_for_budget(
        self,
        used: float,
        timeout_s: float | None = None,
        *,
        stop: Callable[[], bool] | None = None,
    ) -> float | None:
        """``Trial.wait_for_budget`` on rank 0, its answer on every rank (a collective).

        ``stop`` is rank 0's to ask (the agent sends SIGTERM to every worker, so rank 0's
        ``checkpoint.stop_requested`` speaks for all)."""
        if world()[1] == 1:
            found = self.trial.wait_for_budget(used, timeout_s, stop=stop)
            self._budget = found if found is not None else self._budget
            return found
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            code, budget = _WAITING, 0.0
            if self._is_src():
                code, budget = self._slice(used, deadline, stop)
            code, budget = self._share(code, budget)
            if code == _GO_ON:
                self._budget = budget
                return budget
            if code == _FINISHED:
                return None
            if code == _TIMED_OUT:
                raise TimeoutError(f"no budget above {used:g} within {timeout_s:g} s")

    def _slice(
        self, used: float, deadline: float | None, stop: Callable[[], bool] | None
    ) -> tuple[float, float]:
        wait = self.slice_s
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return _TIMED_OUT, 0.0
            wait = min(wait, left)
        try:
            found = self.trial.wait_for_budget(used, wait, stop=stop)
        except TimeoutError:
            return _WAITING, 0.0
        return (_FINISHED, 0.0) if found is None else (_GO_ON, found)

    def _is_src(self) -> bool:
        return world()[0] == self.src

    def _share(self, code: float, budget: float) -> tuple[float, float]:
        if world()[1] == 1:
            return code, budget
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend() == "nccl"
            else torch.device("cpu")
        )
        t = torch.tensor([code, budget], dtype=torch.float64, device=device)
        dist.broadcast(t, self.src)
        got_code, got_budget = (float(v) for v in t.tolist())
        if not math.isfinite(got_budget):
            raise RuntimeError(f"rank {self.src} sent a budget that is no number")
        return got_code, got_budget


__all__ = ["DEFAULT_SLICE_S", "TrialSync"]
