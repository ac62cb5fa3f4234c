"""The private members of faust, mode and aiokafka that the brain relies on are still
there, with the parameters it calls them with: an upgrade that moves one fails here,
naming it, instead of in a brain that silently stops reading."""

from __future__ import annotations

import inspect
import re
from importlib.metadata import version

import pytest

from streams.brain.runtime import faust_glue
from streams.brain.runtime.faust_glue import RELIES_ON

#: the parameters of the private methods the glue overrides or calls
SIGNATURES = {
    "_create_worker_consumer": ["self", "transport"],
    "_new_consumer_thread": ["self"],
    "_drain_messages": ["self", "fetcher"],
    "_wait_next_records": ["self", "timeout"],
    "_new_transport": ["self"],
    "on_init_dependencies": ["self"],
}


def _set_in_source(owner: type, name: str) -> bool:
    """An attribute assigned on instances (`self.name = ...` / `self.name: T = ...`) by
    some class of `owner`'s MRO, or declared on it."""
    pattern = re.compile(rf"self\.{re.escape(name)}\s*(:[^=\n]*)?=")
    for klass in owner.__mro__:
        if name in getattr(klass, "__annotations__", {}):
            return True
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if pattern.search(source):
            return True
    return False


@pytest.mark.parametrize(
    ("owner", "name"), RELIES_ON, ids=[f"{o.__module__}.{o.__qualname__}.{n}" for o, n in RELIES_ON]
)
def test_a_private_member_the_brain_relies_on_is_there(owner: type, name: str) -> None:
    where = f"{owner.__module__}.{owner.__qualname__}.{name}"
    assert hasattr(owner, name) or _set_in_source(owner, name), (
        f"{where} is gone (faust-streaming {version('faust-streaming')}, aiokafka "
        f"{version('aiokafka')}): streams/brain/runtime/faust_glue.py relies on it"
    )
    if name in SIGNATURES:
        params = list(inspect.signature(getattr(owner, name)).parameters)
        assert params == SIGNATURES[name], f"{where} now takes {params}"


def test_faust_is_the_minor_version_the_glue_was_tested_with() -> None:
    """pyproject.toml pins it; a change of minor version is a change to review here."""
    assert version("faust-streaming").startswith("0.15."), version("faust-streaming")


def test_every_private_member_used_is_listed() -> None:
    """The glue's own source names no private member of faust or aiokafka that
    RELIES_ON does not list (its own names, and dunders, aside)."""
    source = inspect.getsource(faust_glue)
    own = {name for name in vars(faust_glue) if name.startswith("_")}
    used = set(re.findall(r"\.(_[a-z][a-z_]*)\b", source))
    used |= set(re.findall(r"def (_[a-z][a-z_]*)\(", source))
    used |= set(re.findall(r'getattr\([^,]+, "(_[a-z][a-z_]*)"', source))
    listed = {name for _, name in RELIES_ON}
    assert used - own - listed == set(), "private members used but not in RELIES_ON"
