"""`dlrover-events optimize --state FILE.json`: the plan the brain would make, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlrover_events.errors import UserError
from streams.brain.core.state import WORKER, NodeStatus, RoleResources
from streams.brain.runtime.dry_run import dry_run, optimize, optimizers, parse_history, parse_state
from tests.unit.brain.builders import T0, GiB, completed, node, nodes, oom, state, use


def oom_state_json() -> str:
    job = state(
        stage="running",
        roles={WORKER: RoleResources(replicas=2, cpu=8, memory=8 * GiB)},
        nodes=nodes(
            node(WORKER, 0, cpu=8, memory=8 * GiB),
            node(WORKER, 1, cpu=8, memory=8 * GiB, status=NodeStatus.OOM),
        ),
        ooms={"worker-1": [oom("oom-1")]},
        last_event_id="oom-1",
    )
    return job.model_dump_json()


def test_dry_run_prints_both_plans_for_an_oom() -> None:
    out = dry_run(parse_state(oom_state_json()), T0)
    assert out["optimizers"] == ["host-oom"]
    assert out["optimize_plan"]["caused_by"] == "oom-1"
    assert out["optimize_plan"]["resource"]["node_resources"] == {
        "worker-1": {
            "cpu": 0.0,
            "memory": 16 * GiB,
            "gpu_num": 0,
            "gpu_type": "",
            "gpu_memory": 0,
            "priority": "",
        }
    }
    migrate = out["scale_plan"]["migrate_nodes"]
    assert [(m["node"]["id"], m["resource"]["memory"]) for m in migrate] == [(1, 16 * GiB)]
    assert out["handled_ooms"] == ["oom-1"]
    json.dumps(out)  # JSON-ready


def test_dry_run_with_a_named_optimizer_and_history() -> None:
    history = [completed("h1", [[use(WORKER, 0, cpu=20, memory=20 * GiB)]])]
    out = dry_run(state(stage="running"), T0, optimizer="worker-create", history=history)
    assert out["optimizers"] == ["worker-create"]
    group = out["optimize_plan"]["resource"]["node_group_resources"][WORKER]
    assert (group["count"], group["node_resource"]["memory"]) == (1, 30 * GiB)


def test_dry_run_without_a_change_says_so() -> None:
    out = dry_run(state(stage="running"), T0)
    assert out["optimize_plan"] is None
    assert out["scale_plan"] is None
    assert "no change" in out["reason"]


def test_unknown_optimizer_is_a_user_error() -> None:
    with pytest.raises(UserError, match="unknown optimizer 'nope'; known: "):
        dry_run(state(), T0, optimizer="nope")


def test_unknown_stage_is_a_user_error() -> None:
    text = state().model_dump_json().replace('"stage":"create"', '"stage":"warmup"')
    with pytest.raises(UserError, match="unknown stage 'warmup'; known: create, "):
        parse_state(text, "state file s.json")
    with pytest.raises(UserError, match="unknown stage 'warmup'"):
        parse_history(f"[{text}]")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "is not valid JSON"),
        ("[]", "is not a valid job state"),
        ('{"env": "test"}', "job: Field required"),
        ('{"env": "Bad Env", "job": {"uuid": "j"}}', "env: Value error"),
    ],
)
def test_bad_state_is_a_one_line_user_error(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        parse_state(text)
    assert "\n" not in str(caught.value)


def test_bad_history_is_a_user_error() -> None:
    with pytest.raises(UserError, match="history is not a valid job state"):
        parse_history('{"env": "test"}')


def test_command_reads_the_file_and_prints_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "state.json"
    path.write_text(oom_state_json())
    optimize(state=path, optimizer=None, history=None, free_gpus=None, now=T0)
    out = json.loads(capsys.readouterr().out)
    assert out["scale_plan"]["migrate_nodes"][0]["node"]["id"] == 1


def test_command_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read state file"):
        optimize(
            state=tmp_path / "missing.json", optimizer=None, history=None, free_gpus=None, now=None
        )


def test_optimizers_lists_names_with_descriptions(capsys: pytest.CaptureFixture[str]) -> None:
    optimizers(as_json=False)
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines]
    assert names == sorted(names)
    assert {"goodput", "host-oom", "gpu-oom", "straggler", "ps-create", "hot-ps"} <= set(names)
