"""Edge cases of the DLRover-parity optimizers: no samples, zero workers, one node, caps."""

from __future__ import annotations

import math
from datetime import timedelta

import msgspec
import pytest

from schemas.plans import NodeGroupResource, NodeResource
from streams.brain.core.optimizers.dlrover import free_rate, speed_trend
from streams.brain.core.state import PS, WORKER, JobState, NodeStatus, RoleResources, Stage
from tests.unit.brain.builders import (
    T0,
    GiB,
    MiB,
    completed,
    meta,
    node,
    nodes,
    oom,
    run,
    sample,
    samples,
    state,
    use,
)

# -- worker create --------------------------------------------------------------------


def test_worker_create_without_history_proposes_nothing() -> None:
    assert run("worker-create", state()) is None


def test_worker_create_ignores_other_scenarios_and_old_jobs() -> None:
    other = completed("h1", [[use(WORKER, 0, cpu=8, memory=10 * GiB)]], job=meta("h1", "nlp"))
    old = completed("h2", [[use(WORKER, 0, cpu=8, memory=10 * GiB)]])
    old = old.model_copy(update={"completed_at": T0 - timedelta(days=8)})
    assert run("worker-create", state(), history=[other, old]) is None


def test_worker_create_without_scenario_has_no_history() -> None:
    history = [completed("h1", [[use(WORKER, 0, cpu=8, memory=10 * GiB)]], job=meta("h1", ""))]
    assert run("worker-create", state(job=meta("job-1", "")), history=history) is None


def test_worker_create_applies_floors() -> None:
    history = [completed("h1", [[use(WORKER, 0, cpu=8, memory=10 * GiB)]])]
    proposal = run("worker-create", state(), history=history)
    assert proposal is not None
    assert proposal.resource.node_group_resources[WORKER] == NodeGroupResource(
        count=1, node_resource=NodeResource(cpu=12, memory=16 * GiB)
    )


def test_worker_create_uses_peak_with_margin() -> None:
    history = [
        completed("h1", [[use(WORKER, 0, cpu=14.2, memory=20 * GiB)]]),
        completed("h2", [[use(WORKER, 0, cpu=3, memory=2 * GiB)]]),
    ]
    proposal = run("worker-create", state(), history=history)
    assert proposal is not None
    res = proposal.resource.node_group_resources[WORKER].node_resource
    assert (res.cpu, res.memory) == (15, 30 * GiB)


# -- worker create OOM ----------------------------------------------------------------


def test_worker_create_oom_needs_an_open_worker_oom() -> None:
    job = state(samples=samples([[use(WORKER, 0, memory=8 * 10**9)]]))
    assert run("worker-create-oom", job) is None
    handled = oom("o1").model_copy(update={"handled": True})
    assert (
        run("worker-create-oom", job.model_copy(update={"ooms": {"worker-0": [handled]}})) is None
    )


