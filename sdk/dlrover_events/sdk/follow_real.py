"""Which env a running job reports to after ``dlrover-events env promote`` (pure).

The operator of the real env starts a job's pods with ``DLROVER_EVENTS_ENV`` set to that
env. When a standby env is promoted, the brain that acts on the cluster is the new real
env's, so the job's samples must go there from then on, or the new brain decides blind.
A job that a user pinned on purpose to an env (a virtual one, for a test) must stay where
it was put. The reporter cannot tell the two apart from the variable alone, so it asks
``dlrover.control`` once it can read it: a job whose env is the real env then follows the
real env; any other env stays pinned. ``DLROVER_EVENTS_FOLLOW_REAL`` overrides that guess.
(The SDK's other follower, ``follow_plan``, follows the job's own plan at the gateway.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

FOLLOW_REAL_ENV = "DLROVER_EVENTS_FOLLOW_REAL"


class FollowReal(StrEnum):
    #: follow the real env if the job's env is the real one when the reporter first learns
    #: which env is real; otherwise stay pinned.
    AUTO = "auto"
    #: always report to whatever env is real.
    ALWAYS = "always"
    #: never switch: the job's env is pinned.
    NEVER = "never"


_SPELLINGS = {
    "": FollowReal.AUTO,
    "auto": FollowReal.AUTO,
    "always": FollowReal.ALWAYS,
    "true": FollowReal.ALWAYS,
    "1": FollowReal.ALWAYS,
    "never": FollowReal.NEVER,
    "false": FollowReal.NEVER,
    "0": FollowReal.NEVER,
    "pinned": FollowReal.NEVER,
}


def follow_real_from_env(environ: Mapping[str, str] | None = None) -> FollowReal:
    raw = (os.environ if environ is None else environ).get(FOLLOW_REAL_ENV, "")
    try:
        return _SPELLINGS[raw.strip().lower()]
    except KeyError:
        raise ValueError(
            f"{FOLLOW_REAL_ENV} must be auto, always (true) or never (false), got {raw!r}"
        ) from None


@dataclass(frozen=True)
class Following:
    """Where the reporter stands: its env, and whether it follows the real one.

    ``following`` is None while undecided (AUTO before the real env is known).
    """

    env: str
    following: bool | None

    @classmethod
    def start(cls, env: str, policy: FollowReal) -> Following:
        decided = {FollowReal.AUTO: None, FollowReal.ALWAYS: True, FollowReal.NEVER: False}
        return cls(env, decided[policy])

    @property
    def settled(self) -> bool:
        """Pinned for good: nothing announced later can move it."""
        return self.following is False

    def seen(self, real: str | None) -> Following:
        """The state after learning that ``real`` is the real env (None: none is, now).

        Between the demotion of the old real env and the promotion of the new one there
        may be a moment with no real env: the job stays where it is meanwhile.
        """
        if real is None:
            return self
        if self.following is None:
            return Following(self.env, real == self.env)
        if self.following:
            return Following(real, True)
        return self
