"""The brain's policy as its env's settings say now: `env settings` reaches a running
brain without a restart.

The brain reads its env's settings from the registry when it starts, then follows the
env's announcements on ``dlrover.control`` (`dlrover_events.envs.control.SettingsFollower`).
A newer settings version is made into a Policy here (the same `Policy.from_settings` the
start uses, so the same checks) and handed to the running brain, which decides its next
batch with it: the decision core stays pure, only the policy object it is given changes.

What a change does to what is in flight:

- limits, optimizers and their parameters, decision cadence, cluster GPUs, retention,
  and a cluster scheduler's name, parameters, cluster or interval (a scheduler staying
  on): taken between two batches; the next decision uses them. Plans already published
  stay as they are; the operator applies them, and the brain folds what it applied. A
  new scheduler starts from what every job holds now (its share, as the old one left
  it), and its first round comes at the next interval boundary or arrival.
- a scheduler turned on or off, or lockstep changed: who decides the env changes (one
  leader over every partition, or the consumer group's members), so the brain hands its
  partitions over checkpointed and starts deciding again under the new policy (`regroup`
  is set; `streams.brain.runtime.app.run` does it), as a restart would, within the same process.
- a version the brain cannot run with (only an older CLI or a hand-edited registry can
  store one): not taken; the brain says why in an ERROR and goes on with the version it
  has.

Events decided again after a crash (those after the last checkpoint) are decided with
the settings in force when they are decided again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from dlrover_events.envs.control import SettingsFollower
from dlrover_events.envs.env_settings import parse_settings
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.settings import Settings
from schemas.control import EnvAnnouncement
from streams.brain.core.policy import Policy

log = logging.getLogger(__name__)


def settings_policy(raw: object) -> Policy:
    """The policy a stored settings document asks for; ValueError or UserError (one
    line, naming the setting) when it cannot be run with."""
    if not isinstance(raw, dict):
        raise ValueError(f"env settings must be a mapping, not {type(raw).__name__}")
    return Policy.from_settings(parse_settings(raw).brain)


async def env_policy(settings: Settings, pg_dsn: str, env: str) -> tuple[Policy, int]:
    """The policy the env's settings ask for, and their version, the env's tables
    migrated first (an env made by an older version gets the tables this brain
    writes); a misconfigured env is a UserError of one line."""
    record = await EnvRegistry(settings, pg_dsn).migrate(env)
    if record is None:
        return Policy(), 0
    try:
        return settings_policy(record.settings), record.settings_version
    except (ValueError, UserError) as exc:
        raise UserError(f"env {env!r}: {exc}") from None


class LivePolicy:
    """The policy now, and whoever decides with it (`attach`)."""

    def __init__(self, settings: Settings, env: str, policy: Policy, version: int) -> None:
        self.env = env
        self.policy = policy
        #: the settings version `policy` comes from
        self.version = version
        #: set when a change cannot be taken between two batches (see the module)
        self.regroup = asyncio.Event()
        self._use: Callable[[Policy], None] | None = None
        self._follower = SettingsFollower(settings, env, version, self._announced)

    @classmethod
    async def open(cls, settings: Settings, pg_dsn: str, env: str) -> LivePolicy:
        policy, version = await env_policy(settings, pg_dsn, env)
        return cls(settings, env, policy, version)

    def attach(self, use: Callable[[Policy], None] | None) -> None:
        """Hand each policy taken from now on to `use` (None: to nobody)."""
        self._use = use

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the env's settings until `stop` (or cancelled)."""
        await self._follower.run(stop)

    def _announced(self, announced: EnvAnnouncement) -> None:
        version = announced.settings_version
        try:
            policy = settings_policy(announced.settings)
        except (ValueError, UserError) as exc:
            log.error(
                "env %s: its brain does not take settings version %d (%s); it goes on "
                "with version %d",
                self.env,
                version,
                exc,
                self.version,
            )
            return
        before, self.policy, self.version = self.policy, policy, version
        if self.regroup.is_set():
            return  # the brain that decides next starts with it
        if before.regroups(policy):
            log.warning(
                "env %s: settings version %d %s; its brain hands its partitions over and "
                "starts deciding again under them",
                self.env,
                version,
                _regroup_reason(before, policy),
            )
            self.regroup.set()
            return
        log.info(
            "env %s: its brain decides with settings version %d from now on", self.env, version
        )
        if self._use is not None:
            self._use(policy)


def _regroup_reason(before: Policy, after: Policy) -> str:
    if before.scheduler is None and after.scheduler is not None:
        return f"turn the cluster scheduler {after.scheduler.name} on"
    if before.scheduler is not None and after.scheduler is None:
        return f"turn the cluster scheduler {before.scheduler.name} off"
    return f"turn lockstep {'on' if after.settings.lockstep else 'off'}"


__all__ = ["LivePolicy", "env_policy", "settings_policy"]
