"""Long-running services (archiver, brain, operator, gateway, ...) and how they are found.

streams/ and handlers/ declare their services as entry points in the group
``dlrover_events.services``; `up` runs them all for the real env. That keeps imports
pointing one way: this package never imports the packages built on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from prometheus_client import CollectorRegistry

from dlrover_events.settings import Settings

SERVICE_GROUP = "dlrover_events.services"
COMMAND_GROUP = "dlrover_events.commands"
BENCH_GROUP = "dlrover_events.benches"


@dataclass
class ServiceContext:
    settings: Settings
    env: str
    pg_dsn: str
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    #: set by a service once it is consuming/serving, so `up` can say "ready".
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    #: what a service serves (name -> address, with a hint), for `up` to print.
    endpoints: dict[str, str] = field(default_factory=dict)
    #: where the service declares its metrics (`dlrover_events.runtime.metrics`); whoever runs
    #: the service serves it (`MetricsServer`)
    metrics: CollectorRegistry = field(
        default_factory=lambda: CollectorRegistry(auto_describe=True)
    )
    #: set while the bus answers: `up`'s supervisor clears it while the broker is away,
    #: so a service's /readyz can say not ready (standalone: always set).
    bus: asyncio.Event = field(default_factory=lambda: _set(asyncio.Event()))


def _set(event: asyncio.Event) -> asyncio.Event:
    event.set()
    return event


@dataclass(frozen=True)
class Service:
    name: str
    description: str
    run: Callable[[ServiceContext], Coroutine[Any, None, None]]
    #: Whether `up` starts it for the real env by default.
    in_up: bool = True


def discover_services() -> dict[str, Service]:
    found: dict[str, Service] = {}
    for ep in entry_points(group=SERVICE_GROUP):
        svc = ep.load()
        if not isinstance(svc, Service):
            raise TypeError(f"entry point {ep.name} ({ep.value}) is not a Service")
        found[svc.name] = svc
    return dict(sorted(found.items()))
