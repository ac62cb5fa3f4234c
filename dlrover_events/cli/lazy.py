"""Commands loaded on use: a group that knows its commands' names and what each is for
without importing them, and imports one only when it runs (or its own help is asked).

`dlrover-events --help` then costs a look at the entry points, not the import of every
command's dependencies (faust, kubernetes_asyncio, asyncpg, scipy...). A command is named
by ``"module:attribute"``: a `typer.Typer` (a group of commands), a function (one command,
typer-style) or a click command; its short help comes from a table (the root's), which
tests/unit/test_cli_start.py checks against the loaded commands.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from difflib import get_close_matches
from types import MappingProxyType
from typing import Any

import typer
from typer._click.core import Command, Context
from typer._click.exceptions import UsageError
from typer._click.formatting import HelpFormatter
from typer._click.shell_completion import CompletionItem
from typer._click.utils import make_default_short_help
from typer.core import TyperGroup
from typer.models import CommandInfo, TyperInfo

from dlrover_events.cli.params import readable_metavars


@dataclass(frozen=True)
class Lazy:
    """A command not imported yet: where it is, and its short help (the first sentence
    of its help, as `--help` lists it)."""

    target: str
    help: str = ""


def as_click(obj: Any, name: str) -> Command:
    """A loaded command (typer app, typer-style function or click command) as click's,
    formatted as the root formats (no rich markup), its metavars readable.

    (typer 0.29 carries its own click, `typer._click`: its commands are of that one.)"""
    if isinstance(obj, Command):
        command = obj
    elif isinstance(obj, typer.Typer):
        command = typer.main.get_group_from_info(
            TyperInfo(obj, name=name),
            pretty_exceptions_short=True,
            suggest_commands=True,
            rich_markup_mode=None,
        )
    elif callable(obj):
        command = typer.main.get_command_from_info(
            CommandInfo(name=name, callback=obj),
            pretty_exceptions_short=True,
            rich_markup_mode=None,
        )
    else:
        raise TypeError(f"command {name}: {obj!r} is no typer app, function or click command")
    _readable(command)
    return command


def _readable(command: Command) -> None:
    readable_metavars(command.params)
    for sub in getattr(command, "commands", {}).values():
        _readable(sub)


def load(name: str, lazy: Lazy) -> Command:
    module, _, attribute = lazy.target.partition(":")
    return as_click(getattr(importlib.import_module(module), attribute), name)


class LazyGroup(TyperGroup):
    """A typer group whose commands (beyond those added to it) are `Lazy` until used.

    ``lazy`` maps names to commands not loaded yet; ``find`` (called at most once, and only
    when a name is not in ``lazy``) gives more of them, such as those of entry points.
    """

    lazy: Mapping[str, Lazy] = MappingProxyType({})
    find: Callable[[], Mapping[str, Lazy]] | None = None

    def _found(self) -> Mapping[str, Lazy]:
        if self.find is not None:
            self.lazy = {**self.find(), **self.lazy}
            self.find = None
        return self.lazy

    def list_commands(self, ctx: Context) -> list[str]:
        return sorted({*self.commands, *self._found()})

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        lazy = self.lazy.get(cmd_name) or self._found().get(cmd_name)
        if lazy is None:
            return None
        command = load(cmd_name, lazy)
        self.add_command(command, cmd_name)
        return command

    def summary(self, name: str, limit: int = 45) -> str:
        """What `name` is for, from the table when it is not loaded (nothing imported)."""
        if name in self.commands:
            return self.commands[name].get_short_help_str(limit)
        return make_default_short_help(self._found()[name].help, limit)

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        names = [n for n in self.list_commands(ctx) if not self._hidden(n)]
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        with formatter.section("Commands"):
            formatter.write_dl([(n, self.summary(n, limit)) for n in names])

    def _hidden(self, name: str) -> bool:
        return name in self.commands and self.commands[name].hidden

    def shell_complete(self, ctx: Context, incomplete: str) -> list[CompletionItem]:
        """Command names (with their help from the table: nothing imported), then options."""
        results = [
            CompletionItem(n, help=self.summary(n))
            for n in self.list_commands(ctx)
            if n.startswith(incomplete) and not self._hidden(n)
        ]
        results.extend(Command.shell_complete(self, ctx, incomplete))
        return results

    def resolve_command(
        self, ctx: Context, args: list[str]
    ) -> tuple[str | None, Command | None, list[str]]:
        try:
            return self._click_resolve_command(ctx, args)
        except UsageError as err:
            matches = get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if matches:
                err.message = f"{err.message.rstrip('.')}. Did you mean {matches[0]!r}?"
            raise


__all__ = ["Lazy", "LazyGroup", "as_click", "load"]
