"""A job submission checked before it reaches a platform: one TrainingJob, valid as its
schema cannot check (bounds, role names, elastic policy), stripped of what the platform
owns.

One copy for every way a job is created: the doors (`job submit`, the jobs API) and a
stream processor's JobRequest answered by the reconciler, so a job is refused for the
same reasons, in the same words, whoever asks. Here rather than in the doors because the
reconciler may not import a door (tests/unit/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from handlers.operator.document import trainingjob
from handlers.operator.platform.bodies import JobView
from handlers.operator.platform.errors import InvalidJob

#: What a submission may carry in its metadata; the platform sets the rest.
_SUBMITTED_META = ("name", "labels", "annotations")


class JobRequestError(ValueError):
    """The request is the user's to fix; the message says how."""


def check_bounds(job: JobView) -> None:
    """min <= replicas <= max per role: a schema (v1.20's) cannot say it."""
    for role in job.roles.values():
        if role.min_replicas is not None and role.replicas < role.min_replicas:
            raise InvalidJob(
                f"role {role.name}: {role.replicas} replicas, below minReplicas {role.min_replicas}"
            )
        if role.max_replicas is not None and role.replicas > role.max_replicas:
            raise InvalidJob(
                f"role {role.name}: {role.replicas} replicas, above maxReplicas {role.max_replicas}"
            )


def submission(body: Any, *, workdir: str | None = None, annotation: str = "") -> dict[str, Any]:
    """A TrainingJob body ready to create: one TrainingJob, valid as the schema cannot
    check (bounds, role names, elastic policy), stripped of what the platform owns."""
    kind = trainingjob.KIND
    if not isinstance(body, Mapping) or body.get("kind") != kind:
        raise JobRequestError(f"the request must hold one {kind}")
    meta = body.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise JobRequestError(f"a {kind} needs metadata.name")
    out: dict[str, Any] = {
        "apiVersion": body.get("apiVersion") or trainingjob.API_VERSION,
        "kind": kind,
        "metadata": {k: meta[k] for k in _SUBMITTED_META if k in meta},
        "spec": body.get("spec"),
    }
    unknown = trainingjob.unknown_fields(out["spec"])
    if unknown:
        raise JobRequestError(
            f"{', '.join(unknown)}: no such field of a {kind} (a role has "
            f"{', '.join(trainingjob.ROLE_FIELDS)}; its spec "
            f"{', '.join(trainingjob.SPEC_FIELDS)}); the API server would drop it"
        )
    try:
        check_bounds(trainingjob.parse_job({**out, "metadata": {**out["metadata"], "uid": ""}}))
    except InvalidJob as e:
        raise JobRequestError(str(e)) from None
    except (AttributeError, TypeError, ValueError) as e:
        raise JobRequestError(f"invalid {kind}: {e}") from None
    if workdir is not None and annotation:
        annotations = dict(out["metadata"].get("annotations") or {})
        annotations.setdefault(annotation, workdir)
        out["metadata"]["annotations"] = annotations
    return out


__all__ = ["JobRequestError", "check_bounds", "submission"]
