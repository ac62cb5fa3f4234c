"""The searchers' registry: what ``experiment searchers`` lists, and a name nobody
registered said in one line."""

from __future__ import annotations

import pytest

from dlrover_events.registry import Registry
from streams.searcher.core.api import Searcher, UnknownSearcher
from streams.searcher.core.registry import SEARCHERS, describe_searchers, get_searcher


def test_the_registry_names_grid_random_and_asha_with_one_line_each() -> None:
    assert isinstance(SEARCHERS, Registry) and SEARCHERS.read_only
    listed = describe_searchers()
    assert [name for name, _ in listed] == ["asha", "grid", "random"]
    for name, description in listed:
        assert isinstance(get_searcher(name), Searcher) and get_searcher(name).name == name
        assert description and "\n" not in description and len(description) < 200


def test_an_unknown_searcher_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(UnknownSearcher) as err:
        get_searcher("bayes")
    assert isinstance(err.value, KeyError)
    assert str(err.value) == "unknown searcher 'bayes'; known: asha, grid, random"
