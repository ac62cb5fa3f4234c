"""Who trains in the next generation of an in-place elastic job, decided (pure).

An in-place job (``dlrover_events.sdk.torch.inplace``) keeps its training processes across a
resize: its members re-form their process group at a step boundary instead of being
restarted. Every membership is a *generation* of the job's store; this module holds the
decisions about them, free of torch and of I/O, so they are tested as plain functions:

- At a step boundary the members exchange one small vector (``check_vector`` /
  ``read_check``): who wants to leave (a removed pod's SIGTERM), the newest newcomer the
  store holds (rank 0 reads it), and the time of the first sign of either. Every member
  gets the same sum, so every member sees the same change at the same step.
- ``planned`` turns that into the next generation: the members that stay keep their order
  (rank 0 stays rank 0 unless it leaves), newcomers follow in the order they registered.
- ``recovered`` is the next generation after a peer was lost mid-step: the members that
  registered as survivors, the state taken from the one that completed the most steps.
- ``Rescale`` is what one re-form measured; ``phases`` names its seconds as the
  ``training.rescaled`` event reports them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from schemas.plans import RescaleMode, RescalePhases, ScalePlan

#: The sign-time slot of a check vector when a member has nothing to say: the vector is
#: combined with MAX, and a time is sent negated (the earliest sign wins).
NO_SIGN = -(2**62)
#: A generation's state comes from no member: a fresh formation loads the checkpoint.
FROM_CHECKPOINT = -1


class MembershipError(ValueError):
    """A record in the job's store is not what this version writes."""


@dataclass(frozen=True)
class Joiner:
    """A process waiting to be admitted (a newcomer, a warm spare just admitted, a
    member restarted by its agent or left out of a recovery)."""

    ticket: int
    member: str
    registered_at: float
    pid: int = 0
    #: times its agent restarted it (torchrun's TORCHELASTIC_RESTART_COUNT)
    restarts: int = 0

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes | str) -> Joiner:
        return cls(**_object(raw, "joiner", {"ticket", "member", "registered_at"}))


@dataclass(frozen=True)
class Survivor:
    """A member that lost a peer mid-step and says it is still here."""

    member: str
    old_rank: int
    step: int

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes | str) -> Survivor:
        return cls(**_object(raw, "survivor", {"member", "old_rank", "step"}))


@dataclass(frozen=True)
class Decision:
    """The membership of one generation, as its deciding member wrote it in the store."""

    generation: int
    #: member ids in rank order
    members: tuple[str, ...]
    #: the step every member trains from
    step: int
    #: rank (in this generation) whose state every member receives; FROM_CHECKPOINT: none
    source: int
    #: the highest joiner ticket this generation has dealt with (admitted or dropped)
    admitted: int
    #: why it was formed: "formed", "plan", "peer lost"
    reason: str = "plan"
    #: wall-clock time of the first sign of the change (a SIGTERM, a registration, a failure)
    sign_at: float | None = None
    #: members of the generation before (None: a fresh formation)
    world_before: int | None = None
    #: steps trained before and done again now (a peer lost mid-step)
    steps_lost: int = 0
    #: members that came in with this generation (they receive the state)
    joined: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        return len(self.members)

    def rank_of(self, member: str) -> int | None:
        try:
            return self.members.index(member)
        except ValueError:
            return None

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes | str) -> Decision:
        obj = _object(raw, "decision", {"generation", "members", "step", "source", "admitted"})
        obj["members"] = tuple(obj["members"])
        obj["joined"] = tuple(obj.get("joined") or ())
        return cls(**obj)


def _object(raw: bytes | str, what: str, required: set[str]) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except ValueError as err:
        raise MembershipError(f"a {what} record that is not JSON: {err}") from None
    if not isinstance(obj, dict) or not required <= set(obj):
        raise MembershipError(f"a {what} record without {sorted(required)}: {obj!r}")
    return obj


# -- the check at a step boundary -------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """What every member learned from one boundary's exchange."""

    leaving: frozenset[int]
    #: the newest joiner ticket rank 0 saw in the store
    newest_ticket: int
    #: the earliest sign of the change (wall clock), None when there is none
    sign_at: float | None

    def changes(self, admitted: int) -> bool:
        return bool(self.leaving) or self.newest_ticket > admitted


