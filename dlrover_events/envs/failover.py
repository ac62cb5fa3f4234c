"""The real/standby switch as the install sees it (pure): which env is the watchdog's
standby, whether `up` must make it, what role each env has now, and the last switch.

The standby is the install's choice (DLROVER_EVENTS_WATCHDOG_STANDBY, the variable the
watchdog, `bootstrap` and `up` read), not a mode of the registry: the registry knows only
real and virtual. Reading it here keeps that one spelling in one place for the core, which
does not import the watchdog's package (streams).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from schemas.control import EnvMode

#: the watchdog's standby env (streams.evaluators.watchdog.WatchdogSettings.standby)
STANDBY_VARIABLE = "DLROVER_EVENTS_WATCHDOG_STANDBY"


class Role(StrEnum):
    """What an env is to the install now."""

    #: its operator acts on the platform
    REAL = "real"
    #: the virtual env the watchdog promotes when the real env fails too many jobs
    STANDBY = "standby"
    VIRTUAL = "virtual"


def standby_name(environ: Mapping[str, str] | None = None) -> str | None:
    """The watchdog's standby, or None when failover is off."""
    raw = (os.environ if environ is None else environ).get(STANDBY_VARIABLE, "")
    return raw.strip() or None


def role(name: str, mode: EnvMode, standby: str | None) -> Role:
    """The real env is real even when it is the standby named (after a failover)."""
    if mode == EnvMode.REAL:
        return Role.REAL
    return Role.STANDBY if name == standby else Role.VIRTUAL


@dataclass(frozen=True)
class StandbyToMake:
    """The standby `up` makes: virtual, with the real env's settings as stored now."""

    name: str
    settings: dict[str, Any]


def standby_to_make(
    standby: str | None, real: str, real_settings: Mapping[str, Any], existing: Iterable[str]
) -> StandbyToMake | None:
    """None when there is nothing to make: no standby named, the standby is the real env
    (it took over before), or it exists (whatever its settings: changed since, they stay)."""
    if not standby or standby == real or standby in set(existing):
        return None
    return StandbyToMake(standby, dict(real_settings))


@dataclass(frozen=True)
class Switch:
    """A promotion, as the registry's history keeps it."""

    at: datetime
    #: the env that became real
    to: str
    #: the env that was real before (None: there was none)
    came_from: str | None
    reason: str

    def line(self) -> str:
        was = f" (was {self.came_from})" if self.came_from else ""
        why = self.reason or "no reason given"
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.to} became the real env{was}: {why}"

    def as_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "to": self.to,
            "from": self.came_from,
            "reason": self.reason,
        }


def last_switch(changes: Sequence[Mapping[str, Any]]) -> Switch | None:
    """The latest promotion of the history (`EnvRegistry.changes`, oldest first). A promote
    and the demote of the same transaction share their reason and time; the demote is
    written first, at the same time (the transaction's)."""
    for i in range(len(changes) - 1, -1, -1):
        change = changes[i]
        if change["change"] != "promote":
            continue
        before = changes[i - 1] if i > 0 else None
        came_from = (
            str(before["name"])
            if before is not None
            and before["change"] == "demote"
            and before["reason"] == change["reason"]
            and before["changed_at"] == change["changed_at"]
            else None
        )
        return Switch(change["changed_at"], str(change["name"]), came_from, str(change["reason"]))
    return None


__all__ = [
    "STANDBY_VARIABLE",
    "Role",
    "StandbyToMake",
    "Switch",
    "last_switch",
    "role",
    "standby_name",
    "standby_to_make",
]
