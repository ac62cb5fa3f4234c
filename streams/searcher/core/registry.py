"""The searchers by name: the one registry the searcher's runtime, the CLI (``experiment
searchers``, and the check of a document's ``searcher.name`` where it enters) and the
tests read. Apart from the package, so that importing the contract (``api.py``) never
loads the searchers themselves.

A user's own searcher goes on a copy (``SEARCHERS.copy()``, then ``add``), handed to
``begin``, ``decide`` and ``ExperimentState.from_json`` as ``searchers=``.
"""

from __future__ import annotations

from typing import Any

from dlrover_events.registry import Registry
from streams.searcher.core.api import Searcher, UnknownSearcher
from streams.searcher.core.asha import AshaSearcher
from streams.searcher.core.grid import GridSearcher
from streams.searcher.core.random import RandomSearcher

SEARCHERS: Registry[Searcher[Any]] = Registry.of(
    "searcher",
    GridSearcher(),
    RandomSearcher(),
    AshaSearcher(),
    unknown=UnknownSearcher,
)


def get_searcher(name: str) -> Searcher[Any]:
    """The registered searcher; a one-line UnknownSearcher (a KeyError) naming the known
    ones otherwise."""
    return SEARCHERS[name]


def describe_searchers(
    searchers: Registry[Searcher[Any]] = SEARCHERS,
) -> list[tuple[str, str]]:
    """Each searcher's name and one-line description, by name: what ``experiment
    searchers`` prints."""
    return [(name, searchers[name].description) for name in searchers.names()]


__all__ = ["SEARCHERS", "describe_searchers", "get_searcher"]
