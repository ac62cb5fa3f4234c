"""How every command runs: its coroutine on a fresh event loop (`run_async`), and what
the process exits with (`run_command`): a user's mistake is one line on stderr and exit
code 2, a usage mistake one line naming where to look, only a bug shows a traceback.

Commands (the built-in ones in this package and those streams/ and handlers/ contribute
through entry points) import this module, never `cli.app`: the root imports its commands,
so a command importing the root back would be a cycle.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import typer
from typer._click.exceptions import NoArgsIsHelpError

from dlrover_events.errors import UserError

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine to its end on a new event loop."""
    import asyncio  # (on use: `--help` has no loop to run)

    return asyncio.run(coro)


def run_command(invoke: Callable[[], object]) -> None:
    """Run the command line; return if it succeeded, else exit with what it came to."""
    try:
        invoke()
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except NoArgsIsHelpError as exc:
        # a group named without its command: its help, as `--help` prints it
        typer.echo(exc.format_message(), err=True)
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:
        # Usage mistakes: one line that names the problem, and where to look.
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        typer.echo(f"error: {exc.format_message()}{hint}", err=True)
        sys.exit(exc.exit_code)
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        mistake = settings_mistake(exc)
        if mistake is None:
            raise
        typer.echo(f"error: {mistake}", err=True)
        sys.exit(2)


def settings_mistake(exc: BaseException) -> UserError | None:
    """A service's settings class refusing its variables (a pydantic ValidationError of a
    BaseSettings, such as DLROVER_EVENTS_GATEWAY_PORT=abc) as the one line the user acts
    on; None for any other error (a bug: its traceback is shown)."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return None
    from pydantic_settings import BaseSettings

    from dlrover_events.settings import settings_error

    classes: list[type[BaseSettings]] = [BaseSettings]
    while classes:
        cls = classes.pop()
        if cls.__name__ == exc.title and cls is not BaseSettings:
            return settings_error(exc, str(cls.model_config.get("env_prefix", "")))
        classes.extend(cls.__subclasses__())
    return None
