"""Lockstep between a virtual env's simulated cluster and its brain, on the topics alone.

Without it the simulated clock and the brain meet only through wall time: a plan lands at
whatever simulated second the clock had reached when it arrived, so two A/B arms fed the
same input drift apart by a few seconds per job. In lockstep the virtual operator moves
its clock one tick at a time and, after the tick's events, publishes a `Barrier` to every
partition of each topic the brain reads. The brain decides a tick only once it holds the
barrier on all of them (merging the partitions in one order that does not depend on
arrival), publishes the plans, then a `BarrierAck` to every partition of
`<env>.scale.plans`. The operator applies the tick's plans once it has read the ack on all
of those partitions, in an order of its own. Nothing in between depends on wall time.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import AwareDatetime, Field

from schemas.envelope import Event


class Barrier(Event):
    """End of a simulated tick: every event of the tick was published before it, on this
    partition. Published with no key, to each partition explicitly."""

    #: published to job.events, job.metrics and scale.results; this is the home topic
    topic: ClassVar[str] = "job.events"
    type: Literal["sim.barrier"] = "sim.barrier"
    tick: int = Field(ge=1, description="increases by one per tick of the simulated clock")
    sim_at: AwareDatetime = Field(description="the simulated time the tick ends at")


class BarrierAck(Event):
    """The brain has decided every event before barrier `tick` and the broker holds the
    plans it made: published after them to each partition of scale.plans."""

    topic: ClassVar[str] = "scale.plans"
    type: Literal["brain.barrier_ack"] = "brain.barrier_ack"
    tick: int = Field(ge=1)
    sim_at: AwareDatetime


__all__ = ["Barrier", "BarrierAck"]
