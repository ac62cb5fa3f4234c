"""The real/standby switch's pure decisions: the standby `up` makes, each env's role, the
last switch read from the registry's history, the watchdog's verdict on its standby, when
a role ends, and when a stopping local operator ends its jobs' processes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dlrover_events.envs.failover import (
    STANDBY_VARIABLE,
    Role,
    Switch,
    last_switch,
    role,
    standby_name,
    standby_to_make,
)
from dlrover_events.envs.role_watch import RoleWatch, role_changed
from handlers.operator.local.runner import ends_pods
from schemas.control import EnvAnnouncement, EnvMode
from streams.evaluators.watchdog import standby_problem

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_the_standby_is_the_watchdog_s_variable() -> None:
    assert standby_name({}) is None
    assert standby_name({STANDBY_VARIABLE: "  "}) is None
    assert standby_name({STANDBY_VARIABLE: " standby "}) == "standby"


def test_up_makes_the_standby_with_the_real_env_s_settings_unless_it_exists() -> None:
    settings = {"brain": {"scheduler": {"name": "tiresias"}}}
    made = standby_to_make("standby", "prod", settings, ["prod"])
    assert made is not None and (made.name, made.settings) == ("standby", settings)
    assert made.settings is not settings  # a copy: the record's own stays the record's
    assert standby_to_make(None, "prod", settings, ["prod"]) is None  # failover off
    assert standby_to_make("standby", "prod", settings, ["prod", "standby"]) is None
    # after a failover the standby is the real env: nothing to make
    assert standby_to_make("standby", "standby", settings, ["prod", "standby"]) is None


def test_roles() -> None:
    assert role("prod", EnvMode.REAL, "standby") is Role.REAL
    assert role("standby", EnvMode.VIRTUAL, "standby") is Role.STANDBY
    assert role("shadow", EnvMode.VIRTUAL, "standby") is Role.VIRTUAL
    assert role("shadow", EnvMode.VIRTUAL, None) is Role.VIRTUAL
    assert role("standby", EnvMode.REAL, "standby") is Role.REAL  # it took over


def change(name: str, kind: str, reason: str = "", at: datetime = T0) -> dict[str, object]:
    return {"name": name, "change": kind, "mode": None, "reason": reason, "changed_at": at}


def test_the_last_switch_is_the_latest_promotion_with_the_env_it_demoted() -> None:
    assert last_switch([]) is None
    assert last_switch([change("prod", "create"), change("standby", "create")]) is None
    later = T0 + timedelta(minutes=5)
    history = [
        change("prod", "create"),
        change("prod", "demote", "drill", T0),
        change("standby", "promote", "drill", T0),
        change("standby", "settings", "tuned", later),
        change("standby", "demote", "watchdog: 4 of 4 failed", later),
        change("prod", "promote", "watchdog: 4 of 4 failed", later),
        change("shadow", "create", "", later),
    ]
    switch = last_switch(history)
    assert switch == Switch(later, "prod", "standby", "watchdog: 4 of 4 failed")
    assert "prod became the real env (was standby): watchdog: 4 of 4 failed" in switch.line()
    assert switch.as_json()["from"] == "standby"
    # a promotion with no real env before it (or a demote of another transaction)
    alone = last_switch([change("prod", "demote", "x", T0), change("standby", "promote", "y")])
    assert alone is not None and alone.came_from is None
    assert "no reason given" in Switch(T0, "a", None, "").line()


def test_the_watchdog_promotes_only_a_virtual_env() -> None:
    assert standby_problem("standby", EnvMode.VIRTUAL) is None
    missing = standby_problem("standby", None)
    assert missing is not None and "keeps watching" in missing and "env create standby" in missing
    real = standby_problem("standby", EnvMode.REAL)
    assert real is not None and "not a virtual one" in real


@pytest.mark.parametrize(
    ("env", "was_real", "real", "changed"),
    [
        ("prod", True, "prod", False),
        ("prod", True, None, False),  # between a demotion and a promotion: no change yet
        ("prod", True, "standby", True),  # demoted
        ("standby", False, "prod", False),
        ("standby", False, None, False),
        ("standby", False, "standby", True),  # promoted
    ],
)
def test_a_role_ends_when_another_env_is_announced_real(
    env: str, was_real: bool, real: str | None, changed: bool
) -> None:
    assert role_changed(env, was_real, real) is changed


def test_a_role_watch_trips_once_and_stays_tripped() -> None:
    def announced(real: str) -> dict[str, EnvAnnouncement]:
        return {
            name: EnvAnnouncement(
                env=name,
                name=name,
                mode=EnvMode.REAL if name == real else EnvMode.VIRTUAL,
                partitions=1,
            )
            for name in ("prod", "standby")
        }

    watch = RoleWatch("prod", was_real=True)
    watch.seen(announced("prod"))
    assert watch.holds()
    watch.seen(announced("standby"))
    assert not watch.holds() and watch.now_real == "standby"
    watch.seen(announced("prod"))  # promoted back: the fenced process does not come back
    assert not watch.holds() and watch.now_real == "standby"


def test_a_stopping_local_operator_ends_its_jobs_only_while_its_env_is_real() -> None:
    assert ends_pods(True, True)
    assert not ends_pods(False, True)  # configured to leave them
    assert not ends_pods(True, False)  # demoted: the new real env adopts them
    assert not ends_pods(True, None)  # the registry cannot say: keep them


def test_an_env_promoted_back_is_judged_on_what_failed_since() -> None:
    from streams.evaluators.ledger import Ledger
    from streams.evaluators.watchdog import WatchdogPolicy, failover_reason
    from tests.unit.evaluators.test_evaluators import T0 as LEDGER_T0
    from tests.unit.evaluators.test_evaluators import job_life

    policy = WatchdogPolicy("standby", failed_rate=0.5, window=timedelta(hours=1), min_finished=2)
    ledger = Ledger()
    for i in range(2):  # the failures that made it fail over, before it became real again
        job_life(ledger, f"failed-{i}", 0, 0, 60 + i, gpus=1, failed=True)
    job_life(ledger, "ok", 100, 100, 200, gpus=1)
    assert failover_reason(ledger, policy) is not None  # 2 of 3 within the window
    back = LEDGER_T0 + timedelta(seconds=90)
    assert failover_reason(ledger, policy, back) is None  # 1 finished since: too few
    job_life(ledger, "bad", 100, 100, 210, gpus=1, failed=True)
    reason = failover_reason(ledger, policy, back)
    assert reason is not None and "1 of 2 jobs failed" in reason
