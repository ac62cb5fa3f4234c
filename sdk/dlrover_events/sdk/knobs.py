"""Training knobs (local batch size, gradient accumulation) switched at a step boundary.

Only the training process can change its micro-batch, and only between two optimizer
steps: the plan follower's thread hands a plan over (``offer``), and the training loop asks
``at_step_boundary(step)`` before each step, which costs one attribute read while nothing
changed. In a torch world every rank must switch at the same step, or their gradient
all-reduces stop matching: rank 0 alone decides, and its decision reaches the other ranks
through ``sync`` (a broadcast, every ``sync_every`` steps only), so the ranks need not
follow the plan themselves.

The global batch is ``local_batch_size x accumulation_steps x world_size`` and is what
convergence depends on, so it is kept: a plan giving only ``local_batch_size`` (the brain
sizes micro-batches to memory) gets the accumulation that keeps the target global batch,
and so does a new world size after a re-rendezvous. When the target does not divide
evenly, the accumulation giving the nearest global batch is taken (on a tie the larger:
a batch a little larger than planned rather than smaller), and the target is kept as it
was, so rounding never accumulates over several switches. A plan giving
``accumulation_steps`` sets the global batch itself (with both knobs, or with the local
batch kept: the job never raises its own micro-batch, that is the brain's call).

Rank 0 confirms a plan's knobs with one ``TrainingApplied`` through the reporter, so the
job confirms once, however many ranks it has.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from schemas.plans import TRAINING_KNOBS, JobPlan, TrainingApplied

if TYPE_CHECKING:
    from dlrover_events.sdk.follow_plan import PlanFollower
    from dlrover_events.sdk.reporter import Reporter

log = logging.getLogger(__name__)

#: Rank 0's decision as the ranks exchange it: (switch?, local batch, accumulation, target).
KnobVector = list[int]
#: Makes every rank return rank 0's vector (a broadcast); a collective, so every rank must
#: call it at the same steps.
KnobSync = Callable[[KnobVector], KnobVector]


@dataclass(frozen=True)
class BatchKnobs:
    local_batch_size: int
    accumulation_steps: int = 1

    def __post_init__(self) -> None:
        if self.local_batch_size < 1 or self.accumulation_steps < 1:
            raise ValueError(f"knobs must be >= 1, got {self}")

    def global_batch(self, world_size: int) -> int:
        return self.local_batch_size * self.accumulation_steps * world_size

    def as_training(self) -> dict[str, int]:
        """As a plan and ``TrainingApplied.training`` name them."""
        return {
            "local_batch_size": self.local_batch_size,
            "accumulation_steps": self.accumulation_steps,
        }


@dataclass(frozen=True)
class Resolved:
    """Knobs to train with, and the global batch they aim at."""

    knobs: BatchKnobs
    target_global_batch: int
    world_size: int

    @property
    def global_batch(self) -> int:
        return self.knobs.global_batch(self.world_size)

    @property
    def exact(self) -> bool:
        """False when the target did not divide evenly and the nearest was taken."""
        return self.global_batch == self.target_global_batch


def accumulation_for(target_global_batch: int, local_batch_size: int, world_size: int) -> int:
    """The accumulation whose global batch is nearest the target (the larger on a tie)."""
    per_step = local_batch_size * world_size
    low, rest = divmod(target_global_batch, per_step)
    if rest * 2 >= per_step:
        low += 1
    return max(low, 1)


def resolve_knobs(
    current: BatchKnobs,
    wanted: Mapping[str, int],
    world_size: int,
    target_global_batch: int | None = None,
) -> Resolved:
    """The knobs a plan's ``wanted`` knobs come to here (see the module's rules).

    ``target_global_batch`` is the global batch the job keeps (default: the current one).
    Raises ValueError for a knob below 1: a plan that says so is not applied at all.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    target = target_global_batch or current.global_batch(world_size)
    local = wanted.get("local_batch_size")
    accumulation = wanted.get("accumulation_steps")
    for name, value in (("local_batch_size", local), ("accumulation_steps", accumulation)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if accumulation is not None:
        knobs = BatchKnobs(local or current.local_batch_size, accumulation)
        return Resolved(knobs, knobs.global_batch(world_size), world_size)
    if local is not None:
        knobs = BatchKnobs(local, accumulation_for(target, local, world_size))
        return Resolved(knobs, target, world_size)
    return Resolved(current, target, world_size)


def for_world(current: BatchKnobs, target_global_batch: int, world_size: int) -> Resolved:
    """The knobs that keep the target global batch in a world of ``world_size``."""
    return resolve_knobs(
        current, {"local_batch_size": current.local_batch_size}, world_size, target_global_batch
    )


@dataclass(frozen=True)
class Switch:
    """A change of knobs, as the training loop is told of it at a step boundary."""

    before: BatchKnobs
    after: BatchKnobs
    #: the steps done before it: the first step trained with ``after`` is ``step + 1``.
    step: int
    world_size: int
    target_global_batch: int
    #: the plan it came from; None for a new world size (a re-rendezvous).
    plan_id: str | None = None

    @property
    def global_batch(self) -> int:
        return self.after.global_batch(self.world_size)

    def describe(self) -> str:
        why = f"plan {self.plan_id}" if self.plan_id else f"world size {self.world_size}"
        kept = (
            ""
            if self.global_batch == self.target_global_batch
            else f" (nearest to the target {self.target_global_batch})"
        )
        return (
            f"knobs at step {self.step} ({why}): local_batch_size "
            f"{self.before.local_batch_size} -> {self.after.local_batch_size}, "
            f"accumulation_steps {self.before.accumulation_steps} -> "
            f"{self.after.accumulation_steps}, global batch {self.global_batch}{kept}"
        )


class StepKnobs:
    """The knobs a training loop trains with, switched only at step boundaries.

    ``offer`` may be called from any thread (the plan follower's); everything else from
    the training loop. ``rank`` is the process's rank in the torch world: rank 0 decides
    and confirms. With ``world_size > 1``, give ``sync`` (``dlrover_events.sdk.torch.
    knob_sync``), and call ``at_step_boundary`` with the same steps on every rank.
    """

    def __init__(
        self,
        local_batch_size: int,
        accumulation_steps: int = 1,
        *,
        world_size: int = 1,
        rank: int = 0,
        reporter: Reporter | None = None,
        sync: KnobSync | None = None,
        sync_every: int = 10,
        target_global_batch: int | None = None,
        keep_global_batch: bool = True,
    ) -> None:
        if world_size < 1 or sync_every < 1:
            raise ValueError("world_size and sync_every must be >= 1")
        if world_size > 1 and sync is None:
            raise ValueError("a world of more than one process needs sync: knob_sync()")
        self._knobs = BatchKnobs(local_batch_size, accumulation_steps)
        self.world_size = world_size
        self.rank = rank
        self.reporter = reporter
        self._sync = sync if world_size > 1 else None
        self.sync_every = sync_every
        self.keep_global_batch = keep_global_batch
        self.target_global_batch = target_global_batch or self._knobs.global_batch(world_size)
        #: the last plan whose knobs this job applied (from the checkpoint across restarts).
        self.applied_plan_id: str | None = None
        #: (plan_id, knobs) the follower handed over, not applied yet; set by another thread.
        self._pending: tuple[str, dict[str, int]] | None = None
        self._lock = threading.Lock()
        self.switches = 0
        if keep_global_batch and target_global_batch is not None:
            self._knobs = for_world(self._knobs, self.target_global_batch, world_size).knobs
        self._tell_reporter()

    @property
    def knobs(self) -> BatchKnobs:
        return self._knobs

    @property
    def local_batch_size(self) -> int:
        return self._knobs.local_batch_size

    @property
    def accumulation_steps(self) -> int:
        return self._knobs.accumulation_steps

    @property
    def global_batch(self) -> int:
        return self._knobs.global_batch(self.world_size)

    # -- the follower's side -------------------------------------------------------------

    def offer(self, plan: JobPlan) -> bool:
        """Take a plan's knobs for the next boundary; True if there is something to switch.

        Quick and non-blocking (it runs on the follower's thread): it only stores them.
        """
        todo = plan.knobs_to_apply()
        if todo is None:
            return False
        plan_id, wanted = todo
        if plan_id == self.applied_plan_id:
            return False
        if any(v < 1 for v in wanted.values()):
            log.warning("plan %s asks for knobs below 1 (%s): not applied", plan_id, wanted)
            return False
        with self._lock:
            self._pending = (plan_id, dict(wanted))
        return True

    def follow(self, follower: PlanFollower) -> Self:
        """Take the knobs of every plan ``follower`` hears of (rank 0 is enough)."""
        follower.on_plan(self.offer)
        return self

    # -- the training loop's side --------------------------------------------------------

    def at_step_boundary(self, step: int, *, now: bool = False) -> Switch | None:
        """Switch now if a plan says so; ``step`` is the number of steps done so far.

        Returns the switch (the caller rebuilds its data loader for a new local batch
        size), or None: the common case, one attribute read (and, with several ranks,
        one small broadcast every ``sync_every`` steps). ``now``: decide at this step
        whatever ``sync_every`` says (every rank must pass it at the same step: an
        in-place re-form does, so a plan's knobs switch with its new world size).
        """
        if self._sync is None:
            if self._pending is None:
                return None
            return self._decide_alone(step)
        if step % self.sync_every and not now:
            return None
        return self._decide_together(step)

    def resize(
        self, world_size: int, rank: int, sync: KnobSync | None, step: int = 0
    ) -> Switch | None:
        """The process is now ``rank`` of a world of ``world_size`` (an in-place re-form):
        the accumulation that keeps the target global batch there (returned as a switch,
        and logged, when it changes), and ``sync`` for the new group."""
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if world_size > 1 and sync is None:
            raise ValueError("a world of more than one process needs sync: knob_sync()")
        before = self._knobs
        self.world_size, self.rank = world_size, rank
        self._sync = sync if world_size > 1 else None
        if self.keep_global_batch:
            self._knobs = for_world(before, self.target_global_batch, world_size).knobs
        self._tell_reporter()
        if self._knobs == before:
            return None
        self.switches += 1
        switch = Switch(before, self._knobs, step, world_size, self.target_global_batch)
        log.info("%s", switch.describe())
        return switch

    def _take(self) -> tuple[str, dict[str, int]] | None:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None and pending[0] == self.applied_plan_id:
            return None
        return pending

    def _resolve(self, pending: tuple[str, dict[str, int]]) -> Resolved | None:
        try:
            return resolve_knobs(
                self._knobs,
                {k: v for k, v in pending[1].items() if k in TRAINING_KNOBS},
                self.world_size,
                self.target_global_batch,
            )
        except ValueError as err:
            log.warning("plan %s's knobs not applied: %s", pending[0], err)
            return None

    def _decide_alone(self, step: int) -> Switch | None:
        pending = self._take()
        resolved = self._resolve(pending) if pending is not None else None
        if pending is None or resolved is None:
            return None
        return self._switch(step, resolved, pending[0])

    def _decide_together(self, step: int) -> Switch | None:
        assert self._sync is not None
        pending: tuple[str, dict[str, int]] | None = None
        proposal: KnobVector = [0, 0, 0, 0]
        if self.rank == 0 and self._pending is not None:
            pending = self._take()
            resolved = self._resolve(pending) if pending is not None else None
            if resolved is not None:
                k = resolved.knobs
                proposal = [
                    1,
                    k.local_batch_size,
                    k.accumulation_steps,
                    resolved.target_global_batch,
                ]
        agreed = self._sync(proposal)
        if not agreed[0]:
            return None
        knobs = BatchKnobs(agreed[1], agreed[2])
        plan_id = pending[0] if pending is not None else None
        return self._switch(step, Resolved(knobs, agreed[3], self.world_size), plan_id)

    def _switch(self, step: int, resolved: Resolved, plan_id: str | None) -> Switch:
        before = self._knobs
        self._knobs = resolved.knobs
        self.target_global_batch = resolved.target_global_batch
        self.applied_plan_id = plan_id or self.applied_plan_id
        self.switches += 1
        self._tell_reporter()
        switch = Switch(
            before, resolved.knobs, step, self.world_size, resolved.target_global_batch, plan_id
        )
        log.info("%s", switch.describe())
        if self.rank == 0 and plan_id is not None:
            self._confirm(plan_id, step)
        return switch

    def _confirm(self, plan_id: str, step: int) -> None:
        reporter = self.reporter
        if reporter is None:
            return
        ident = reporter.identity
        try:
            reporter.publish(
                TrainingApplied(
                    env=ident.env,
                    job=ident.job,
                    source=ident.source,
                    plan_id=plan_id,
                    node=ident.node,
                    training=self._knobs.as_training(),
                    global_step=step + 1,
                )
            )
        except Exception:  # the switch is made; a confirmation must not fail the step
            log.exception("could not confirm plan %s's knobs", plan_id)

    def _tell_reporter(self) -> None:
        if self.reporter is not None:
            self.reporter.set_training(self._knobs.local_batch_size, self._knobs.accumulation_steps)

    # -- checkpoints ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "local_batch_size": self._knobs.local_batch_size,
            "accumulation_steps": self._knobs.accumulation_steps,
            "target_global_batch": self.target_global_batch,
            "world_size": self.world_size,
            "applied_plan_id": self.applied_plan_id,
        }

    def load_state_dict(self, state: Mapping[str, Any], step: int = 0) -> Switch | None:
        """Go on with the knobs a checkpoint saved; in a world of another size, with the
        accumulation that keeps its global batch (returned as a switch, and logged)."""
        saved = BatchKnobs(int(state["local_batch_size"]), int(state["accumulation_steps"]))
        target = int(state.get("target_global_batch") or saved.global_batch(self.world_size))
        self.applied_plan_id = state.get("applied_plan_id") or self.applied_plan_id
        self._knobs, self.target_global_batch = saved, target
        if self.keep_global_batch:
            self._knobs = for_world(saved, target, self.world_size).knobs
        self._tell_reporter()
        if self._knobs == saved:
            return None
        switch = Switch(saved, self._knobs, step, self.world_size, target)
        log.info("%s", switch.describe())
        return switch


__all__ = [
    "BatchKnobs",
    "KnobSync",
    "Resolved",
    "StepKnobs",
    "Switch",
    "accumulation_for",
    "for_world",
    "resolve_knobs",
]
