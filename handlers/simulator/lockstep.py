"""Lockstep between a simulated cluster and its brain: the clock moves one tick at a time
and a tick's plans are applied at its end, whatever the wall clock did meanwhile.

Two runs fed the same input then give the same events: the ticks end at the same
simulated seconds (a grid from the clock's origin), the brain sees the same events before
each barrier, and the plans it answers with are applied at the same simulated second and
in the same order, however the partitions they came on interleaved. The operator that
publishes barriers and reads acknowledgements is a thin adapter around this module.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from handlers.simulator.fleet import VirtualCluster
from schemas.codec import decode, encode
from schemas.jobs import JobEvent
from schemas.plans import ScalePlan

#: Float error in a grid point read back from the clock (k * tick_s / tick_s != k).
_GRID_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Tick:
    """A tick the fleet has run: what it said, and where the tick ended."""

    number: int
    end_s: float  # simulated seconds since the clock's origin
    at: datetime  # the same instant as events carry it
    events: list[JobEvent]


@dataclass
class TickClock:
    """The grid the ticks end on: multiples of ``tick_s`` from the clock's origin.

    A grid, not "the clock plus tick_s", so that the ticks end at the same seconds however
    they were reached. A stretch in which nothing would happen is crossed in one tick: the
    brain decides only on events, so a tick without any would cost a round trip for nothing.
    """

    tick_s: float
    number: int = 0  # ticks run so far
    grid: int = 0  # the last tick ended at grid * tick_s

    def __post_init__(self) -> None:
        if not self.tick_s > 0:
            raise ValueError("a tick must last a positive number of simulated seconds")

    def snapshot(self) -> dict[str, Any]:
        return {"tick_s": self.tick_s, "number": self.number, "grid": self.grid}

    @classmethod
    def restore(cls, state: Mapping[str, Any]) -> TickClock:
        return cls(state["tick_s"], state["number"], state["grid"])

    def next_end(self, upcoming: float | None, *, carrying: bool) -> int | None:
        """The grid point the next tick ends at; None when there is nothing to simulate
        and nothing to say (the clock idles until an input arrives).

        ``upcoming``: when the fleet's next event is due; ``carrying``: something waits
        for the next barrier (results of plans, or plans waiting for a tick's end).
        """
        if upcoming is None and not carrying:
            return None
        end = self.grid + 1
        if not carrying and upcoming is not None:
            end = max(end, math.ceil(upcoming / self.tick_s - _GRID_EPS))
        return end

    def run(self, fleet: VirtualCluster, *, carrying: bool) -> Tick | None:
        """Advance the fleet by one tick; None when it idles."""
        end = self.next_end(fleet.next_event_at(), carrying=carrying)
        if end is None:
            return None
        end_s = end * self.tick_s
        events = fleet.advance_to(end_s)
        self.grid = end
        self.number += 1
        return Tick(self.number, end_s, fleet.at(end_s), events)


def apply_order(plan: ScalePlan) -> tuple[datetime, str, str, str]:
    """The order a tick's plans are applied in: by what they say, not by how the
    partitions they were read from interleaved."""
    return (plan.occurred_at, plan.job.uuid, plan.plan_id, str(plan.event_id))


@dataclass
class TickGate:
    """Which tick each plan belongs to, and when a tick's plans may be applied.

    A plan read on a partition before that partition's acknowledgement of the open tick
    belongs to the open tick; after it, to the next one. The open tick's plans are due once
    its barrier is out and every partition of the plans topic has acknowledged it.
    """

    partitions: frozenset[int]
    open_tick: int = 1
    barrier_out: bool = False
    _acked: set[int] = field(default_factory=set)
    _plans: dict[int, list[ScalePlan]] = field(default_factory=dict)

    @classmethod
    def over(cls, partitions: Iterable[int]) -> TickGate:
        parts = frozenset(partitions)
        if not parts:
            raise ValueError("lockstep needs the partitions of the plans topic")
        return cls(parts)

    def snapshot(self) -> dict[str, Any]:
        """Which tick is open, who acknowledged it and the plans held for it, JSON-able:
        a restarted operator resumes the tick where it was (the plans it had read are
        no longer on the consumer's uncommitted part of the topic)."""
        return {
            "partitions": sorted(self.partitions),
            "open_tick": self.open_tick,
            "barrier_out": self.barrier_out,
            "acked": sorted(self._acked),
            "plans": [
                [tick, [encode(p).decode() for p in plans]] for tick, plans in self._plans.items()
            ],
        }

    @classmethod
    def restore(cls, state: Mapping[str, Any]) -> TickGate:
        plans: dict[int, list[ScalePlan]] = {}
        for tick, texts in state["plans"]:
            for text in texts:
                plan = decode(text.encode())
                if not isinstance(plan, ScalePlan):
                    raise ValueError(f"a held plan of the snapshot is a {plan.type}")
                plans.setdefault(tick, []).append(plan)
        return cls(
            frozenset(state["partitions"]),
            state["open_tick"],
            state["barrier_out"],
            set(state["acked"]),
            plans,
        )

    def barrier(self, tick: int) -> None:
        """The barrier of the open tick was published: its acknowledgements count now."""
        if tick != self.open_tick:
            raise ValueError(f"barrier {tick} published while tick {self.open_tick} is open")
        self.barrier_out = True

    def plan(self, partition: int, plan: ScalePlan) -> int:
        """Hold a plan for its tick; returns which tick that is."""
        tick = self.open_tick + (1 if partition in self._acked else 0)
        self._plans.setdefault(tick, []).append(plan)
        return tick

    def ack(self, partition: int, tick: int) -> bool:
        """Count an acknowledgement; True when the open tick's plans are due.

        One for an earlier tick (re-delivered after a restart of the brain) changes nothing.
        """
        if tick == self.open_tick:
            self._acked.add(partition)
        return self.due

    @property
    def due(self) -> bool:
        return self.barrier_out and self._acked >= self.partitions

    @property
    def waiting_on(self) -> list[int]:
        """Partitions that have not yet acknowledged the open tick."""
        return sorted(self.partitions - self._acked)

    @property
    def holding(self) -> bool:
        """Plans wait for a tick: a tick must run even if the fleet has nothing to do."""
        return any(self._plans.values())

    def held_ticks(self) -> list[int]:
        return [tick for tick, plans in self._plans.items() if plans]

    def held(self, tick: int) -> list[ScalePlan]:
        """The plans held for a tick, in the order to apply them."""
        return sorted(self._plans.get(tick, []), key=apply_order)

    def take(self) -> Sequence[ScalePlan]:
        """The open tick's plans in the order to apply them; the next tick opens."""
        if not self.due:
            raise ValueError(f"tick {self.open_tick} is not acknowledged on every partition")
        plans = sorted(self._plans.pop(self.open_tick, []), key=apply_order)
        self.open_tick += 1
        self.barrier_out = False
        self._acked = set()
        return plans


__all__ = ["Tick", "TickClock", "TickGate", "apply_order"]
