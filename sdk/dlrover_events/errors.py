"""Errors a user can act on. The CLI prints these as one line, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake or an unmet precondition the user can fix; the message says how."""


class BusUnavailable(UserError):
    """The bus does not answer: time may mend it (a service waits and tries again)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        #: what the client met (a refused connection, a timeout), without the advice
        self.reason = reason or message


class BusRefused(UserError):
    """The bus answers but refuses this client (TLS, SASL): only new settings mend it."""


class MissingExtra(UserError):
    """A part of the install that this needs is an extra that was not installed."""

    def __init__(self, extra: str, what: str) -> None:
        super().__init__(f"{what} needs the `{extra}` extra: pip install 'dlrover-events[{extra}]'")
        self.extra = extra


class StoreUnavailable(UserError):
    pass


class EnvError(UserError):
    pass


class TopicsMissing(UserError):
    """An env's topics are not there and this process may not create them."""
