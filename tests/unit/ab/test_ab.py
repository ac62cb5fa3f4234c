from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover_events.errors import UserError
from dlrover_events.settings import Settings
from streams.ab.arms import PRESETS, Arm, parse_arm, parse_arms
from streams.ab.cli import _cluster
from streams.ab.report import ArmResult, compare, plot_png, render_html, table
from streams.ab.runner import ABTest, ArmCluster


def test_arm_with_settings_file(tmp_path: Path) -> None:
    f = tmp_path / "goodput.yaml"
    f.write_text("optimizer: goodput\noptimizer_params:\n  goodput: {min_gain: 0.1}\n")
    arm = parse_arm(f"gp={f}")
    assert arm.name == "gp"
    assert arm.settings == {
        "optimizer": "goodput",
        "optimizer_params": {"goodput": {"min_gain": 0.1}},
    }
    assert arm.env("r1") == "ab-r1-gp"
    assert parse_arm("mine=").settings == {}  # no file: the default brain settings
    assert parse_arm("static=").settings == {}


def test_a_bare_name_that_is_no_preset_is_refused_with_the_presets() -> None:
    """A typo (`--arm tiresais`) used to run the default brain under the typo's name."""
    with pytest.raises(UserError) as err:
        parse_arm("tiresais")
    said = str(err.value)
    assert "no preset of that name (did you mean tiresias?" in said
    assert all(name in said for name in PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_arm_is_the_example_file_of_its_name(name: str) -> None:
    """`--arm tiresias` and `--arm tiresias=examples/ab/tiresias.yaml` are one arm."""
    example = Path(__file__).parents[3] / "examples" / "ab" / f"{name}.yaml"
    preset = parse_arm(name)
    assert preset.settings == parse_arm(f"{name}={example}").settings
    assert preset.env("r1") == f"ab-r1-{name}"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("Bad=x.yaml", "lowercase"),
        ("a=/nonexistent.yaml", "cannot read"),
        ("toolongarmname1-toolongarm=", "1-20"),
        ("ends-=", "dashes"),
    ],
)
def test_bad_arms_are_user_errors(spec: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_arm(spec)


def test_arms_need_two_distinct_names(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="at least two"):
        parse_arms(["a="])
    with pytest.raises(UserError, match="must differ"):
        parse_arms(["a=", "a="])
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match="mapping"):
        parse_arm(f"a={bad}")
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1,\n")
    with pytest.raises(UserError, match="not valid YAML"):
        parse_arm(f"a={broken}")


@given(st.text(max_size=40))
def test_any_arm_spec_parses_or_is_a_user_error(spec: str) -> None:
    try:
        arm = parse_arm(spec)
    except UserError as err:
        assert str(err)
    else:
        assert arm.name


def arms() -> list[ArmResult]:
    jobs = [f"j{i}" for i in range(40)]
    static = ArmResult(
        "static",
        "ab-x-static",
        "defaults",
        {j: 3000.0 + 10 * i for i, j in enumerate(jobs)},
        {"gpu_hours": 100.0},
        [(0, 8), (3600, 16)],
    )
    goodput = ArmResult(
        "goodput",
        "ab-x-goodput",
        "gp.yaml",
        {j: 2000.0 + 10 * i for i, j in enumerate(jobs)},
        {"gpu_hours": 90.0},
        [(0, 12), (3600, 10)],
    )
    return [static, goodput]


def test_comparison_says_which_arm_is_better_and_by_how_much() -> None:
    c = compare(arms())
    assert c.jct_ci["static"].estimate == pytest.approx(3195)
    assert c.jct_diff["goodput"].estimate == pytest.approx(-1000)
    assert c.jct_diff["goodput"].high < 0
    assert c.verdicts == ["JCT static -> goodput: goodput is better by 1000"]
    assert table(c).row_count >= 3


def test_html_report_has_numbers_and_plot() -> None:
    c = compare(arms())
    png = plot_png(c)
    assert png.startswith(b"\x89PNG")
    page = render_html(c, png, "workload-6")
    assert "3,195 s" in page and "goodput is better by 1000" in page
    assert "data:image/png;base64," in page


