"""The one registry style of the house: things of one kind, by name, written out in one
module beside the contract they keep.

Optimizers, cluster schedulers, evaluators, platforms and the Kubernetes platform's
workload adapters are each a ``Registry`` built in a registry module from the entries
themselves (``Registry.of(kind, *entries)``): nothing registers by being imported, so what
exists is read in one place, in the order it is written, and a contract module never
imports what implements it. A lookup of a name nobody registered raises the kind's own
error (a ``KeyError``, as a mapping's is) whose message names the known ones, in one line,
for the CLI to show as it is.

A registry is read-only as built. A user's own entries go on a ``copy`` (writable), which
is handed to whatever takes a registry, so the house's registry never changes under
another reader.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, Protocol, Self, TypeVar


class Named(Protocol):
    """An entry of a registry: it knows its own name."""

    @property
    def name(self) -> str: ...


E = TypeVar("E", bound=Named)


class UnknownName(KeyError):
    """A name nobody registered under a registry's kind; the message names the known ones.
    Each kind may give its own subclass (``UnknownOptimizer``, ``UnknownScheduler``...)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NameTaken(ValueError):
    """An entry a registry refuses: an empty or padded name, or one already registered."""


class Registry(Mapping[str, E], Generic[E]):
    """Entries of one kind by name (a ``Mapping``), read-only as ``of`` builds it."""

    def __init__(
        self,
        kind: str,
        entries: Iterable[E] = (),
        *,
        unknown: type[KeyError] = UnknownName,
        taken: type[ValueError] = NameTaken,
        read_only: bool = False,
    ) -> None:
        self.kind = kind
        self.unknown = unknown
        self.taken = taken
        self._entries: dict[str, E] = {}
        self.read_only = False
        for entry in entries:
            self.add(entry)
        self.read_only = read_only

    @classmethod
    def of(
        cls,
        kind: str,
        *entries: E,
        unknown: type[KeyError] = UnknownName,
        taken: type[ValueError] = NameTaken,
    ) -> Self:
        """A read-only registry of ``entries`` (``taken`` on a bad or repeated name)."""
        return cls(kind, entries, unknown=unknown, taken=taken, read_only=True)

    def add(self, entry: E) -> None:
        """Register ``entry`` on a writable registry (a ``copy``)."""
        name = entry.name
        if self.read_only:
            raise self.taken(
                f"cannot register {name!r}: this registry is read only (register on a copy)"
            )
        if not name or name != name.strip():
            raise self.taken(f"{self.kind} name {name!r} must be non-empty, no padding")
        if name in self._entries:
            raise self.taken(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry

    def copy(self) -> Self:
        """A writable registry of the same entries, for a user's own beside them."""
        return type(self)(self.kind, self._entries.values(), unknown=self.unknown, taken=self.taken)

    def __getitem__(self, name: str) -> E:
        """The entry registered as ``name``; the kind's unknown error naming the known
        ones otherwise."""
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self.names()) or "none"
            raise self.unknown(f"unknown {self.kind} {name!r}; known: {known}") from None

    def get(self, name: str, default: E | None = None) -> E | None:  # type: ignore[override]
        """The entry, or ``default``: one dict lookup (the brain asks per decision)."""
        return self._entries.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"

    def names(self) -> list[str]:
        return sorted(self._entries)


__all__ = ["NameTaken", "Named", "Registry", "UnknownName"]
