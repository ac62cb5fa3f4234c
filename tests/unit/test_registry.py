"""The house's one registry style (dlrover_events/registry.py): every extension point's
registry is one, written out in a registry module, and says what is wrong in one line."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dlrover_events.errors import UserError
from dlrover_events.registry import NameTaken, Registry, UnknownName
from handlers.operator.kube.adapters import ADAPTERS
from handlers.operator.platform.registry import PLATFORMS
from streams.brain.core.optimizers import REGISTRY
from streams.brain.core.schedulers.registry import SCHEDULERS
from streams.evaluators.registry import EVALUATORS
from streams.searcher.core.registry import SEARCHERS


@dataclass(frozen=True)
class Thing:
    name: str


def test_every_registry_of_the_house_is_one_and_read_only() -> None:
    for registry in (REGISTRY, SCHEDULERS, EVALUATORS, PLATFORMS, ADAPTERS, SEARCHERS):
        assert isinstance(registry, Registry)
        assert registry.read_only and len(registry) >= 2
        name = next(iter(registry))
        assert registry[name].name == name  # keyed by the entries' own names
        with pytest.raises(KeyError) as err:
            registry["no-such"]
        assert str(err.value).startswith(f"unknown {registry.kind} 'no-such'; known: ")
        assert "\n" not in str(err.value)


def test_a_user_mistake_on_the_operators_registries_is_a_user_error() -> None:
    for registry in (PLATFORMS, ADAPTERS):
        with pytest.raises(UserError):
            registry["no-such"]


def test_a_registry_refuses_bad_and_taken_names_and_a_copy_takes_more() -> None:
    things = Registry.of("thing", Thing("a"), Thing("b"))
    assert things.names() == ["a", "b"] and dict(things) == {"a": Thing("a"), "b": Thing("b")}
    with pytest.raises(NameTaken, match="read only"):
        things.add(Thing("c"))
    mine = things.copy()
    mine.add(Thing("c"))
    assert "c" in mine and "c" not in things
    with pytest.raises(NameTaken, match="already registered"):
        mine.add(Thing("a"))
    with pytest.raises(NameTaken, match="non-empty, no padding"):
        Registry.of("thing", Thing(" a"))
    with pytest.raises(UnknownName, match="known: none"):
        Registry.of("thing")["x"]
