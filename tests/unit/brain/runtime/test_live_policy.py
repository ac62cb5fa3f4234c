"""A running brain's policy follows its env's settings (`streams.brain.runtime.live_policy`): a
newer version is handed to the brain, or, when it changes who decides the env, asks for
a regroup; a version it cannot run with, or an older one, is not taken."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dlrover_events.envs.control import SettingsFollower
from dlrover_events.settings import Settings
from schemas.control import EnvAnnouncement, EnvMode
from schemas.env_settings import LimitSettings
from streams.brain.core.policy import Policy
from streams.brain.runtime.live_policy import LivePolicy

ENV = "live"
SCHEDULER = {"name": "tiresias", "nodes": 2, "gpus_per_node": 4}


def announced(version: int, settings: dict[str, Any]) -> EnvAnnouncement:
    return EnvAnnouncement(
        env=ENV,
        name=ENV,
        mode=EnvMode.VIRTUAL,
        partitions=1,
        settings=settings,
        settings_version=version,
    )


def _live(policy: Policy | None = None, version: int = 1) -> tuple[LivePolicy, list[Policy]]:
    live = LivePolicy(Settings(), ENV, policy or Policy(), version)
    taken: list[Policy] = []
    live.attach(taken.append)
    return live, taken


def test_a_newer_version_is_handed_to_the_running_brain() -> None:
    live, taken = _live()
    live._announced(announced(2, {"brain": {"limits": {"max_memory_step": 2**30}}}))
    assert [p.limits for p in taken] == [LimitSettings(max_memory_step=2**30)]
    assert live.version == 2 and live.policy is taken[0]
    assert not live.regroup.is_set()
    live.attach(None)  # (no brain between two: the next one starts with live.policy)
    live._announced(announced(3, {"brain": {"running_every": 3}}))
    assert len(taken) == 1 and live.policy.settings.running_every == 3


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({}, {"brain": {"scheduler": SCHEDULER}}),
        ({"brain": {"scheduler": SCHEDULER}}, {}),
        ({}, {"brain": {"lockstep": True}}),
    ],
)
def test_a_change_of_who_decides_regroups(before: dict[str, Any], after: dict[str, Any]) -> None:
    live, taken = _live(Policy.from_settings(before.get("brain")))
    live._announced(announced(2, after))
    assert live.regroup.is_set() and taken == []
    assert live.policy == Policy.from_settings(after.get("brain"))
    # what comes before the regroup is done goes to the brain that decides next
    live._announced(announced(3, {"brain": {**after.get("brain", {}), "running_every": 5}}))
    assert taken == [] and live.policy.settings.running_every == 5 and live.version == 3


def test_a_scheduler_changed_while_on_is_taken_in_place() -> None:
    live, taken = _live(Policy.from_settings({"scheduler": SCHEDULER}))
    other = {**SCHEDULER, "name": "goodput-cluster", "params": {"hysteresis": 0.2}}
    live._announced(announced(2, {"brain": {"scheduler": other}}))
    assert not live.regroup.is_set()
    assert [p.scheduler.name for p in taken if p.scheduler] == ["goodput-cluster"]


def test_settings_it_cannot_run_with_are_not_taken(caplog: pytest.LogCaptureFixture) -> None:
    live, taken = _live()
    for version, bad in (
        (2, {"brain": {"job_config": {"optimizer": "no-such"}}}),
        (3, {"brain": {"limits": {"max_cpu": -1}}}),
        (4, {"brian": {}}),
    ):
        with caplog.at_level(logging.ERROR):
            live._announced(announced(version, bad))
        assert taken == [] and live.version == 1 and live.policy == Policy()
        assert f"does not take settings version {version}" in caplog.text
    assert "brain.job_config.optimizer: unknown optimizer 'no-such'" in caplog.text


def test_the_follower_hands_on_only_newer_versions() -> None:
    heard: list[int] = []
    follower = SettingsFollower(Settings(), ENV, 3, lambda a: heard.append(a.settings_version))
    for version in (2, 3, 5, 4, 5, 6):
        follower._seen({ENV: announced(version, {}), "other": announced(9, {})})
    follower._seen({})  # (the env deleted: nothing to hand on)
    assert heard == [5, 6]
