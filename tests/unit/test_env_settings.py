"""An env's settings: one schema, validated the same way wherever they are given, with a
line that names the setting; the reference document rendered from the schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlrover_events.envs.env_settings import (
    EnvSettingsError,
    parse_settings,
    read_settings_file,
    settings_checks,
    validate_settings,
)
from schemas.env_settings import MAX_SETTINGS_BYTES, EnvSettings, LimitSettings, OperatorSettings
from schemas.settings_doc import BEGIN, END, with_reference
from streams.brain.core.policy import Policy

REPO = Path(__file__).resolve().parents[2]
SCHEDULER = {"name": "goodput-cluster", "nodes": 4, "gpus_per_node": 8}


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({"brain": {"limits": {"max_cpu": -1}}}, "env setting brain.limits.max_cpu: "),
        ({"brain": {"limits": {"max_cpus": 1}}}, "env setting brain.limits.max_cpus: Extra"),
        ({"brian": {}}, "env setting brian: Extra inputs"),
        ({"brain": True}, "env setting brain: "),
        ({"brain": {"job_config": {"optimizer": 3}}}, "env setting brain.job_config.optimizer: "),
        ({"brain": {"scheduler": {"name": "tiresias"}}}, "env setting brain.scheduler.nodes: "),
        ({"operator": {"speed": 0}}, "env setting operator.speed: "),
        ({"operator": {"admission": "me"}}, "env setting operator.admission: "),
        ({"brain": {"job_config": {"x": "a\x00b"}}}, "must not contain NUL"),
        ({"brain": {"job_config": {"x": _nested(40)}}}, "nests deeper than 32"),
    ],
)
def test_the_schema_names_the_setting(raw: dict[str, Any], said: str) -> None:
    with pytest.raises(EnvSettingsError) as err:
        parse_settings(raw)
    assert said in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("brain", "said"),
    [
        ({"job_config": {"optimizer": "nope"}}, "brain.job_config.optimizer: unknown optimizer"),
        ({"job_config": {"optimizer": {"runing": "goodput"}}}, "optimizer.runing: unknown stage"),
        (
            {"job_config": {"optimizer": {"running": "nope"}}},
            "optimizer.running: unknown optimizer",
        ),
        ({"job_config": {"optimizer_params": {"nope": {}}}}, "optimizer_params.nope: unknown"),
        (
            {"job_config": {"optimizer_params": {"goodput": {"no_such": 1}}}},
            "brain.job_config.optimizer_params.goodput.no_such: Extra inputs",
        ),
        ({"scheduler": {**SCHEDULER, "name": "nope"}}, "brain.scheduler.name: unknown scheduler"),
        (
            {"scheduler": {**SCHEDULER, "params": {"hysteresis": -1}}},
            "scheduler.params.hysteresis: Input should be greater than or equal to 0 (got -1)",
        ),
    ],
)
def test_what_the_registries_judge_is_checked_through_the_entry_points(
    brain: dict[str, Any], said: str
) -> None:
    """The CLI cannot import streams: the brain's check comes through its entry point."""
    assert [name for name, _ in settings_checks()] == ["brain"]
    parse_settings({"brain": brain})  # the schema alone takes it
    with pytest.raises(EnvSettingsError) as err:
        validate_settings({"brain": brain})
    assert said in str(err.value)
    assert str(err.value).startswith("env setting ")


def test_good_settings_are_stored_as_set_and_make_the_policy() -> None:
    raw = {
        "brain": {
            "limits": {"max_memory_step": 2**30},
            "job_config": {
                "optimizer": {"running": "goodput"},
                "optimizer_params": {"goodput": {}},
                "total_steps": 100,
            },
            "scheduler": {**SCHEDULER, "params": {"hysteresis": 0.1}},
        },
        "operator": {"speed": 4},
    }
    settings = validate_settings(raw)
    assert settings.stored() == {
        "brain": {**raw["brain"], "limits": {"max_memory_step": 2**30}},  # only what is set
        "operator": {"speed": 4.0},
    }
    assert validate_settings(settings.stored()) == settings
    policy = Policy.from_settings(settings.brain)
    assert policy.limits == LimitSettings(max_memory_step=2**30)
    assert policy.job_config == raw["brain"]["job_config"]
    assert policy.scheduler is not None and policy.scheduler.name == "goodput-cluster"
    assert validate_settings({}).stored() == {}
    assert validate_settings({"brain": False}).stored() == {"brain": False}


def test_the_planner_and_the_simulator_take_their_defaults_from_the_schema() -> None:
    from handlers.operator.virtual.settings import VirtualSettings
    from handlers.simulator.job import DEFAULT_RESTART_DELAY

    assert Policy().limits == LimitSettings()
    assert OperatorSettings().restart_delay == DEFAULT_RESTART_DELAY
    assert set(VirtualSettings.model_fields) == set(OperatorSettings.model_fields)
    assert EnvSettings().operator == OperatorSettings()


def test_a_settings_file_is_bounded_and_a_mapping(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("brain: {}\n" + "#" * MAX_SETTINGS_BYTES)
    not_a_map = tmp_path / "list.yaml"
    not_a_map.write_text("- brain\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("brain: [\n")
    aliases = tmp_path / "aliases.yaml"
    aliases.write_text("a: &x {b: 1}\nc: *x\n")
    for path, said in (
        (big, "larger than"),
        (not_a_map, "must hold a mapping"),
        (bad, "is not valid YAML"),
        (aliases, "aliases"),
        (tmp_path / "missing.yaml", "cannot read"),
    ):
        with pytest.raises(EnvSettingsError, match=said) as err:
            read_settings_file(path)
        assert "\n" not in str(err.value)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing set\n")
    assert read_settings_file(empty) == {}


def test_the_reference_document_is_rendered_from_the_schema() -> None:
    doc = (REPO / "docs" / "env-settings.md").read_text("utf-8")
    assert BEGIN in doc and END in doc
    assert with_reference(doc) == doc, "run `dlrover-events schemas settings-doc`"
    for name in EnvSettings.model_fields:
        assert f"`{name}." in doc


def test_a_changed_schema_makes_the_document_stale() -> None:
    doc = (REPO / "docs" / "env-settings.md").read_text("utf-8")
    stale = doc.replace("| `brain.limits.max_cpu` |", "| `brain.limits.max_cpus` |")
    assert stale != doc
    assert with_reference(stale) == doc
    with pytest.raises(ValueError, match="no generated part"):
        with_reference("# no markers\n")