def check_vector(
    world_size: int, rank: int, *, leaving: bool, newest_ticket: int, sign_at: float | None
) -> list[int]:
    """This member's part of the boundary exchange, combined over the group with MAX:
    one slot per rank (1: leaving), the newest joiner ticket (rank 0 reads the store, the
    others send 0), and the earliest sign in milliseconds, negated."""
    vector = [0] * (world_size + 2)
    vector[rank] = 1 if leaving else 0
    vector[world_size] = newest_ticket
    vector[world_size + 1] = NO_SIGN if sign_at is None else -round(sign_at * 1000)
    return vector


def read_check(vector: Sequence[int], world_size: int) -> Check:
    if len(vector) != world_size + 2:
        raise ValueError(f"a check of {len(vector)} slots for a world of {world_size}")
    sign = vector[world_size + 1]
    return Check(
        leaving=frozenset(r for r in range(world_size) if vector[r]),
        newest_ticket=int(vector[world_size]),
        sign_at=None if sign == NO_SIGN else -sign / 1000,
    )


def gather_wait(
    check: Check,
    now: float,
    gather_s: float,
    *,
    world_size: int = 0,
    expected: int | None = None,
) -> float:
    """Seconds to wait before a check that saw members leave is taken again: until
    ``gather_s`` after its first sign, never more than ``gather_s`` (another host's clock
    may be off). One plan's removed pods get their SIGTERMs tens of milliseconds apart
    (the operator, each pod's shim and agent pass it on), so a step boundary can fall
    between them: without the wait, 3 -> 1 re-forms twice (3 -> 2 -> 1).

    ``expected``: the role's replicas in the plan behind this change, when the member
    knows it; no wait once the members staying are no more than that (every removal of
    the plan is in). Only the wait depends on it: every member takes the check again."""
    if not check.leaving or check.sign_at is None or gather_s <= 0:
        return 0.0
    if expected is not None and world_size - len(check.leaving) <= expected:
        return 0.0
    return max(0.0, min(gather_s, check.sign_at + gather_s - now))


# -- deciding the next generation ----------------------------------------------------------


def first_generation(joiners: Iterable[Joiner], *, checkpoint_step: int = 0) -> Decision:
    """A fresh store's first generation: every joiner registered so far, in ticket order;
    the state comes from the checkpoint (or the initial model). Formed by processes their
    agent restarted, it is the restart path's generation (reason ``restart``)."""
    ordered = sorted(joiners, key=lambda j: j.ticket)
    if not ordered:
        raise ValueError("a generation of nobody")
    return Decision(
        generation=1,
        members=tuple(j.member for j in ordered),
        step=checkpoint_step,
        source=FROM_CHECKPOINT,
        admitted=ordered[-1].ticket,
        # members their agent started again: the in-place group before failed
        reason="restart" if any(j.restarts for j in ordered) else "formed",
        sign_at=min(j.registered_at for j in ordered),
        joined=tuple(j.member for j in ordered),
    )


def planned(
    current: Decision, check: Check, joiners: Iterable[Joiner], *, step: int, max_world: int = 0
) -> Decision | None:
    """The generation after ``current`` once ``check`` is agreed; None when nobody stays
    (every member leaves: the job is being scaled to nothing).

    ``joiners`` are the records of the tickets after ``current.admitted`` up to the
    check's newest that are still there (withdrawn ones left out by the caller); with
    ``max_world`` > 0 no more join than fit (the rest wait for a later boundary).
    """
    staying = [m for r, m in enumerate(current.members) if r not in check.leaving]
    if not staying:
        return None
    room = max_world - len(staying) if max_world > 0 else None
    newcomers = sorted(
        (j for j in joiners if current.admitted < j.ticket <= check.newest_ticket),
        key=lambda j: j.ticket,
    )
    admitted = check.newest_ticket
    if room is not None and len(newcomers) > room:
        newcomers = newcomers[: max(room, 0)]
        admitted = newcomers[-1].ticket if newcomers else current.admitted
    members = staying + [j.member for j in newcomers if j.member not in staying]
    return Decision(
        generation=current.generation + 1,
        members=tuple(members),
        step=step,
        source=0,
        admitted=max(admitted, current.admitted),
        reason="plan",
        sign_at=check.sign_at,
        world_before=current.world_size,
        joined=tuple(j.member for j in newcomers if j.member not in staying),
    )


