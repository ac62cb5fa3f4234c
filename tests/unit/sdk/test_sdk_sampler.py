"""The elastic sampler (issue 36): the global order of samples is the same at any world
size and across resizes, so a job at a fixed global batch sees the same batches."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from dlrover_events.sdk.torch.sampler import ElasticSampler, epoch_order, rank_slice


def global_batches(sampler: ElasticSampler, world_size: int, steps: int) -> list[list[int]]:
    """What ``steps`` steps train on: every rank's local batch, in rank order."""
    out = []
    for _ in range(steps):
        batch: list[int] = []
        for rank in range(world_size):
            sampler._rank, sampler._world_size = rank, world_size
            batch += sampler.local_batch()
        out.append(batch)
        sampler.advance()
    return out


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(8, 200),
    per_rank=st.integers(1, 4),
    seed=st.integers(0, 1000),
    segments=st.lists(
        st.tuples(st.sampled_from([1, 2, 4]), st.integers(0, 12)), min_size=1, max_size=4
    ),
)
def test_the_global_order_does_not_depend_on_the_world_sizes(
    size: int, per_rank: int, seed: int, segments: list[tuple[int, int]]
) -> None:
    global_batch = 4 * per_rank  # divides over 1, 2 and 4 ranks
    if global_batch > size:
        return
    total = sum(steps for _, steps in segments)
    never_resized = global_batches(ElasticSampler(size, global_batch, seed=seed), 1, total)
    resized: list[list[int]] = []
    sampler = ElasticSampler(size, global_batch, seed=seed)
    for world_size, steps in segments:
        resumed = ElasticSampler(size, global_batch, seed=seed)  # a restart: from its state
        resumed.load_state_dict(sampler.state_dict())
        resized += global_batches(resumed, world_size, steps)
        sampler = resumed
    assert resized == never_resized


def test_each_epoch_is_a_permutation_dealt_in_whole_global_batches() -> None:
    sampler = ElasticSampler(10, 4, seed=1, rank=0, world_size=2)
    order = epoch_order(10, 1, 0)
    assert sorted(order) == list(range(10)) and order != list(range(10))
    assert sampler.batches_per_epoch == 2 and len(sampler) == 4
    first = list(sampler)  # rank 0's half of each of the epoch's two global batches
    assert first == order[0:2] + order[4:6]
    assert sampler.position == 8 and sampler.epoch == 1
    assert list(sampler) == epoch_order(10, 1, 1)[0:2] + epoch_order(10, 1, 1)[4:6]
    assert epoch_order(10, 1, 0, shuffle=False) == list(range(10))


def test_a_loader_without_workers_leaves_the_position_at_the_batch_trained() -> None:
    sampler = ElasticSampler(40, 8, rank=1, world_size=2)
    loader = DataLoader(list(range(40)), batch_size=sampler.local_batch_size, sampler=sampler)
    it = iter(loader)
    next(it)
    next(it)
    assert sampler.position == 16  # two global batches taken, the third not yet


def test_what_does_not_divide_or_does_not_match_is_refused() -> None:
    with pytest.raises(ValueError, match="does not divide over 3 ranks"):
        rank_slice([1, 2, 3, 4], 0, 3)
    with pytest.raises(ValueError, match="not in a world"):
        rank_slice([1, 2], 2, 2)
    with pytest.raises(ValueError, match="1 to 5 samples"):
        ElasticSampler(5, 8)
    sampler = ElasticSampler(50, 10, seed=1)
    with pytest.raises(ValueError, match="seed=2"):
        sampler.load_state_dict({**sampler.state_dict(), "seed": 2})
    with pytest.raises(ValueError, match="does not divide over 3"):
        _ = ElasticSampler(50, 10, rank=0, world_size=3).local_batch_size
