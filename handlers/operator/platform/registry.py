"""Which platforms exist and where their operator and `job` doors are: one explicit table,
imported lazily so a process on one platform never loads another's client.

A platform is a row of ``PLATFORMS``: where its operator runs from, where the `job`
commands, the jobs API and the console open its jobs, and how a submission is checked
before it is made (``check_operator``: is anything there to start it?). The doors read
these rows and never branch on a platform's name; a new platform (its package beside
kube/ and local/) is a new row, and the conformance suite (tests/contract/) proves it keeps
the contract of handlers.operator.platform.api.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from dlrover_events.errors import UserError
from dlrover_events.registry import Registry, UnknownName

_S = TypeVar("_S", bound=BaseModel)


class UnknownPlatform(UserError, UnknownName):
    """A platform name nobody registered (`--platform`, the operator's settings)."""


@dataclass(frozen=True)
class NoOptions:
    """The doors' options of a platform that takes none (the local platform: its jobs are
    found by the env alone)."""


@dataclass(frozen=True)
class ClusterOptions:
    """The doors' options of a Kubernetes cluster, as kubectl takes them."""

    #: default: $KUBECONFIG, ~/.kube/config, else in-cluster
    kubeconfig: Path | None = None
    #: default: the context's
    namespace: str | None = None


class NotAnOption(UserError):
    """An option given for a platform that takes no such option (--kubeconfig with the local
    platform)."""


@dataclass(frozen=True)
class PlatformEntry:
    """Where a platform's doors are, as "module:function": imported only once chosen, so a
    process on the local platform never loads a Kubernetes client, and a virtual env's
    operator neither platform."""

    #: how users and settings name it (`--platform local`)
    name: str
    #: its operator: (ServiceContext, options) -> runs until the context's stop
    operator: str
    #: its jobs for the `job` commands: (Settings, env, options) -> an async context
    #: manager of a Platform
    jobs: str
    #: (Settings, env, options) -> awaitable; raises UserError, in one line, when nothing
    #: would start a job submitted now (no operator runs the env, a stale Lease)
    check_operator: str
    #: whether its jobs belong to an env (the local platform keeps each env's apart); a
    #: cluster's jobs are the cluster's, whichever env's operator reconciles them
    env_scoped: bool
    #: whether a submitted job's commands run in the submitter's working directory (a
    #: platform of this machine's processes), which the submission then records
    runs_in_workdir: bool
    #: what its doors take besides the env (``jobs`` and ``check_operator`` get an instance)
    options: type[Any] = NoOptions

    def options_of(self, **given: Any) -> Any:
        """The platform's options from what a door was given (None: not given); an option
        the platform does not take, given, is a one-line NotAnOption."""
        known = {f.name for f in fields(self.options)}
        for key, value in given.items():
            if value is not None and key not in known:
                flag = "--" + key.replace("_", "-")
                raise NotAnOption(f"the {self.name} platform takes no {flag}")
        return self.options(**{k: v for k, v in given.items() if k in known})

    def load(self, door: str) -> Any:
        """The object a "module:function" door names, its module imported now."""
        module, _, name = door.partition(":")
        return getattr(importlib.import_module(module), name)


def operator_settings(model: type[_S], options: Mapping[str, Any], platform: str) -> _S:
    """A platform operator's settings from its options (``platform`` itself among them): an
    option it does not take, or a bad value, is one UserError that names the ones it does."""
    known = set(model.model_fields)
    unknown = sorted(set(options) - known - {"platform"})
    if unknown:
        raise UserError(
            f"option(s) {', '.join(unknown)} do not apply to the {platform} platform; it "
            f"takes: {', '.join(sorted(known))}"
        )
    try:
        return model(**{k: v for k, v in options.items() if k in known})
    except ValidationError as e:
        first = e.errors()[0]
        raise UserError(f"{platform} platform option {first['loc'][0]}: {first['msg']}") from None


#: platform name -> its entry. Add a platform here (and its package beside kube/ and local/).
PLATFORMS: Registry[PlatformEntry] = Registry.of(
    "platform",
    PlatformEntry(
        name="kubernetes",
        operator="handlers.operator.kube.runner:run",
        jobs="handlers.operator.kube.jobs:open_jobs",
        check_operator="handlers.operator.kube.jobs:check_operator",
        env_scoped=False,
        runs_in_workdir=False,
        options=ClusterOptions,
    ),
    PlatformEntry(
        name="local",
        operator="handlers.operator.local.runner:run",
        jobs="handlers.operator.local.jobs:open_jobs",
        check_operator="handlers.operator.local.jobs:check_operator",
        env_scoped=True,
        runs_in_workdir=True,
    ),
    PlatformEntry(
        name="hosts",
        operator="handlers.operator.hosts.runner:run",
        jobs="handlers.operator.hosts.jobs:open_jobs",
        check_operator="handlers.operator.hosts.jobs:check_operator",
        env_scoped=True,
        runs_in_workdir=True,
    ),
    unknown=UnknownPlatform,
)
DEFAULT_PLATFORM = "kubernetes"
