"""Which env a reporter publishes to as promotions are announced (pure)."""

from __future__ import annotations

import pytest

from dlrover_events.sdk.follow_real import (
    FOLLOW_REAL_ENV,
    Following,
    FollowReal,
    follow_real_from_env,
)


def test_a_job_started_on_the_real_env_follows_each_promotion() -> None:
    state = Following.start("prod", FollowReal.AUTO)
    assert state.following is None and not state.settled
    state = state.seen("prod")
    assert state == Following("prod", True)
    state = state.seen(None)  # the moment between demotion and promotion
    assert state == Following("prod", True)
    state = state.seen("standby")
    assert state == Following("standby", True)
    assert state.seen("prod") == Following("prod", True)


def test_a_job_pinned_to_a_virtual_env_stays_there() -> None:
    state = Following.start("shadow", FollowReal.AUTO).seen(None)
    assert state.following is None  # no real env known yet: undecided
    state = state.seen("prod")
    assert state == Following("shadow", False) and state.settled
    assert state.seen("shadow") == Following("shadow", False)


def test_never_pins_even_the_real_env_and_always_follows_from_anywhere() -> None:
    pinned = Following.start("prod", FollowReal.NEVER)
    assert pinned.settled and pinned.seen("standby") == pinned
    anywhere = Following.start("shadow", FollowReal.ALWAYS)
    assert anywhere.seen("prod") == Following("prod", True)


@pytest.mark.parametrize(
    ("raw", "policy"),
    [
        ("", FollowReal.AUTO),
        ("auto", FollowReal.AUTO),
        ("TRUE", FollowReal.ALWAYS),
        ("always", FollowReal.ALWAYS),
        ("false", FollowReal.NEVER),
        ("pinned", FollowReal.NEVER),
    ],
)
def test_the_setting(raw: str, policy: FollowReal) -> None:
    assert follow_real_from_env({FOLLOW_REAL_ENV: raw}) is policy


def test_a_bad_setting_is_one_line() -> None:
    with pytest.raises(ValueError, match=f"{FOLLOW_REAL_ENV} must be auto, always"):
        follow_real_from_env({FOLLOW_REAL_ENV: "sometimes"})
