"""The parts of a ScalePlan a platform did not apply, named as ScaleResults name them.

Shared by every operator (the Kubernetes reconciler, the simulated cluster) so that they
tell the brain the same truth in the same words: a plan is ``applied`` only when every
part of it was, else ``partial`` with the parts left out. Training knobs are never the
platform's to apply: only the training process changes its micro-batch, and it says so
itself (training.applied).

Names: ``training.<knob>``; ``<role>.<field>`` for a role's group resources;
``<role>-<id>.<field>`` for a node the plan launches or migrates (its id as the plan gives
it). A part named for a role covers that role's nodes in the same plan, which is how a
long list is cut to fit one result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from schemas.plans import MAX_NOT_APPLIED, TRAINING_KNOBS, NodeResource, NotApplied, ScalePlan

AWAITING_JOB = "awaiting the job's confirmation (training.applied)"
UNKNOWN_KNOB = f"not a training knob a job applies (those are: {', '.join(TRAINING_KNOBS)})"


def training_parts(plan: ScalePlan) -> list[NotApplied]:
    """Every knob of the plan: the job applies the ones it knows and confirms them."""
    return [
        NotApplied(
            part=f"training.{knob}", reason=AWAITING_JOB if knob in TRAINING_KNOBS else UNKNOWN_KNOB
        )
        for knob in sorted(plan.training)
    ]


def _asked(res: NodeResource, field: str) -> bool:
    value = getattr(res, field)
    return bool(value)  # a plan's 0 or "" means unchanged: nothing asked


def resource_parts(plan: ScalePlan, unsupported: Mapping[str, str]) -> list[NotApplied]:
    """The resource fields the plan sets that the platform cannot express
    (``unsupported``: field -> why), wherever the plan sets them."""
    parts: list[NotApplied] = []
    for role, group in sorted(plan.node_group_resources.items()):
        for field, why in unsupported.items():
            if _asked(group.node_resource, field):
                parts.append(NotApplied(part=f"{role}.{field}", reason=why))
    nodes = [(n.type, n.id, n.resource) for n in plan.launch_nodes]
    nodes += [(m.node.type, m.node.id, m.resource) for m in plan.migrate_nodes]
    for role, node_id, res in nodes:
        for field, why in unsupported.items():
            if _asked(res, field):
                parts.append(NotApplied(part=f"{role}-{node_id}.{field}", reason=why))
    return parts


def _coarse(part: str) -> str:
    """``worker-2.gpu_memory`` -> ``worker.gpu_memory``; ``training.x`` -> ``training``."""
    name, _, field = part.partition(".")
    if name == "training":
        return name
    role, sep, node_id = name.rpartition("-")
    if sep and role and node_id.isdigit():
        name = role
    return f"{name}.{field}" if field else name


def bounded(parts: Sequence[NotApplied]) -> list[NotApplied]:
    """At most MAX_NOT_APPLIED parts, one result being one message: past that, node parts
    become their role's part and the knobs one ``training`` part, and what still does not
    fit (a plan of dozens of roles) is cut."""
    unique = list({p.part: p for p in parts}.values())
    if len(unique) <= MAX_NOT_APPLIED:
        return unique
    coarse: dict[str, NotApplied] = {}
    for p in unique:
        part = _coarse(p.part)
        coarse.setdefault(part, NotApplied(part=part, reason=p.reason))
    return list(coarse.values())[:MAX_NOT_APPLIED]


#: Why a platform without node pinning leaves a scheduler's placement out.
NO_PLACEMENT = "this platform places pods itself: the plan's node placement is not applied"


def placement_parts(plan: ScalePlan, *, pins_nodes: bool) -> list[NotApplied]:
    """The plan's placement, when the platform cannot pin pods to named nodes."""
    if not plan.placement or pins_nodes:
        return []
    return [NotApplied(part="placement", reason=NO_PLACEMENT)]


def not_applied(
    plan: ScalePlan, unsupported: Mapping[str, str], *, pins_nodes: bool = False
) -> tuple[NotApplied, ...]:
    """What a platform that cannot express ``unsupported`` (nor, unless ``pins_nodes``,
    a placement) leaves out of ``plan``. A suspend is not a part: a platform that cannot
    suspend rejects the plan (nothing of it would be applied)."""
    return tuple(
        bounded(
            [
                *placement_parts(plan, pins_nodes=pins_nodes),
                *resource_parts(plan, unsupported),
                *training_parts(plan),
            ]
        )
    )


__all__ = [
    "AWAITING_JOB",
    "NO_PLACEMENT",
    "UNKNOWN_KNOB",
    "bounded",
    "not_applied",
    "placement_parts",
    "resource_parts",
    "training_parts",
]
