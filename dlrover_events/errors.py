"""Errors a user can act on. The CLI prints these as one line, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake or an unmet precondition the user can fix; the message says how."""


class BusUnavailable(UserError):
    pass


class StoreUnavailable(UserError):
    pass


class EnvError(UserError):
    pass
