"""The console reads what `ab run` writes (summary.json) and says why when a file is not
one, whatever it holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from handlers.console.ab import SummaryError, read_run, run_view, summary_files
from streams.ab.report import ArmResult, compare
from streams.ab.summary import RunInfo, build_summary, write_summary

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=20,
)


@given(JSON | st.fixed_dictionaries({"schema_version": st.just(1), "arms": JSON}))
def test_any_json_is_a_run_or_a_reason(doc: Any) -> None:
    try:
        view = run_view(doc)
    except SummaryError as e:
        assert str(e)
    else:
        assert isinstance(view["arms"], list)


def test_a_summary_ab_run_wrote_is_shown_without_its_per_job_jcts(tmp_path: Path) -> None:
    jobs = {f"j{i}": 100.0 + i for i in range(30)}
    arms = [
        ArmResult("base", "ab-z-base", "defaults", jobs, {"gpu_hours": 2.0}),
        ArmResult("new", "ab-z-new", "new.yaml", {j: v - 50 for j, v in jobs.items()}, {}),
    ]
    run = RunInfo("z", "workload-6.csv", None, "lockstep", 16, 4, 9.0)
    write_summary(tmp_path / "ab-report", build_summary(compare(arms), run))
    (tmp_path / "ab-report" / "old").mkdir()
    (tmp_path / "ab-report" / "old" / "summary.json").write_text("{not json")
    found = summary_files([tmp_path / "ab-report", tmp_path / "missing"])
    assert sorted(p.parent.name for p in found) == ["ab-report", "old"]
    views = {p.parent.name: read_run(p) for p in found}
    assert views["old"]["error"].startswith("not JSON")
    good = views["ab-report"]
    assert good["run_id"] == "z"
    assert good["baseline"] == "base"
    new = good["arms"][1]
    assert new["verdict"] == "better"
    assert new["jobs"] == 30
    assert new["settings"] == "new.yaml"
    assert "j0" not in json.dumps(good)
