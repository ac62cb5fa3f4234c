"""What an in-place member is told by its platform (``dlrover_events.sdk.torch.inplace``):
where the job's membership store is, whether this process hosts it, how many members the
first generation waits for, and the role's timing. One frozen value, read from the
environment once, so every part of the group reads the same settings and a test can make
them without an environment. Torch is not imported here: the settings are plain data."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dlrover_events.sdk.identity import (
    ELASTIC_EXPECT_ENV,
    ELASTIC_STORE_ENV,
    ELASTIC_STORE_HOST_ENV,
    ROLE_ENV,
)

#: Seconds a first generation waits for the members it expects before it forms with those
#: that came (the others join it in place).
SETTLE_ENV = "DLROVER_EVENTS_ELASTIC_SETTLE_S"
#: Seconds a collective, a group's formation or a read of the store may take: a member
#: lost without closing its connections is noticed after this long.
TIMEOUT_ENV = "DLROVER_EVENTS_ELASTIC_TIMEOUT_S"
#: Seconds after the first SIGTERM of a resize within which every member that gets one
#: leaves in the same generation (``membership.gather_wait``). The same for every member
#: of a role: whether to take the check again is decided from the agreed check.
GATHER_ENV = "DLROVER_EVENTS_ELASTIC_GATHER_S"
DEFAULT_SETTLE_S = 30.0
DEFAULT_GATHER_S = 0.1
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class InPlaceSettings:
    """An in-place member's settings (the variables the platform sets, see the module).

    ``backend`` None picks nccl when CUDA is there, gloo otherwise (decided by the group,
    which imports torch). ``check_every``: the boundary check's collective runs every that
    many steps. ``recover_window_s``: after a lost peer, how long the first survivor waits
    for another survivor to register before it decides without the rest."""

    store_host: str
    store_port: int
    hosts_store: bool
    role: str = "worker"
    backend: str | None = None
    expect: int = 1
    settle_s: float = DEFAULT_SETTLE_S
    gather_s: float = DEFAULT_GATHER_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    check_every: int = 1
    recover_window_s: float = 1.0

    def __post_init__(self) -> None:
        if self.check_every < 1 or self.expect < 1 or self.timeout_s <= 0 or self.gather_s < 0:
            raise ValueError("check_every and expect must be >= 1, timeout_s > 0, gather_s >= 0")

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> InPlaceSettings | None:
        """The settings the platform gave this process, None when it is not in-place (no
        DLROVER_EVENTS_ELASTIC_STORE). ``overrides`` (the fields but the store's address)
        win over the environment, which is then not read for them."""
        env = os.environ if environ is None else environ
        addr = env.get(ELASTIC_STORE_ENV, "").strip()
        if not addr:
            return None
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{ELASTIC_STORE_ENV} must be host:port, got {addr!r}")
        unknown = set(overrides) - OVERRIDABLE
        if unknown:
            raise TypeError(f"not an in-place setting: {', '.join(sorted(unknown))}")
        read = {
            "hosts_store": lambda: env.get(ELASTIC_STORE_HOST_ENV) == "1",
            "expect": lambda: int(env.get(ELASTIC_EXPECT_ENV) or 1),
            "settle_s": lambda: float(env.get(SETTLE_ENV) or DEFAULT_SETTLE_S),
            "gather_s": lambda: float(env.get(GATHER_ENV) or DEFAULT_GATHER_S),
            "timeout_s": lambda: float(env.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S),
            "role": lambda: env.get(ROLE_ENV) or "worker",
        }
        values: dict[str, Any] = dict(overrides)
        for name, value in read.items():
            if name not in values:
                values[name] = value()
        return cls(host, int(port), **values)


#: The fields ``from_env`` takes as overrides: all but the store's address.
OVERRIDABLE = frozenset(f.name for f in dataclasses.fields(InPlaceSettings)) - {
    "store_host",
    "store_port",
}


__all__ = [
    "DEFAULT_GATHER_S",
    "DEFAULT_SETTLE_S",
    "DEFAULT_TIMEOUT_S",
    "GATHER_ENV",
    "OVERRIDABLE",
    "SETTLE_ENV",
    "TIMEOUT_ENV",
    "InPlaceSettings",
]
