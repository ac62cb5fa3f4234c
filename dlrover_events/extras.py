"""The optional parts of the install (pyproject's extras) that commands check for.

A command that needs an extra says so before it starts anything (a broker, a database, a
line of progress), not midway when the first import of it fails: the user's one line is
then the whole output.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from dlrover_events.errors import MissingExtra


@dataclass(frozen=True)
class Extra:
    name: str
    #: what needs it, as the error names it
    what: str
    #: the top-level modules it installs
    modules: tuple[str, ...]

    def missing(self) -> MissingExtra:
        return MissingExtra(self.name, self.what)

    def require(self) -> None:
        """Raise `MissingExtra` unless every module of the extra can be imported."""
        if any(importlib.util.find_spec(module) is None for module in self.modules):
            raise self.missing()


#: virtual envs' simulated clusters, A/B runs and their report, the Pollux workloads
SIM = Extra(
    "sim",
    "the simulator (virtual envs, A/B runs, Pollux workloads)",
    ("numpy", "scipy", "matplotlib"),
)
