"""An in-place member's settings as the platform gives them (the environment), and what
the training loop's ``InPlaceGroup.from_env`` makes of them and of its own arguments."""

from __future__ import annotations

import pytest

from dlrover_events.sdk.identity import (
    ELASTIC_EXPECT_ENV,
    ELASTIC_STORE_ENV,
    ELASTIC_STORE_HOST_ENV,
    ROLE_ENV,
)
from dlrover_events.sdk.knobs import StepKnobs
from dlrover_events.sdk.torch.inplace import InPlaceGroup
from dlrover_events.sdk.torch.inplace_settings import (
    DEFAULT_GATHER_S,
    DEFAULT_SETTLE_S,
    DEFAULT_TIMEOUT_S,
    GATHER_ENV,
    SETTLE_ENV,
    TIMEOUT_ENV,
    InPlaceSettings,
)


def test_a_process_the_platform_runs_restarting_has_no_settings() -> None:
    assert InPlaceSettings.from_env({}) is None
    assert InPlaceSettings.from_env({ELASTIC_STORE_ENV: "  "}) is None


def test_the_settings_are_what_the_platform_set() -> None:
    env = {
        ELASTIC_STORE_ENV: "job-ps-0.job:29400",
        ELASTIC_STORE_HOST_ENV: "1",
        ELASTIC_EXPECT_ENV: "4",
        SETTLE_ENV: "5",
        GATHER_ENV: "0",
        TIMEOUT_ENV: "12.5",
        ROLE_ENV: "trainer",
    }
    assert InPlaceSettings.from_env(env) == InPlaceSettings(
        "job-ps-0.job",
        29400,
        hosts_store=True,
        role="trainer",
        expect=4,
        settle_s=5.0,
        gather_s=0.0,
        timeout_s=12.5,
    )


def test_unset_timing_takes_the_defaults() -> None:
    settings = InPlaceSettings.from_env({ELASTIC_STORE_ENV: "10.0.0.3:29400"})
    assert settings == InPlaceSettings("10.0.0.3", 29400, hosts_store=False)
    assert (settings.settle_s, settings.gather_s, settings.timeout_s) == (
        DEFAULT_SETTLE_S,
        DEFAULT_GATHER_S,
        DEFAULT_TIMEOUT_S,
    )
    assert (settings.role, settings.expect, settings.check_every) == ("worker", 1, 1)


def test_an_override_wins_and_its_variable_is_not_read() -> None:
    env = {ELASTIC_STORE_ENV: "h:1", TIMEOUT_ENV: "not a number", ELASTIC_EXPECT_ENV: "3"}
    settings = InPlaceSettings.from_env(env, timeout_s=7, check_every=4)
    assert settings is not None
    assert (settings.timeout_s, settings.check_every, settings.expect) == (7, 4, 3)


@pytest.mark.parametrize("addr", ["29400", "host:", ":29400", "host:port"])
def test_a_store_address_that_is_not_host_port_is_refused(addr: str) -> None:
    with pytest.raises(ValueError, match="must be host:port"):
        InPlaceSettings.from_env({ELASTIC_STORE_ENV: addr})


def test_the_store_address_is_not_an_override() -> None:
    with pytest.raises(TypeError, match="store_port"):
        InPlaceSettings.from_env({ELASTIC_STORE_ENV: "h:1"}, store_port=2)


@pytest.mark.parametrize(
    "bad",
    [{"check_every": 0}, {"expect": 0}, {"timeout_s": 0}, {"gather_s": -0.1}],
)
def test_settings_that_cannot_work_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="check_every and expect must be >= 1"):
        InPlaceSettings("h", 1, hosts_store=False, **bad)


def test_the_group_from_env_takes_settings_and_its_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ELASTIC_STORE_ENV, "127.0.0.1:29400")
    monkeypatch.setenv(ELASTIC_EXPECT_ENV, "2")
    monkeypatch.setenv(ROLE_ENV, "trainer")
    knobs = StepKnobs(8)
    group = InPlaceGroup.from_env(
        knobs=knobs, check_every=3, backend="gloo", member="m", handle_sigterm=False
    )
    assert group is not None
    assert group.settings == InPlaceSettings(
        "127.0.0.1", 29400, hosts_store=False, role="trainer", backend="gloo", expect=2,
        check_every=3,
    )  # fmt: skip
    assert group.knobs is knobs and group.member == "m" and group.role == "trainer"
    assert (group.backend, group.step, group.left, group.world_size) == ("gloo", 0, False, 0)
    with pytest.raises(RuntimeError, match="join"):
        _ = group.model


def test_the_group_from_env_outside_an_in_place_job_is_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ELASTIC_STORE_ENV, raising=False)
    assert InPlaceGroup.from_env(knobs=StepKnobs(8)) is None
