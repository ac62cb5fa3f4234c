"""The Experiment custom resource (deploy/crds/experiments.yaml), pure: what the operator
does with one it sees, the events it publishes for it, the patches it writes back, and
the owner reference of its trials' jobs. The I/O is experiments.py's.

An Experiment is submitted once per resource uid, and its deletion kills the experiment
even when the operator was away at the time. Both hang on what the resource itself
records, so any operator replica, restarted at any point, decides the same:

- a new Experiment gets the operator's finalizer first, then its ExperimentSubmitted is
  published (its event id derived from the env and the uid), then ``status.submittedUid``
  says so. Killed between the last two, the operator publishes the same event again (the
  same id; the searcher ignores an experiment submitted again under its name);
- a deleted Experiment that still has the finalizer gets its ExperimentAction kill
  published (its id derived from the uid too), then the finalizer removed, which lets
  Kubernetes delete it. The kill's effect (each trial stopped, its job deleted) is the
  searcher's; the trials' ownerReferences let a garbage collector delete what is left.

A spec the contract refuses is said in the status (phase Invalid, the field named in the
message) and never published; it gets no finalizer.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dlrover_events.experiments.document import ExperimentInvalid, experiment_document
from handlers.operator.platform.bodies import DOMAIN
from schemas.experiments import (
    ExperimentAction,
    ExperimentActionKind,
    ExperimentDocument,
    ExperimentSubmitted,
)

GROUP = DOMAIN
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Experiment"
PLURAL = "experiments"
#: Held by the operator on every Experiment it submitted, until its kill is on the bus.
FINALIZER = f"{DOMAIN}/experiment"
#: The label the searcher puts on each trial's job: the experiment it is a trial of.
EXPERIMENT_LABEL = f"{DOMAIN}/experiment"
#: Why the operator acts, as its events and the status say it.
KILL_REASON = "the Experiment resource was deleted"

_EVENTS = uuid.UUID("5c0f7d7e-2a59-4d8e-8a55-8e4b9f61a0c3")


class Phase(StrEnum):
    """status.phase (the CRD's enum)."""

    INVALID = "Invalid"
    SUBMITTED = "Submitted"
    RUNNING = "Running"
    PAUSED = "Paused"
    DONE = "Done"
    KILLED = "Killed"
    REFUSED = "Refused"


@dataclass(frozen=True)
class Resource:
    """What the operator reads of an Experiment."""

    name: str
    uid: str
    generation: int
    resource_version: str
    finalizers: tuple[str, ...]
    deleting: bool
    status: Mapping[str, Any]
    raw: Mapping[str, Any]

    @property
    def submitted(self) -> bool:
        """Its ExperimentSubmitted is on the bus (the status says so, for this uid)."""
        return bool(self.uid) and self.status.get("submittedUid") == self.uid

    @property
    def held(self) -> bool:
        return FINALIZER in self.finalizers


def read(obj: Mapping[str, Any]) -> Resource:
    meta = obj.get("metadata") or {}
    status = obj.get("status")
    return Resource(
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        generation=int(meta.get("generation") or 0),
        resource_version=str(meta.get("resourceVersion") or ""),
        finalizers=tuple(str(f) for f in meta.get("finalizers") or ()),
        deleting=bool(meta.get("deletionTimestamp")),
        status=status if isinstance(status, Mapping) else {},
        raw=obj,
    )


def document(res: Resource) -> ExperimentDocument | str:
    """The resource as the contract's document, or why it is not one: one line naming
    the field, in the words every door of experiments uses (dlrover_events.experiments).
    The searcher's name is left to the searcher, whose registry this side cannot read."""
    body = {
        "apiVersion": res.raw.get("apiVersion") or API_VERSION,
        "kind": res.raw.get("kind") or KIND,
        "metadata": {"name": res.name},
        "spec": res.raw.get("spec"),
    }
    try:
        return experiment_document(body)
    except ExperimentInvalid as e:
        return str(e)


class Step(StrEnum):
    """What an Experiment needs of the operator now."""

    NOTHING = "nothing"
    #: say in the status why its spec is refused
    INVALID = "invalid"
    #: hold it (the finalizer), publish it, say so in the status
    SUBMIT = "submit"
    #: publish its kill, then let it go (remove the finalizer)
    KILL = "kill"


def step(res: Resource) -> tuple[Step, ExperimentDocument | str | None]:
    """The step, with the document (SUBMIT) or the refusal (INVALID)."""
    if res.deleting:
        return (Step.KILL, None) if res.held else (Step.NOTHING, None)
    if res.submitted:
        return Step.NOTHING, None
    doc = document(res)
    if isinstance(doc, str):
        said = res.status.get("phase") == Phase.INVALID and res.status.get("message") == doc
        return (Step.NOTHING if said else Step.INVALID), doc
    return Step.SUBMIT, doc


def event_id(env: str, uid: str, what: str) -> uuid.UUID:
    """The id of what the operator publishes for resource ``uid``: the same on every
    replica and after every restart, so a repeat is recognisable as one."""
    return uuid.uuid5(_EVENTS, f"{env}/{uid}/{what}")


def submitted(env: str, res: Resource, doc: ExperimentDocument, source: str) -> ExperimentSubmitted:
    return ExperimentSubmitted(
        env=env,
        source=source,
        event_id=event_id(env, res.uid, "submitted"),
        experiment=doc.metadata.name,
        spec=doc.spec,
    )


def killed(env: str, res: Resource, source: str) -> ExperimentAction:
    return ExperimentAction(
        env=env,
        source=source,
        event_id=event_id(env, res.uid, "kill"),
        experiment=res.name,
        action=ExperimentActionKind.KILL,
        reason=KILL_REASON,
    )


def hold_patch(res: Resource) -> dict[str, Any]:
    """The finalizer added; conditional on the version read, so a finalizer someone else
    added meanwhile is never dropped (a conflict is read again)."""
    return {
        "metadata": {
            "finalizers": [*res.finalizers, FINALIZER],
            "resourceVersion": res.resource_version,
        }
    }


def release_patch(res: Resource) -> dict[str, Any]:
    """The finalizer removed, the others kept (conditional, as ``hold_patch``)."""
    return {
        "metadata": {
            "finalizers": [f for f in res.finalizers if f != FINALIZER],
            "resourceVersion": res.resource_version,
        }
    }


def submitted_status(env: str, res: Resource) -> dict[str, Any]:
    return {
        "status": {
            "phase": Phase.SUBMITTED.value,
            "message": f"submitted to env {env}",
            "env": env,
            "submittedUid": res.uid,
            "observedGeneration": res.generation,
        }
    }


def invalid_status(why: str) -> dict[str, Any]:
    return {"status": {"phase": Phase.INVALID.value, "message": why}}


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    """An Experiment as the owner of its trials' jobs: a cluster's garbage collector
    deletes them with it. Not blocking its deletion (that would need rights on its
    finalizers, and the operator's own finalizer already waits for the kill)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": False,
    }


def experiment_of(document: Mapping[str, Any]) -> str | None:
    """The experiment a job document is a trial of (its label), or None."""
    meta = document.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    name = labels.get(EXPERIMENT_LABEL) if isinstance(labels, Mapping) else None
    return name if isinstance(name, str) and name else None


def with_owner(document: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    """The job document owned by ``owner`` (an Experiment's owner reference), beside any
    owner it names already; unchanged when it names that one."""
    meta = dict(document.get("metadata") or {})
    refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, Mapping)]
    if any(r.get("uid") == owner["uid"] for r in refs):
        return dict(document)
    if any(r.get("controller") for r in refs):
        owner = {**owner, "controller": False}
    meta["ownerReferences"] = [*refs, dict(owner)]
    return {**document, "metadata": meta}


__all__ = [
    "API_VERSION",
    "EXPERIMENT_LABEL",
    "FINALIZER",
    "GROUP",
    "KILL_REASON",
    "KIND",
    "PLURAL",
    "VERSION",
    "Phase",
    "Resource",
    "Step",
    "document",
    "event_id",
    "experiment_of",
    "hold_patch",
    "invalid_status",
    "killed",
    "owner_reference",
    "read",
    "release_patch",
    "step",
    "submitted",
    "submitted_status",
    "with_owner",
]
