"""The fuzz bench's labels are true: every valid record it builds decodes, and every bad
class (the probes apart) is refused by the one strict decoder all consumers share, so a
bad record a consumer takes is the consumer's fault, not the label's."""

from __future__ import annotations

from collections import Counter

import pytest

from schemas.codec import CodecError, decode
from streams.fuzz_bench import CLASSES, PROBES, RARE, VALID, build


@pytest.mark.parametrize("seed", [1, 2])
def test_every_bad_class_is_refused_and_every_valid_record_decodes(seed: int) -> None:
    plan = build("prod", bad=3 * len(CLASSES), valid=200, jobs=4, seed=seed)
    labels = Counter(label for label, *_ in plan.records)
    assert labels[VALID] >= 190
    assert set(labels) - {VALID} == set(CLASSES), "every class is sent"
    for label, _, key, value in plan.records:
        if label == VALID:
            assert decode(value).key == key.decode()
        elif label in PROBES:
            decode(value)  # taken on purpose: the report shows what it does
        elif label == "wrong_env":
            assert decode(value).env != "prod", "valid, but another env's: refused by env"
        else:
            with pytest.raises(CodecError):
                decode(value)


def test_the_bad_records_go_among_the_valid_ones_in_each_jobs_order() -> None:
    plan = build("prod", bad=500, valid=400, jobs=4, seed=3)
    assert sum(1 for label, *_ in plan.records if label != VALID) == 500
    assert all(
        sum(1 for label, *_ in plan.records if label == name) <= count
        for name, count in RARE.items()
    )
    for job in range(4):
        key = f"fuzz-job-{job}".encode()
        mine = [r for r in plan.records if r[2] == key]
        assert mine[0][0] != VALID or mine[-1][0] != VALID or len(mine) > 100
        steps = [
            decode(v).global_step  # type: ignore[attr-defined]
            for label, suffix, _, v in mine
            if label == VALID and suffix == "job.metrics"
        ]
        assert steps == sorted(steps), "valid events keep their job's order"
