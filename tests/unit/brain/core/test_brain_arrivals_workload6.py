"""Fidelity check 7b of the cluster-scheduler issue: the A/B test publishes all 160
submissions of workload-6 before the first tick; at that tick the brain's free GPUs must
be the cluster's 64 less the demand of the jobs that have arrived on the simulated clock,
not of all 160 (which left it 0 free GPUs until t = 66,900 s)."""

from __future__ import annotations

import math
from datetime import timedelta

from handlers.simulator.workload import parse_workload, workload_path
from schemas import encode
from schemas.env_settings import BrainSettings
from schemas.lockstep import Barrier
from streams.brain.core.policy import Policy
from streams.brain.core.processor import BrainProcessor
from tests.unit.brain.builders import ENV, T0, Rec

EVENTS = f"{ENV}.job.events"


def test_free_gpus_at_the_first_tick_are_64_less_the_arrived_demand() -> None:
    submissions = parse_workload(workload_path("workload-6").read_text(), env=ENV, origin=T0)
    assert len(submissions) == 160
    tick_s = 30.0
    # the operator's first tick ends on the grid point at or after the first arrival
    first = math.ceil(min(s.time for s in submissions) / tick_s + 1e-9) * tick_s
    p = BrainProcessor(ENV, f"{ENV}.brain", Policy(BrainSettings(lockstep=True, cluster_gpus=64)))
    p.inputs = {(EVENTS, 0)}
    records = [Rec(EVENTS, 0, i, None, encode(s.event)) for i, s in enumerate(submissions)]
    barrier = Barrier(env=ENV, tick=1, sim_at=T0 + timedelta(seconds=first))
    records.append(Rec(EVENTS, 0, len(records), None, encode(barrier)))
    out = p.process(records)
    assert [a.tick for a in out.acks] == [1]
    arrived = [s for s in submissions if s.time <= first]
    demand = sum(role.replicas * role.gpu_num for s in arrived for role in s.event.roles.values())
    assert 0 < demand < 64 and len(arrived) < 160
    assert p.free_gpus() == 64 - demand
    assert sum(1 for s in p.states.values() if s.awaiting_arrival) == 160 - len(arrived)
    # and at the first tick past the last arrival, every job has arrived
    last = max(s.time for s in submissions)
    end = Barrier(env=ENV, tick=2, sim_at=T0 + timedelta(seconds=last + tick_s))
    p.process([Rec(EVENTS, 0, len(records), None, encode(end))])
    assert not any(s.awaiting_arrival for s in p.states.values())