def test_arms_with_a_brain_tick_with_it_and_arms_without_run_as_fast_as_possible() -> None:
    test = ABTest(Settings(), "", [], cluster=ArmCluster(2, 4))
    brained = test.env_settings(Arm("g", {"brain": {"job_config": {"optimizer": "goodput"}}}))
    assert brained["operator"] == {"nodes": 2, "gpus_per_node": 4, "lockstep": True}
    assert brained["brain"] == {
        "cluster_gpus": 8,
        "job_config": {"optimizer": "goodput"},
        "lockstep": True,
    }
    static = test.env_settings(Arm("s", {"brain": False}))
    assert static["brain"] is False
    assert static["operator"] == {"nodes": 2, "gpus_per_node": 4, "fast": True, "lockstep": False}


def test_an_arm_leaves_lockstep_whole_or_not_at_all() -> None:
    test = ABTest(Settings(), "", [], cluster=ArmCluster(2, 4, speed=100.0))
    arm = Arm("w", {"brain": {"lockstep": True}, "operator": {"lockstep": False}})
    settings = test.env_settings(arm)
    assert settings["operator"]["lockstep"] is False
    assert settings["operator"]["speed"] == 100.0
    assert "lockstep" not in settings["brain"], "its brain must not wait for barriers"


@pytest.mark.parametrize(
    ("speed", "cluster", "pace"),
    [
        ("lockstep", ArmCluster(1, 2, 200.0, lockstep=True), {"lockstep": True}),
        ("50x", ArmCluster(1, 2, 50.0, lockstep=False), {"speed": 50.0, "lockstep": False}),
        ("max", ArmCluster(1, 2, None, lockstep=False), {"fast": True, "lockstep": False}),
    ],
)
def test_speed_says_how_the_arms_clocks_move(
    speed: str, cluster: ArmCluster, pace: dict[str, object]
) -> None:
    assert _cluster(1, 2, speed) == cluster
    brained = ABTest(Settings(), "", [], cluster=cluster).env_settings(Arm("b", {}))
    assert brained["operator"] == {"nodes": 1, "gpus_per_node": 2, **pace}


def test_an_unknown_speed_says_what_it_may_be() -> None:
    with pytest.raises(ValueError, match="'lockstep' or 'max'"):
        _cluster(1, 2, "fast")


def test_an_arms_rescale_mode_prices_its_simulated_jobs_and_its_scheduler() -> None:
    test = ABTest(Settings(), "", [], cluster=ArmCluster(2, 4))
    restart, in_place = (
        test.env_settings(parse_arm(n)) for n in ("goodput-cluster", "cluster-inplace")
    )
    assert restart["operator"]["rescale_mode"] == "restart"
    assert in_place["operator"]["rescale_mode"] == "in_place"
    assert restart["brain"]["scheduler"]["params"]["rescale_mode"] == "restart"
    assert in_place["brain"]["scheduler"]["params"]["rescale_mode"] == "in_place"
    # the same arms otherwise: the same trace compares the two modes alone
    for settings in (restart, in_place):
        settings["operator"].pop("rescale_mode")
        settings["brain"]["scheduler"]["params"].pop("rescale_mode")
    assert restart == in_place
    # a scheduler without a price for rescales is told nothing; the simulator still is
    tiresias = PRESETS["tiresias"]
    told = test.env_settings(
        Arm("t", {**tiresias, "operator": {**tiresias["operator"], "rescale_mode": "in_place"}})
    )
    assert "params" not in told["brain"]["scheduler"]
    assert told["operator"]["rescale_mode"] == "in_place"
    # a penalty the arm's params name stays as the arm says
    own = Arm(
        "o",
        {
            "brain": {
                "scheduler": {"name": "goodput-cluster", "params": {"rescale_mode": "restart"}}
            },
            "operator": {"rescale_mode": "in_place"},
        },
    )
    assert test.env_settings(own)["brain"]["scheduler"]["params"]["rescale_mode"] == "restart"
