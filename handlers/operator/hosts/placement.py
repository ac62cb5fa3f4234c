"""Where the hosts platform runs a pod: pure decisions over what the agents said.

A job's pending pods are placed as a gang (all of them on hosts with free slots now, or
none: half a job holds slots and trains nothing), oldest job first, each pod on the live
host with the most free slots that fits it (so a multi-node job spreads over hosts, as its
nodes are meant to). A job that does not fit now waits, and so does every job after it (no
small job overtakes a waiting large one), except one that could never fit on the hosts
there are, which holds up no one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Room:
    """A live host that takes pods, and its slot indexes no pod holds."""

    host: str
    #: every slot it has
    slots: int
    #: the indexes of its slots free now
    free: tuple[int, ...]


@dataclass(frozen=True)
class Wanted:
    """A pending pod: its job (the gang it is placed with), the slots it takes, and its
    age (older jobs first)."""

    pod: str
    job: str
    slots: int
    created: str = ""


@dataclass(frozen=True)
class Placed:
    host: str
    slots: tuple[int, ...]


def never_fits(want: Wanted, rooms: Sequence[Room]) -> bool:
    """Whether no host there is could take the pod even empty."""
    return all(want.slots > r.slots for r in rooms)


def _gang(wants: Sequence[Wanted], free: dict[str, list[int]]) -> dict[str, Placed] | None:
    """Every pod of one gang placed on ``free`` (taken from it), or None (``free`` untouched)."""
    trial = {h: list(s) for h, s in free.items()}
    out: dict[str, Placed] = {}
    for want in sorted(wants, key=lambda w: (-w.slots, w.pod)):
        fits = [h for h, s in trial.items() if len(s) >= want.slots]
        if not fits:
            return None
        host = min(fits, key=lambda h: (-len(trial[h]), h))
        taken, trial[host] = trial[host][: want.slots], trial[host][want.slots :]
        out[want.pod] = Placed(host, tuple(taken))
    free.clear()
    free.update(trial)
    return out


def place(pending: Sequence[Wanted], rooms: Sequence[Room]) -> dict[str, Placed]:
    """The pods to place now and where (see the module): a function of its inputs."""
    free = {r.host: sorted(r.free) for r in rooms}
    gangs: dict[str, list[Wanted]] = {}
    for want in pending:
        gangs.setdefault(want.job, []).append(want)
    order = sorted(gangs, key=lambda j: (min(w.created for w in gangs[j]), j))
    placed: dict[str, Placed] = {}
    for job in order:
        wants = gangs[job]
        if any(never_fits(w, rooms) for w in wants):
            continue
        got = _gang(wants, free)
        if got is None:
            break
        placed.update(got)
    return placed


def free_slots(
    holding: Sequence[tuple[str, Sequence[int]]], slots: Mapping[str, Sequence[int]]
) -> dict[str, tuple[int, ...]]:
    """Each host's free slot indexes: those it has (``slots``) that no pod holds
    (``holding``: (host, indexes) per pod that holds slots)."""
    used: dict[str, set[int]] = {h: set() for h in slots}
    for host, indexes in holding:
        used.setdefault(host, set()).update(indexes)
    return {h: tuple(i for i in sorted(have) if i not in used[h]) for h, have in slots.items()}


__all__ = ["Placed", "Room", "Wanted", "free_slots", "never_fits", "place"]
