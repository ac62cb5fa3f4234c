"""How a platform says no: one set of errors for every platform, so the reconciler and the
doors answer a refusal the same way whichever platform made it."""

from __future__ import annotations


class PlatformError(Exception):
    """A platform refused a call or could not make it; the message says why, in one line."""


class ObjectNotFound(PlatformError):
    """No such job or pod (any more)."""


class Conflict(PlatformError):
    """The job changed since the version the change was decided on, or a job of that
    name exists."""


class Invalid(PlatformError):
    """The platform refuses what it was given (its schema, a quota, its admission)."""


class Expired(PlatformError):
    """A watch fell behind and events were lost: list again."""


class Unavailable(PlatformError):
    """The platform cannot answer now (away, overloaded, refusing this operator): try
    again later."""


class NotLeader(PlatformError):
    """A write refused because this replica no longer holds the operator's lease: the
    plan it served is left to the leader (its delivery is not committed here)."""


class InvalidJob(ValueError):
    """A job breaks a rule its platform's schema cannot express (min <= replicas <= max,
    a role named in the success policy, ...); the message says which."""


class PlanRejected(ValueError):
    """The plan cannot apply to this job; the message is the result's reason."""
