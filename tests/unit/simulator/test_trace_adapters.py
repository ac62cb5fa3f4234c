"""The workload-trace extension point (`dlrover_events.domain.workloads`): the installed
adapters are found by name, a trace is read in time order, and whatever is wrong with a
trace or a name is one line (a UserError), never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover_events.domain.workloads import (
    TimedEvent,
    TraceError,
    UnknownTraceAdapter,
    read_trace,
    trace_adapters,
)
from dlrover_events.errors import UserError
from handlers.simulator.adapters import pollux_workload
from handlers.simulator.workload import workload_path
from schemas.jobs import JobSubmitted

HEADER = "name,time,application,num_replicas,batch_size\n"


def test_the_pollux_adapter_is_installed_and_reads_a_workload_in_time_order() -> None:
    assert trace_adapters()["pollux"] is pollux_workload
    timed = read_trace(workload_path("workload-6"), "e")
    assert len(timed) == 160
    assert all(isinstance(t, TimedEvent) and isinstance(t.event, JobSubmitted) for t in timed)
    assert [t.seconds for t in timed] == sorted(t.seconds for t in timed)
    assert {t.event.env for t in timed} == {"e"}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("name,time\nj1,0\n", "as a Pollux workload: no column 'application'"),
        (HEADER + "j1,soon,cifar10,1,64\n", "as a Pollux workload: could not convert"),
        (HEADER + "j1,0,nosuchapp,1,64\n", "no traces for application 'nosuchapp'"),
    ],
)
def test_a_bad_trace_is_one_line_naming_the_file(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "w.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=said) as err:
        read_trace(path, "e")
    assert isinstance(err.value, UserError) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_a_missing_file_and_an_unknown_adapter_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="No such file"):
        read_trace(tmp_path / "none.csv", "e")
    with pytest.raises(UnknownTraceAdapter, match="unknown workload adapter 'nope'; known: pollux"):
        read_trace(tmp_path / "none.csv", "e", "nope")
