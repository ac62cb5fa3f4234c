"""Jobs that rescale in place in the simulated cluster: a new allocation that keeps one of
a job's pods where it was costs the in-place figure, anything else (a start, a move to
other nodes, a resume) the checkpoint-restart; the cost table keeps both figures with
their sources, and the goodput-cluster scheduler's penalty reads them."""

from __future__ import annotations

import pytest

from dlrover_events.errors import UserError
from handlers.operator.virtual.settings import virtual_settings
from handlers.simulator.cluster import Cluster
from handlers.simulator.fleet import VirtualCluster
from handlers.simulator.job import DEFAULT_RESTART_DELAY, JobPhase
from schemas.plans import RescaleMode
from schemas.rescale_cost import RESCALE_COSTS, rescale_cost_s
from streams.brain.core.schedulers.goodput_cluster import GoodputClusterParams
from tests.unit.simulator.test_simulator_scheduler_plans import job_of, plan, submitted


def running_at(in_place_delay: float | None, second: dict[str, int]) -> JobPhase:
    """The job's phase 5 s after a plan moved it from node-0 (4 GPUs) to ``second``."""
    fleet = VirtualCluster(
        Cluster(4, 4), sample_interval=60.0, admission="brain", in_place_delay=in_place_delay
    )
    fleet.submit(submitted("a"))
    fleet.apply(plan("a", "a1", 4, {"node-0": 4}))
    fleet.advance_to(DEFAULT_RESTART_DELAY - 5)
    assert job_of(fleet, "a").state is JobPhase.RESTARTING  # a start is a restart
    fleet.advance_to(600.0)
    assert job_of(fleet, "a").state is JobPhase.RUNNING
    fleet.apply(plan("a", "a2", sum(second.values()), second))
    fleet.advance_to(605.0)
    # the snapshot keeps the mode: a restored fleet prices the next change the same
    assert VirtualCluster.restore(fleet.snapshot()).in_place_delay == in_place_delay
    return job_of(fleet, "a").state


def test_a_resize_that_keeps_pods_costs_the_in_place_figure() -> None:
    grow = {"node-0": 4, "node-1": 4}
    assert running_at(0.5, grow) is JobPhase.RUNNING
    assert running_at(None, grow) is JobPhase.RESTARTING  # the restart mode: 30 s
    shrink = {"node-0": 2}
    assert running_at(0.5, shrink) is JobPhase.RUNNING


def test_a_move_to_other_nodes_restarts_even_in_place() -> None:
    assert running_at(0.5, {"node-2": 4}) is JobPhase.RESTARTING  # nobody to send the state


def test_the_cost_table_and_who_reads_it() -> None:
    assert rescale_cost_s("restart") == DEFAULT_RESTART_DELAY == 30.0
    assert rescale_cost_s(RescaleMode.IN_PLACE) < 1.0
    assert all(cost.source for cost in RESCALE_COSTS.values())
    assert GoodputClusterParams().rescale_cost_s == 30.0
    in_place = GoodputClusterParams(rescale_mode=RescaleMode.IN_PLACE)
    assert in_place.rescale_cost_s == rescale_cost_s("in_place")
    assert GoodputClusterParams(rescale_mode="in_place", restart_cost_s=5).rescale_cost_s == 5
    assert virtual_settings({}).in_place_seconds is None
    assert virtual_settings({"rescale_mode": "in_place"}).in_place_seconds == rescale_cost_s(
        "in_place"
    )
    given = {"rescale_mode": "in_place", "in_place_delay": 2.0}
    assert virtual_settings(given).in_place_seconds == 2.0


def test_a_bad_rescale_mode_is_the_users_to_fix() -> None:
    with pytest.raises(UserError, match="rescale_mode"):
        virtual_settings({"rescale_mode": "sideways"})