def test_worker_create_oom_adds_min_increase_without_history() -> None:
    job = state(
        samples=samples([[use(WORKER, 0, memory=8 * 10**9)]]),
        ooms={"worker-0": [oom("o1")]},
    )
    proposal = run("worker-create-oom", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources[WORKER] == NodeGroupResource(
        node_resource=NodeResource(memory=12 * 10**9)
    )
    assert proposal.handled_ooms == ("o1",)


def test_worker_create_oom_uses_history_with_oom_factor() -> None:
    hist = completed(
        "h1",
        [[use(WORKER, 0, memory=10 * 10**9), use(WORKER, 1, memory=20 * 10**9)]],
        ooms={"worker-1": [oom("old")]},
    )
    job = state(roles={WORKER: RoleResources(memory=8 * 10**9)}, ooms={"worker-0": [oom("o1")]})
    proposal = run("worker-create-oom", job, history=[hist])
    assert proposal is not None
    res = proposal.resource.node_group_resources[WORKER].node_resource
    assert res.memory == 24 * 10**9
    assert res.cpu == 0


# -- PS create / cold create ----------------------------------------------------------


def test_ps_create_without_ps_history_proposes_nothing() -> None:
    history = [completed("h1", [[use(WORKER, 0, cpu=4)]])]
    assert run("ps-create", state(distribution="ps"), history=history) is None


def test_ps_create_caps_replicas_at_15() -> None:
    row = [use(PS, i, cpu=30, memory=GiB) for i in range(20)]
    proposal = run("ps-create", state(distribution="ps"), history=[completed("h1", [row])])
    assert proposal is not None
    group = proposal.resource.node_group_resources[PS]
    # total = 600 x 1.5 = 900 over 34-core PS -> 27 replicas, capped at 15 x ceil(900/15)
    assert (group.count, group.node_resource.cpu) == (15, 60)


def test_ps_cold_create_is_only_for_ps_jobs() -> None:
    assert run("ps-cold-create", state()) is None


# -- PS OOM ---------------------------------------------------------------------------


def test_ps_oom_at_memory_cap_doubles_count_instead() -> None:
    job = state(
        distribution="ps",
        roles={PS: RoleResources(replicas=3)},
        nodes=nodes(node(PS, 0, memory=64 * GiB), node(PS, 1, memory=64 * GiB)),
        ooms={"ps-0": [oom("o1")]},
    )
    proposal = run("ps-oom", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources[PS] == NodeGroupResource(count=6)


def test_ps_oom_never_twice_for_one_oom() -> None:
    handled = oom("o1").model_copy(update={"handled": True})
    job = state(
        distribution="ps",
        nodes=nodes(node(PS, 0, memory=110)),
        ooms={"ps-0": [handled]},
    )
    assert run("ps-oom", job) is None


def test_ps_oom_without_known_memory_proposes_nothing() -> None:
    assert run("ps-oom", state(distribution="ps", ooms={"ps-0": [oom("o1")]})) is None


# -- PS init adjust -------------------------------------------------------------------


def _ps_init_job(
    total_steps: int,
    recv_ops: int | None,
    speed: float = 4.0,
    ps_cpu: tuple[float, ...] = (6, 10),
) -> JobState:
    rows = [
        [
            *(use(PS, i, cpu=cpu, memory=(10 + 2 * i) * GiB) for i, cpu in enumerate(ps_cpu)),
            *(use(WORKER, i, cpu=2) for i in range(4)),
        ]
    ] * 3
    return state(
        distribution="ps",
        stage=Stage.PS_INITIAL.value,
        total_steps=total_steps,
        recv_op_count=recv_ops,
        samples=samples(rows, speed=speed),
    )


def test_ps_init_adjust_long_job_targets_32_workers() -> None:
    proposal = run("ps-init-adjust", _ps_init_job(10**9, recv_ops=200, ps_cpu=(8, 8)))
    assert proposal is not None
    group = proposal.resource.node_group_resources[PS]
    # ps_cpu = max(ceil(0.08 x 100) + 4, ceil(8) + 4) = 12; balanced PS: free rate
    # 12 / (8 x 2 / 15) = 11.25 caps nothing (45 >= 32); replicas ceil(32/4 x 16/12) = 11
    assert (group.count, group.node_resource.cpu) == (11, 12)
    # 12 GiB x 1.2 = 14.4 GiB, rounded up to a whole memory unit (256 MiB): 14.5 GiB
    assert group.node_resource.memory == 14.5 * GiB
    exact = run("ps-init-adjust", _ps_init_job(10**9, recv_ops=200), memory_unit=1)
    assert exact is not None
    assert exact.resource.node_group_resources[PS].node_resource.memory == math.ceil(12 * GiB * 1.2)
    assert "capped" not in proposal.reason


def test_ps_init_adjust_unbalanced_ps_cap_the_target_by_the_free_rate() -> None:
    proposal = run("ps-init-adjust", _ps_init_job(10**9, recv_ops=200))
    assert proposal is not None
    group = proposal.resource.node_group_resources[PS]
    # ps_cpu = max(ceil(0.08 x 100) + 4, ceil(10) + 4) = 14; free rate 14 / (10 x 2 / 15)
    # = 10.5, but ps-1 is busier than the other by 10 - 6 = 4: at most 14 / 4 = 3.5, so
    # the target is ceil(3.5 x 4) = 14 workers, not 32; replicas ceil(14/4 x 16/14) = 4
    assert (group.count, group.node_resource.cpu) == (4, 14)
    assert "14 workers (capped by free rate 3.5)" in proposal.reason


def test_free_rate_is_computed_from_the_busiest_ps() -> None:
    # one PS: ps_cpu / (max_ps_cpu x 1 / 15), no imbalance term
    assert free_rate(12, [8.0], 15) == pytest.approx(12 / (8 / 15))
    # several, balanced: ps_cpu / (max_ps_cpu x count / 15)
    assert free_rate(12, [8.0, 8.0, 8.0], 15) == pytest.approx(12 / (8 * 3 / 15))
    # max_ps_cpu is the ceiling of the busiest average
    assert free_rate(12, [7.2, 7.2], 15) == pytest.approx(12 / (8 * 2 / 15))
    # unbalanced: at most ps_cpu / (busiest - mean of the others)
    assert free_rate(12, [2.0, 4.0, 12.0], 15) == pytest.approx(12 / 9)
    # idle PS: no cap
    assert free_rate(12, [0.0, 0.0], 15) is None


def test_ps_init_adjust_short_job_is_capped_by_the_free_rate_too() -> None:
    # a short job targets 10 workers; with one PS far busier the free rate caps that
    job = _ps_init_job(1000, recv_ops=None, ps_cpu=(1, 13))
    proposal = run("ps-init-adjust", job)
    assert proposal is not None
    # ps_cpu = ceil(13) + 4 = 17; diff 12: free rate <= 17 / 12, target ceil(1.42 x 4) = 6
    assert "6 workers (capped by free rate" in proposal.reason
    assert proposal.resource.node_group_resources[PS].count == math.ceil(6 / 4 * 14 / 17)


def test_ps_init_adjust_averages_the_last_3_samples() -> None:
    # an early spike of 30 cores is older than the last 3 samples: it does not size the PS
    rows = [[use(PS, 0, cpu=30, memory=GiB), use(WORKER, 0, cpu=1)]] + [
        [use(PS, 0, cpu=6, memory=GiB), use(WORKER, 0, cpu=1)]
    ] * 3
    job = state(distribution="ps", stage=Stage.PS_INITIAL.value, samples=samples(rows))
    proposal = run("ps-init-adjust", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources[PS].node_resource.cpu == 10  # ceil(6) + 4


def test_ps_init_adjust_short_job_targets_10_workers() -> None:
    # 1000 steps at 4 steps/s over 4 workers: 1000 s with one worker's speed <= 1800 s
    proposal = run("ps-init-adjust", _ps_init_job(1000, recv_ops=None))
    assert proposal is not None
    assert proposal.resource.node_group_resources[PS].count == 3


def test_ps_init_adjust_many_recv_ops_uses_16_cores() -> None:
    proposal = run("ps-init-adjust", _ps_init_job(10**9, recv_ops=2000))
    assert proposal is not None
    assert proposal.resource.node_group_resources[PS].node_resource.cpu == 16


def test_ps_init_adjust_without_samples_or_workers() -> None:
    assert run("ps-init-adjust", state(distribution="ps")) is None
    only_ps = state(distribution="ps", samples=samples([[use(PS, 0, cpu=4, memory=GiB)]]))
    assert run("ps-init-adjust", only_ps) is None


# -- hot PS ---------------------------------------------------------------------------


def _hot_job(workers: int, ps_cpu: tuple[float, float], ps_memory: int = GiB) -> JobState:
    row = [
        use(PS, 0, cpu=ps_cpu[0], memory=ps_memory),
        use(PS, 1, cpu=ps_cpu[1], memory=ps_memory),
        *(use(WORKER, i, cpu=1) for i in range(workers)),
    ]
    return state(
        distribution="ps",
        stage=Stage.RUNNING.value,
        nodes=nodes(node(PS, 0, cpu=8, memory=10 * GiB), node(PS, 1, cpu=8, memory=10 * GiB)),
        samples=samples([row] * 3),
    )


def test_hot_ps_raises_every_ps_for_target_workers() -> None:
    proposal = run("hot-ps", _hot_job(8, (7, 2)))
    assert proposal is not None
    # coefficient 32 / 8 = 4: ps-0 7 x 4 = 28 cores; ps-1 2 x 4 = 8, not above its 8
    assert proposal.resource.node_resources == {"ps-0": NodeResource(cpu=28)}


def test_hot_ps_caps_at_32_cores_and_shrinks_coefficient() -> None:
    proposal = run("hot-ps", _hot_job(4, (7, 2)))
    assert proposal is not None
    # coefficient 8 would give 56 cores: shrinks to 32 / 7, so ps-1 gets ceil(2 x 32/7)
    assert proposal.resource.node_resources == {
        "ps-0": NodeResource(cpu=32),
        "ps-1": NodeResource(cpu=10),
    }


def test_hot_ps_with_zero_workers_brings_the_busiest_hot_ps_to_32_cores() -> None:
    proposal = run("hot-ps", _hot_job(0, (7.5, 2)))
    assert proposal is not None
    # no workers: the coefficient is 32 / 7.5 (what the capped original yields), never
    # infinite; ps-1 gets ceil(2 x 32 / 7.5) = 9 > its 8 cores
    assert proposal.resource.node_resources == {
        "ps-0": NodeResource(cpu=32),
        "ps-1": NodeResource(cpu=9),
    }
    assert "coefficient 4.27" in proposal.reason


def test_hot_ps_with_zero_workers_and_no_hot_ps_proposes_nothing() -> None:
    assert run("hot-ps", _hot_job(0, (4, 2))) is None


def test_hot_ps_not_hot_proposes_nothing() -> None:
    assert run("hot-ps", _hot_job(8, (4, 2))) is None
    assert run("hot-ps", state(distribution="ps")) is None


def test_hot_ps_memory_nearly_full_adds_8_gib() -> None:
    proposal = run("hot-ps", _hot_job(8, (1, 1), ps_memory=int(9.5 * GiB)))
    assert proposal is not None
    assert proposal.resource.node_resources == {
        "ps-0": NodeResource(memory=18 * GiB),
        "ps-1": NodeResource(memory=18 * GiB),
    }


# -- PS util --------------------------------------------------------------------------


def _util_job(total_steps: int | None) -> JobState:
    row = [
        use(PS, 0, cpu=28, memory=10 * GiB),
        use(PS, 1, cpu=2, memory=5 * GiB),
        use(PS, 1, cpu=2.5, memory=5 * GiB),
        use(WORKER, 0, cpu=1),
    ]
    return state(
        distribution="ps",
        stage=Stage.RUNNING.value,
        total_steps=total_steps,
        nodes=nodes(node(PS, 0, cpu=32, memory=16 * GiB), node(PS, 1, cpu=16, memory=16 * GiB)),
        samples=[sample(row, i, speed=1.0, step=100) for i in range(3)],
    )


def test_ps_util_shrinks_idle_ps_of_a_long_job_under_pressure() -> None:
    proposal = run("ps-util", _util_job(total_steps=100 + 7200))
    assert proposal is not None
    assert proposal.resource.node_resources == {
        "ps-1": NodeResource(cpu=7, memory=6 * GiB),
    }


def test_ps_util_needs_a_long_remaining_time() -> None:
    assert run("ps-util", _util_job(total_steps=None)) is None
    assert run("ps-util", _util_job(total_steps=100 + 600)) is None


# -- worker resource ------------------------------------------------------------------


def test_worker_resource_without_samples_proposes_nothing() -> None:
    assert run("worker-resource", state()) is None


def test_worker_resource_allreduce_sets_cpu_and_memory_only() -> None:
    job = state(samples=samples([[use(WORKER, 0, cpu=5.2, memory=10 * GiB)]] * 3))
    proposal = run("worker-resource", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources[WORKER] == NodeGroupResource(
        count=0, node_resource=NodeResource(cpu=7, memory=12 * GiB)
    )


def test_worker_resource_memory_moving_by_a_few_bytes_is_the_same_wish() -> None:
    """The example job's workers, as the brain saw them 1 s apart: the peak moved by a
    few hundred KiB, the target did not (memory rounded up to a whole 256 MiB)."""

    def wish(peak: int, **params: int) -> NodeResource:
        job = state(samples=samples([[use(WORKER, 0, cpu=0.06, memory=peak)]] * 3))
        proposal = run("worker-resource", job, **params)
        assert proposal is not None
        return proposal.resource.node_group_resources[WORKER].node_resource

    first, then = wish(351_772_672), wish(352_313_344)
    assert first == then == NodeResource(cpu=2, memory=512 * MiB)
    # a real rise still is one: past 512 MiB / 1.2 of peak, the next unit
    assert wish(450 * MiB).memory == 768 * MiB
    # unit 1: the spec's exact bytes (peak + 20 %), which noise moves
    assert wish(351_772_672, memory_unit=1) != wish(352_313_344, memory_unit=1)


def test_ps_util_rounds_its_memory_up_to_the_unit_too() -> None:
    proposal = run("ps-util", _util_job(total_steps=100 + 7200), memory_unit=4 * GiB)
    assert proposal is not None
    assert proposal.resource.node_resources["ps-1"].memory == 8 * GiB  # 5 GiB x 1.2 = 6


def test_worker_resource_memory_margin_is_capped_at_8_gib() -> None:
    job = state(samples=samples([[use(WORKER, 0, cpu=1, memory=50 * GiB)]]))
    proposal = run("worker-resource", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources[WORKER].node_resource.memory == 58 * GiB


def _ps_job(stage: Stage, ps_cpu: float, worker_counts: list[int], speeds: list[float]) -> JobState:
    rows = [
        sample(
            [use(PS, 0, cpu=ps_cpu), *(use(WORKER, i, cpu=1, memory=GiB) for i in range(n))],
            i,
            speed=s,
        )
        for i, (n, s) in enumerate(zip(worker_counts, speeds, strict=True))
    ]
    return state(
        distribution="ps",
        stage=stage.value,
        total_steps=10**9,
        nodes=nodes(node(PS, 0, cpu=10)),
        samples=rows,
    )


def test_worker_resource_ps_exhausted_removes_workers() -> None:
    job = _ps_job(Stage.RUNNING, 9.7, [4] * 3, [1.0] * 3)
    proposal = run("worker-resource", job, step=2)
    assert proposal is not None
    assert proposal.resource.node_group_resources[WORKER].count == 2


def test_worker_resource_initial_grows_to_ps_headroom() -> None:
    job = _ps_job(Stage.WORKER_INITIAL, 4, [4] * 3, [1.0] * 3)
    proposal = run("worker-resource", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources[WORKER].count == 8  # ceil(0.8 / 0.4 x 4)


def test_worker_resource_initial_short_job_gets_10_workers() -> None:
    job = _ps_job(Stage.WORKER_INITIAL, 4, [4] * 3, [100.0] * 3)
    proposal = run("worker-resource", job.model_copy(update={"total_steps": 1000}))
    assert proposal is not None
    assert proposal.resource.node_group_resources[WORKER].count == 10


def test_worker_resource_running_grows_by_at_most_4_when_speed_increased() -> None:
    job = _ps_job(Stage.RUNNING, 4, [4] * 5 + [6] * 5, [1.0] * 5 + [1.4] * 5)
    proposal = run("worker-resource", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources[WORKER].count == 10  # 6 + min(4, 12 - 6)


def test_worker_resource_running_decelerated_keeps_the_count() -> None:
    job = _ps_job(Stage.RUNNING, 4, [4] * 5 + [6] * 5, [1.0] * 5 + [0.8] * 5)
    proposal = run("worker-resource", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources[WORKER].count == 0


def test_speed_trend() -> None:
    rows = [
        sample([use(WORKER, i) for i in range(n)], j, speed=s)
        for j, (n, s) in enumerate([(2, 1.0), (2, 1.0), (3, 1.2), (3, 1.2)])
    ]
    assert speed_trend(rows, 5, 0.1) == "increased"
    assert speed_trend(rows[:2], 5, 0.1) == "unknown"
    slower = [msgspec.structs.replace(r, speed=0.5) if i >= 2 else r for i, r in enumerate(rows)]
    assert speed_trend(slower, 5, 0.1) == "decelerated"


def test_single_ps_node_status_is_respected() -> None:
    # one PS node, OOM recorded but the node removed: the stale OOM still routes, once
    job = state(
        distribution="ps",
        nodes=nodes(node(PS, 0, memory=4 * GiB, status=NodeStatus.OOM)),
        ooms={"ps-0": [oom("o1")]},
    )
    proposal = run("ps-oom", job)
    assert proposal is not None
    assert proposal.resource.node_group_resources[PS].node_resource.memory == 8 * GiB