def recovered(current: Decision, survivors: Iterable[Survivor]) -> Decision:
    """The generation after a peer was lost in ``current``: the survivors in their old
    order, everyone receiving the state of the survivor that completed the most steps (a
    gradient all-reduce may have completed on some ranks only, so their steps differ by
    at most one), the lowest old rank on a tie."""
    known = {m: r for r, m in enumerate(current.members)}
    alive: dict[str, Survivor] = {}
    for s in survivors:
        if s.member in known:
            alive.setdefault(s.member, s)
    if not alive:
        raise ValueError("a recovery with no survivor")
    ordered = sorted(alive.values(), key=lambda s: known[s.member])
    best = max(ordered, key=lambda s: (s.step, -known[s.member]))
    return Decision(
        generation=current.generation + 1,
        members=tuple(s.member for s in ordered),
        step=best.step,
        source=ordered.index(best),
        admitted=current.admitted,
        reason="peer lost",
        world_before=current.world_size,
        steps_lost=0,
    )


# -- what one re-form measured ------------------------------------------------------------


@dataclass
class Rescale:
    """One re-form as a member lived it: wall-clock times of its phases (``time.time()``),
    filled in as it goes, and what changed."""

    mode: RescaleMode
    generation: int
    world_before: int | None
    world_size: int
    rank: int
    step: int
    reason: str
    joined: int = 0
    left: int = 0
    #: None: not known (a restart from a checkpoint)
    steps_lost: int | None = 0
    #: the first sign of the change: a SIGTERM, a newcomer's registration, a failure
    sign_at: float | None = None
    #: the member saw the change at a step boundary (or a step failed)
    boundary_at: float | None = None
    #: the next generation was agreed (read from the store)
    agreed_at: float | None = None
    #: the new process group exists
    group_at: float | None = None
    #: the state reached every member
    state_at: float | None = None
    #: DDP rebuilt: training may go on
    ready_at: float | None = None
    #: the first step at the new size ended
    first_step_at: float | None = None
    #: the plan that asked for it, and when it was published, when known
    plan_id: str | None = None
    published_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def phases(self) -> RescalePhases:
        """The seconds of each phase that was measured (see RescalePhases)."""

        def span(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else max(b - a, 0.0)

        reform = span(self.agreed_at, self.group_at)
        after_state = span(self.state_at, self.ready_at)
        if reform is not None and after_state is not None:
            reform += after_state
        start = self.published_at if self.published_at is not None else self.sign_at
        return RescalePhases(
            plan_delivery_s=span(self.published_at, self.sign_at),
            agreement_s=span(self.sign_at, self.agreed_at),
            reform_s=reform,
            state_transfer_s=span(self.group_at, self.state_at),
            first_step_s=span(self.ready_at, self.first_step_at),
            total_s=span(start, self.first_step_at),
        )

    def as_line(self) -> dict[str, Any]:
        """For a log line: what changed, its phases, and the raw times."""
        return {
            "mode": self.mode.value,
            "generation": self.generation,
            "world_size_before": self.world_before,
            "world_size": self.world_size,
            "rank": self.rank,
            "step": self.step,
            "reason": self.reason,
            "joined": self.joined,
            "left": self.left,
            "steps_lost": self.steps_lost,
            "plan_id": self.plan_id,
            **{k: round(v, 4) for k, v in self.phases().model_dump().items() if v is not None},
            "at": {
                k: round(v, 4)
                for k, v in (
                    ("sign", self.sign_at),
                    ("boundary", self.boundary_at),
                    ("agreed", self.agreed_at),
                    ("group", self.group_at),
                    ("state", self.state_at),
                    ("ready", self.ready_at),
                    ("first_step", self.first_step_at),
                )
                if v is not None
            },
        }


def plan_for(plan: ScalePlan | None, role: str, world_size: int) -> tuple[str, float] | None:
    """(plan_id, publication time) of the ScalePlan when it asked the role for
    ``world_size`` replicas (the one that caused this rescale); None when it did not."""
    if plan is None:
        return None
    group = plan.node_group_resources.get(role)
    if group is None or group.count != world_size:
        return None
    return plan.plan_id, plan.occurred_at.timestamp()


__all__ = [
    "FROM_CHECKPOINT",
    "NO_SIGN",
    "Check",
    "Decision",
    "Joiner",
    "MembershipError",
    "Rescale",
    "Survivor",
    "check_vector",
    "first_generation",
    "gather_wait",
    "plan_for",
    "planned",
    "read_check",
    "recovered",
]
