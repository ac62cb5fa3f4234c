"""The reconciler's decisions, pure: what a ScalePlan changes in a job's desired state, and
which pods to create or delete so the cluster matches it.

Split in two on purpose. A plan becomes a change of the job object (spec + annotations,
with the plan id, in one patch); pods then follow the object, level-triggered. So an
operator that dies half-way through a plan loses nothing: the object already says what
the plan wanted, and the next look at the pods finishes the work without doing any twice.

Rules (issue 4): scaling down removes the ranks a plan named first, then pending pods
before running ones, highest rank first, and an elastic role's rendezvous host (its rank
0) only when the role goes to 0 replicas; scaling up fills the lowest free ranks; a
migrated node gets a new pod with the new resources, and the old pod goes once the new one
runs (at once when the old one was not running anyway). Ranks are node ids towards the
brain; launch_nodes add replicas at the lowest free ranks (their ids are not honoured:
ranks stay dense), each launched node's resources going to the rank it gets.

What a platform's jobs cannot express is not applied, and the result says so part by part
(``partial``, the platform's ``not_applied``): training knobs (the job applies them and
confirms, training.applied), and a GPU type, GPU memory size or priority where its pods
cannot ask for them.

Suspend (a cluster scheduler's queue and preemption, issue 26): a suspended job has no
pods (each deleted with its grace period, so its training checkpoints on SIGTERM) and
keeps its replicas, its plans and its progress. A ``suspend`` plan suspends it; a plan
with a count (and no suspend) admits a queued job or resumes a suspended one. With a
cluster scheduler on, a new job is suspended before its first pod (``admission_change``:
queued) and runs once a plan admits it. A job Kueue manages (its queue label) is Kueue's
to suspend and admit: a plan that would is rejected, and a plan may shrink it, never grow
it past what Kueue admitted.

Hold (an experiment's trial paused at a rung, issue 34): a plan with ``hold`` true suspends
the job and records it held by its owner (admission reason ``Held``); no plan resumes or
resizes a held job, a cluster scheduler's included, until a plan with ``hold`` false
releases it to the queue (admission ``queued``: a cluster scheduler admits it when it has
room, and without one ``admission_change`` resumes it at once). The owner never admits
the job itself, so a shared queue's limits hold for trials as for any job.

Pure, and platform-neutral: jobs and pods are the port's typed views
(handlers.operator.platform.api), a plan's change a ``JobSpecChange``; each platform writes that
in its own form.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from handlers.operator.document.submission import check_bounds
from handlers.operator.platform.bodies import (
    ADMITTED,
    FAILED,
    FINAL_PHASES,
    PENDING,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    SUSPENDED_CONDITION,
    JobAdmission,
    JobCondition,
    JobSpecChange,
    JobView,
    NewPod,
    OperatorJobStatus,
    PlanChange,
    PlatformCapabilities,
    PodView,
    RoleView,
)
from handlers.operator.platform.errors import InvalidJob, PlanRejected
from schemas.plans import RescaleMode, ScalePlan

#: A job that names no success roles (spec.successPolicy.roles) succeeds once every pod of
#: the first of these roles it has succeeded; a job with none of them (DI-engine's
#: coordinator, collector, learner) once every pod of every role has.
COMPLETION_ROLES = ("worker", "chief", "master")

#: Seconds a removed pod has to stop when its template says none: Kubernetes' own
#: default, time for an elastic agent to pass SIGTERM on and a worker to checkpoint.
DEFAULT_GRACE_S = 30


#: The rules of a TrainingJob's pods on a platform that declares nothing more: no GPU
#: type selected, rendezvous hosts kept (what ``plan_change`` holds a plan to by default).
TRAINING_JOB_RULES = PlatformCapabilities()

#: How many applied plan ids a job remembers (older ones are in the env's ledger).
PLAN_MEMORY = 32

#: The phases of a job that has no pods because it is suspended: queued since its
#: submission (never admitted), or suspended after it ran (or by its user, or Kueue).
QUEUED_PHASE, SUSPENDED_PHASE = "Queued", "Suspended"


def cannot_suspend(platform: str) -> str:
    """Why a platform that cannot preempt rejects a cluster scheduler's suspend: a pod
    deleted here would be replaced, or its GPUs taken, with no way to hold the job's place
    and resume it (pure; one line, the result's reason)."""
    return (
        f"the {platform} platform cannot suspend a job; nothing was changed (a cluster "
        "scheduler's preemption needs a platform that suspends, such as a virtual env's "
        "simulated cluster)"
    )


# -- admission: queue, suspend, resume ------------------------------------------------


def gives_count(plan: ScalePlan) -> bool:
    """Whether the plan gives the job replicas: what admits or resumes a suspended job
    (a plan of knobs or resources alone leaves it as it is)."""
    return any(g.count for g in plan.node_group_resources.values()) or bool(plan.launch_nodes)


def resumes(job: JobView, plan: ScalePlan) -> bool:
    """Whether ``plan`` admits or resumes the suspended ``job``."""
    return job.suspended and not plan.suspend and gives_count(plan)


def _kueue_refusal(job: JobView, what: str) -> str:
    return (
        f"job {job.name} is managed by Kueue (queue {job.kueue_queue}): Kueue admits and "
        f"suspends it, so no plan may {what} it; nothing was changed"
    )


def admitted_by(job: JobView, plan_id: str) -> JobAdmission:
    """What a plan that admits (a queued job) or resumes (a suspended one) records."""
    if job.admission is None or job.admission.state == QUEUED:
        return JobAdmission(ADMITTED, "Admitted", f"admitted by plan {plan_id}", plan_id)
    return JobAdmission(ADMITTED, "Resumed", f"resumed by plan {plan_id}", plan_id)


def suspended_by(plan_id: str) -> JobAdmission:
    return JobAdmission(
        SUSPENDED,
        "Preempted",
        f"suspended by plan {plan_id}: its pods were stopped, its progress is kept; a plan "
        "with a count resumes it",
        plan_id,
    )


#: The admission reason of a job held by its owner (a plan with hold true).
HELD = "Held"


def held(job: JobView) -> bool:
    """Whether the job is held by its owner: suspended until a plan releases it."""
    return job.suspended and job.admission is not None and job.admission.reason == HELD


def held_by(plan_id: str) -> JobAdmission:
    return JobAdmission(
        SUSPENDED,
        HELD,
        f"held by plan {plan_id}: its pods were stopped, its progress is kept; no plan "
        "resumes it until one releases it (hold: false)",
        plan_id,
    )


def released_by(plan_id: str) -> JobAdmission:
    return JobAdmission(
        QUEUED,
        "Released",
        f"released by plan {plan_id}: waiting to be admitted (by the env's cluster "
        "scheduler, else by the operator at once)",
        plan_id,
    )


def queued(scheduler: str) -> JobAdmission:
    return JobAdmission(
        QUEUED,
        "Queued",
        f"waiting for the env's cluster scheduler ({scheduler}) to admit it",
    )


def _admission_only(job: JobView, suspend: bool, admission: JobAdmission) -> JobSpecChange:
    """A change of the job's suspend alone (its per-node state carried as it is)."""
    return JobSpecChange(
        resource_version=job.resource_version,
        applied_plans=job.applied_plans,
        node_resources={role: dict(ranks) for role, ranks in job.node_resources.items()},
        remove_first=dict(job.remove_first),
        suspend=suspend,
        admission=admission,
    )


def admission_change(
    job: JobView, pods: Sequence[PodView], scheduler: str | None
) -> JobSpecChange | None:
    """What the operator itself changes in a job's admission before its pods, None for
    nothing. With a cluster scheduler on (``scheduler``, the env's brain.scheduler), a
    new job is suspended before its first pod runs: queued until a plan admits it. New
    means no admission yet, no plan applied, not suspended already (by its user: it
    stays so), no pod running. Without one, a job it queued is admitted (nothing else
    would). A job Kueue manages is never touched: Kueue suspends and admits it."""
    if job.phase in FINAL_PHASES or job.kueue_queue:
        return None
    if scheduler is not None:
        if job.suspended or job.admission is not None or job.applied_plans:
            return None
        if any(p.running for p in live(pods, job)):
            return None
        return _admission_only(job, True, queued(scheduler))
    if job.suspended and job.admission is not None and job.admission.state == QUEUED:
        admitted = JobAdmission(
            ADMITTED,
            "Admitted",
            "admitted by the operator: the env's settings name no cluster scheduler now",
        )
        return _admission_only(job, False, admitted)
    return None


def effective_admission(job: JobView) -> JobAdmission | None:
    """Whether the job is queued, admitted or suspended, and why, as `job list` and the
    ``Suspended`` condition say it; None for a job no one ever suspended."""
    recorded, queue = job.admission, job.kueue_queue
    if job.suspended:
        if recorded is not None and recorded.suspended:
            return recorded
        if queue:
            return JobAdmission(
                SUSPENDED, "Kueue", f"suspended by Kueue (queue {queue}): Kueue admits it"
            )
        return JobAdmission(
            SUSPENDED,
            "Suspended",
            "spec.suspend is set: it runs once a plan resumes it or spec.suspend is cleared",
        )
    if recorded is not None and not recorded.suspended:
        return recorded
    if queue:
        return JobAdmission(ADMITTED, "Kueue", f"admitted by Kueue (queue {queue})")
    if recorded is not None:
        return JobAdmission(ADMITTED, "Resumed", "spec.suspend was cleared by hand")
    return None


def remaining(job: JobView, pods: Sequence[PodView]) -> list[str]:
    """The job's pods that are still there (being deleted included): a suspend is done
    once there are none. A job that ended before its suspension deleted its pods (a
    trial that exited 0 when its searcher stopped it, as its stop's hold came) keeps them,
    as a finished job keeps its pods (`diff` deletes none): nothing is left to go."""
    if outcome(job, pods)[0] is not None:
        return []
    return sorted(p.name for p in pods if p.job_uid == job.uid)


def missing(job: JobView, pods: Sequence[PodView]) -> dict[str, int]:
    """Per role, how many replicas have no pod yet (created, not being deleted): a resume
    is done once none is missing."""
    by_role = {name: len(_ranks(live(pods, job, name))) for name in job.roles}
    return {
        name: role.replicas - by_role[name]
        for name, role in job.roles.items()
        if by_role[name] < role.replicas
    }


@dataclass(frozen=True)
class Actions:
    create: tuple[NewPod, ...] = ()
    delete: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.create or self.delete)


# -- plan -> job change -----------------------------------------------------------------


def live(pods: Iterable[PodView], job: JobView, role: str | None = None) -> list[PodView]:
    """The job's pods that count: not being deleted, of this job (not of an earlier job
    of the same name), of the role when one is given."""
    return [
        p
        for p in pods
        if not p.deleting and p.job_uid == job.uid and (role is None or p.role == role)
    ]


def _ranks(pods: Iterable[PodView]) -> dict[int, list[PodView]]:
    by_rank: dict[int, list[PodView]] = defaultdict(list)
    for p in pods:
        by_rank[p.rank].append(p)
    return dict(by_rank)


def plan_change(
    job: JobView,
    pods: Sequence[PodView],
    plan: ScalePlan,
    capabilities: PlatformCapabilities = TRAINING_JOB_RULES,
) -> PlanChange:
    """What ``plan`` changes in ``job``, given its pods as observed now; PlanRejected
    says why it cannot apply. The change carries the job's version, so it fails
    (Conflict) rather than apply on top of a change it did not see. What the platform
    declares (``capabilities``) decides the rest: a GPU type is taken into the job only
    where it selects GPU types (else it is a part not applied), and a plan that names
    an elastic role's rendezvous host is rejected where that node cannot be replaced."""
    gpu_types = capabilities.gpu_types
    if job.phase in FINAL_PHASES:
        raise PlanRejected(f"job {job.name} has {job.phase.lower()}")
    if job.kueue_queue and plan.suspend:
        raise PlanRejected(_kueue_refusal(job, "suspend"))
    if plan.hold is False:
        return _release(job, plan)
    if held(job) and not plan.suspend:
        raise PlanRejected(
            f"job {job.name} is held by its owner; no plan resumes or resizes it until "
            "a plan with hold false releases it"
        )
    resume = resumes(job, plan)
    if job.kueue_queue and resume:
        raise PlanRejected(_kueue_refusal(job, "admit or resume"))
    touched = (
        set(plan.node_group_resources)
        | {n.type for n in plan.launch_nodes}
        | {n.type for n in plan.remove_nodes}
        | {m.node.type for m in plan.migrate_nodes}
    )
    unknown = sorted(touched - set(job.roles))
    if unknown:
        raise PlanRejected(
            f"job {job.name} has no role {', '.join(unknown)} (roles: {', '.join(job.roles)})"
        )
    if not capabilities.replaces_rendezvous_host:
        _keep_rendezvous_hosts(job, plan)
    both = {n.type for n in plan.launch_nodes} & {n.type for n in plan.remove_nodes}
    if both:
        # Replicas are counts: removing and adding in one role would not say which stays.
        raise PlanRejected(
            f"plan both launches and removes {', '.join(sorted(both))} nodes; migrate them, "
            "or send two plans"
        )
    replicas = {name: role.replicas for name, role in job.roles.items()}
    role_resources = {name: role.resources for name, role in job.roles.items()}
    overrides = {role: dict(ranks) for role, ranks in job.node_resources.items()}
    remove_first: dict[str, list[int]] = defaultdict(list)
    done: list[str] = []

    for role, group in plan.node_group_resources.items():
        new_res = role_resources[role].updated(group.node_resource, gpu_type=gpu_types)
        if new_res != role_resources[role]:
            role_resources[role] = new_res
            done.append(f"{role} resources {new_res.describe()}")
        if group.count:
            replicas[role] = group.count
    # A role the plan gives a count (the brain's plans do) has that many replicas; the
    # nodes it launches or removes by name say which ranks come and go within it.
    counted = {role for role, group in plan.node_group_resources.items() if group.count}
    for ref in plan.remove_nodes:
        ranks = _ranks(live(pods, job, ref.type))
        if ref.id not in ranks:
            raise PlanRejected(f"cannot remove {ref.type}-{ref.id}: no such node")
        if ref.id not in remove_first[ref.type]:
            remove_first[ref.type].append(ref.id)
            if ref.type not in counted:
                replicas[ref.type] -= 1
            overrides.get(ref.type, {}).pop(ref.id, None)
    launched: dict[str, int] = defaultdict(int)
    before_launch = dict(replicas)
    for node in plan.launch_nodes:
        role = node.type
        taken = set(_ranks(live(pods, job, role))) - set(remove_first[role])
        bound = len(taken) + before_launch[role] + len(plan.launch_nodes) + 1
        free = [r for r in range(bound) if r not in taken]
        if role in counted:
            # The plan's count is the role's size; its launched nodes are the ranks that
            # count adds, not more on top of it.
            rank = free[launched[role]]
        else:
            # Ranks the spec already wants filled come first; launched nodes take the next.
            rank = free[max(0, before_launch[role] - len(taken)) + launched[role]]
            replicas[role] += 1
        launched[role] += 1
        wanted = role_resources[role].updated(node.resource, gpu_type=gpu_types)
        if wanted != role_resources[role]:
            overrides.setdefault(role, {})[rank] = wanted
    for move in plan.migrate_nodes:
        role, rank = move.node.type, move.node.id
        current = _ranks(live(pods, job, role)).get(rank)
        if not current or rank in remove_first[role]:
            raise PlanRejected(f"cannot migrate {role}-{rank}: no such node")
        base = overrides.get(role, {}).get(rank) or job.wanted(role, rank)
        overrides.setdefault(role, {})[rank] = base.updated(move.resource, gpu_type=gpu_types)
        done.append(f"migrate {role}-{rank} to {overrides[role][rank].describe()}")

    for role, n in replicas.items():
        if n < 0:
            raise PlanRejected(f"plan leaves role {role} with {n} replicas")
    bounded = JobView(
        name=job.name,
        namespace=job.namespace,
        uid=job.uid,
        resource_version=job.resource_version,
        generation=job.generation,
        roles={
            name: replace(role, replicas=replicas[name], resources=role_resources[name])
            for name, role in job.roles.items()
        },
    )
    try:
        check_bounds(bounded)
    except InvalidJob as e:
        raise PlanRejected(str(e)) from None
    for role, n in replicas.items():
        if n != job.roles[role].replicas:
            done.insert(0, f"{role} {job.roles[role].replicas}->{n}")
    if job.kueue_queue:
        grown = sorted(r for r, n in replicas.items() if n > job.roles[r].replicas)
        if grown:
            sizes = ", ".join(f"{r} {job.roles[r].replicas}->{replicas[r]}" for r in grown)
            raise PlanRejected(
                f"job {job.name} is managed by Kueue (queue {job.kueue_queue}): a plan may "
                f"resize it within what Kueue admitted, not grow it ({sizes}); nothing was "
                "changed"
            )

    suspend: bool | None = None
    admission: JobAdmission | None = None
    if plan.hold:
        suspend, admission = True, held_by(plan.plan_id)
        done.insert(0, "held" if not job.suspended else "suspended already; held")
    elif plan.suspend:
        suspend, admission = True, suspended_by(plan.plan_id)
        done.insert(0, "suspended" if not job.suspended else "suspended already")
    elif resume:
        suspend, admission = False, admitted_by(job, plan.plan_id)
        done.insert(0, admission.reason.lower())
    change = JobSpecChange(
        resource_version=job.resource_version,
        applied_plans=(*job.applied_plans, plan.plan_id)[-PLAN_MEMORY:],
        replicas={r: n for r, n in replicas.items() if n != job.roles[r].replicas},
        resources={r: res for r, res in role_resources.items() if res != job.roles[r].resources},
        node_resources={role: dict(ranks) for role, ranks in overrides.items() if ranks},
        remove_first={role: tuple(ranks) for role, ranks in remove_first.items() if ranks},
        suspend=suspend,
        admission=admission,
    )
    return PlanChange(change, "; ".join(done) or "nothing to change")


def _release(job: JobView, plan: ScalePlan) -> PlanChange:
    """A held job released to the queue; one that is not held is left as it is (a release
    delivered again, or one that came before its hold was applied)."""
    if not held(job):
        return PlanChange(
            JobSpecChange(
                resource_version=job.resource_version,
                applied_plans=(*job.applied_plans, plan.plan_id)[-PLAN_MEMORY:],
                node_resources={role: dict(ranks) for role, ranks in job.node_resources.items()},
                remove_first=dict(job.remove_first),
            ),
            "not held: nothing to release",
        )
    change = _admission_only(job, True, released_by(plan.plan_id))
    return PlanChange(
        replace(change, applied_plans=(*job.applied_plans, plan.plan_id)[-PLAN_MEMORY:]),
        "released to the queue",
    )


def rescale_mode(job: JobView, plan: ScalePlan) -> RescaleMode | None:
    """How the job's training processes take what ``plan`` resizes: None when it resizes
    no elastic role; in place only when every elastic role it resizes is in place (one
    role restarting restarts the job's training)."""
    resized = (
        {r for r, g in plan.node_group_resources.items() if g.count}
        | {n.type for n in plan.launch_nodes}
        | {n.type for n in plan.remove_nodes}
    )
    policies = [p for p in (job.roles[r].elastic for r in sorted(resized) if r in job.roles) if p]
    if not policies:
        return None
    if all(p.in_place for p in policies):
        return RescaleMode.IN_PLACE
    return RescaleMode.RESTART


def _keep_rendezvous_hosts(job: JobView, plan: ScalePlan) -> None:
    """An elastic role's host rank runs the c10d store every other pod of the job meets
    at: removing or replacing it would restart the whole job's rendezvous, so no plan may
    name it (scaling down by count never picks it, see ``diff``)."""
    named = [("remove", ref.type, ref.id) for ref in plan.remove_nodes]
    named += [("migrate", m.node.type, m.node.id) for m in plan.migrate_nodes]
    for verb, role, rank in named:
        elastic = job.roles[role].elastic
        if elastic is not None and rank == elastic.host_rank:
            raise PlanRejected(
                f"cannot {verb} {role}-{rank}: it hosts the job's rendezvous (the c10d "
                f"store of elastic role {role}); scale the role by count instead"
            )


# -- job -> pods ------------------------------------------------------------------------


def replaces(policy: str, pod: PodView) -> bool:
    """Whether the operator replaces this ended pod (the role's restartPolicy)."""
    if pod.phase == SUCCEEDED:
        return policy == "Always"
    if pod.phase != FAILED:
        return False
    if policy in ("OnFailure", "Always"):
        return True
    if policy == "ExitCode":
        return pod.termination is not None and pod.termination.exit_code >= 128
    return False


def grace_seconds(job: JobView, pod: PodView) -> int | None:
    """How long a pod the diff removes has to stop: its role template's
    terminationGracePeriodSeconds, else DEFAULT_GRACE_S; None (the pod's own) for a
    pod of an earlier job of the same name, whose template is gone. A scaled-down
    elastic node's agent then has time to leave, and the others to re-rendezvous."""
    role = job.roles.get(pod.role)
    if role is None or pod.job_uid != job.uid:
        return None
    if role.grace_s is not None and role.grace_s >= 0:
        return role.grace_s
    return DEFAULT_GRACE_S


def _removal_order(
    rank: int, pods: list[PodView], named: Sequence[int], host: int | None = None
) -> tuple[bool, bool, bool, int]:
    """Named ranks first, then ranks with no running pod, then the highest rank; an
    elastic role's rendezvous host last of all, whatever else is said of it."""
    return (rank == host, rank not in named, any(p.running for p in pods), -rank)


def _keeper(pods: list[PodView]) -> PodView:
    """Of several pods of one rank, the one that is (or soonest will be) the node."""
    order = {RUNNING: 0, SUCCEEDED: 1, PENDING: 2, FAILED: 3}
    return min(pods, key=lambda p: (order.get(p.phase, 2), -p.index))


def role_ready(job: JobView, pods: Sequence[PodView], role: str) -> bool:
    """Every replica of ``role`` has a running pod that is ready (its probe passes, or its
    process said so: PodView.ready); a role of no replicas is."""
    ready = {p.rank for p in live(pods, job, role) if p.running and p.ready}
    return len(ready) >= job.roles[role].replicas


def waiting(job: JobView, pods: Sequence[PodView]) -> dict[str, tuple[str, ...]]:
    """The roles that may not have pods made yet (``startAfter``), and the roles they
    wait for, as the job's pods are now."""
    out: dict[str, tuple[str, ...]] = {}
    for name, role in job.roles.items():
        before = tuple(r for r in role.start_after if not role_ready(job, pods, r))
        if before:
            out[name] = before
    return out


def diff(job: JobView, pods: Sequence[PodView]) -> Actions:
    """Pods to create and delete so that the job's pods match its desired state.

    Deterministic in its inputs, so two looks at the same cluster decide the same names:
    a create that a restarted operator repeats meets AlreadyExists, not a second pod.
    A role that starts after others (``startAfter``) gets no new pod until their pods
    are all ready.
    """
    create: list[NewPod] = []
    delete: list[str] = []
    stale = [p.name for p in pods if not p.deleting and p.job_uid != job.uid]
    delete.extend(sorted(stale))
    if outcome(job, pods)[0] is not None:
        return Actions((), tuple(delete))
    if job.suspended:
        # no pods while suspended: each goes with its grace period, and none is made
        delete.extend(sorted(p.name for p in live(pods, job)))
        return Actions((), tuple(delete))
    for name, role in job.roles.items():
        mine = [p for p in pods if p.job_uid == job.uid and p.role == name]
        taken = {p.index for p in mine}
        by_rank = _ranks(live(mine, job))
        named = job.remove_first.get(name, ())
        excess = len(by_rank) - role.replicas
        if excess > 0:
            host = role.elastic.host_rank if role.elastic is not None else None
            order = sorted(by_rank, key=lambda r: _removal_order(r, by_rank[r], named, host))
            for rank in order[:excess]:
                delete.extend(p.name for p in by_rank.pop(rank))

        def new_pod(rank: int, role: RoleView = role, taken: set[int] = taken) -> NewPod:
            index = rank if rank not in taken else max(taken) + 1
            taken.add(index)
            return NewPod(role.name, rank, index, job.wanted(role.name, rank))

        for rank, rank_pods in sorted(by_rank.items()):
            wanted = job.node_resources.get(name, {}).get(rank)
            good = [
                p
                for p in rank_pods
                if p.phase == SUCCEEDED
                or (
                    (wanted is None or p.resources.covers(wanted))
                    and not replaces(role.restart_policy, p)
                )
            ]
            if not good:
                create.append(new_pod(rank))
                # The old pods go once the new one runs, or now if they do not run.
                delete.extend(p.name for p in rank_pods if not p.running)
                continue
            keeper = _keeper(good)
            for p in rank_pods:
                if p is not keeper and (keeper.running or keeper.finished or not p.running):
                    delete.append(p.name)
        missing = role.replicas - len(by_rank)
        free = (r for r in range(len(by_rank) + role.replicas + 1) if r not in by_rank)
        for _ in range(max(0, missing)):
            create.append(new_pod(next(free)))
    held_back = waiting(job, pods)
    create = [p for p in create if p.role not in held_back]
    return Actions(tuple(create), tuple(dict.fromkeys(delete)))


# -- what the pods say about the job ----------------------------------------------------


def counts(job: JobView, pods: Iterable[PodView]) -> dict[str, dict[str, int]]:
    """Per role: pending/running/succeeded/failed pods, as status and ScaleResults say."""
    out = {role: {"pending": 0, "running": 0, "succeeded": 0, "failed": 0} for role in job.roles}
    for p in live(pods, job):
        if p.role in out:
            out[p.role][p.phase.lower() if p.phase != "Unknown" else "pending"] += 1
    return out


def success_roles(job: JobView) -> tuple[str, ...]:
    """The roles whose pods all succeeding ends the job: its own successPolicy, else the
    first of COMPLETION_ROLES it has, else every role."""
    if job.success_roles:
        return job.success_roles
    for role in COMPLETION_ROLES:
        if role in job.roles:
            return (role,)
    return tuple(job.roles)


def _all_succeeded(job: JobView, pods: Sequence[PodView], role: str) -> bool:
    """Every replica of ``role`` has a pod that succeeded."""
    done = {p.rank for p in pods if p.role == role and p.phase == SUCCEEDED}
    return len(done) >= job.roles[role].replicas


def outcome(job: JobView, pods: Sequence[PodView]) -> tuple[str | None, str]:
    """(Succeeded | Failed | None, reason): whether the job has ended, and why.

    Final once reached: a job whose status already says it ended stays ended, even after
    its pods are cleaned up. It succeeds when every replica of its success roles did (a
    role scaled to 0 says nothing), or when every replica of every role did, whatever its
    policy names: a job none of whose pods is left to run has ended, never Pending.
    """
    if job.phase in FINAL_PHASES:
        return job.phase, ""
    mine = live(pods, job)
    for p in sorted(mine, key=lambda p: (p.role, p.rank)):
        role = job.roles.get(p.role)
        if p.phase == FAILED and role is not None and not replaces(role.restart_policy, p):
            t = p.termination
            how = f"exit code {t.exit_code} ({t.reason})" if t is not None else "failed"
            return FAILED, f"pod {p.name} {how}; restartPolicy {role.restart_policy}"
    counted = [r for r in success_roles(job) if job.roles[r].replicas > 0]
    if counted and all(_all_succeeded(job, mine, r) for r in counted):
        if len(counted) == 1:
            (only,) = counted
            return SUCCEEDED, f"all {job.roles[only].replicas} {only} pods succeeded"
        sizes = ", ".join(f"{r} ({job.roles[r].replicas})" for r in counted)
        return SUCCEEDED, f"all pods of {sizes} succeeded"
    if any(p.phase == SUCCEEDED for p in mine) and all(
        _all_succeeded(job, mine, r) for r in job.roles
    ):
        return SUCCEEDED, "all pods of every role succeeded"
    return None, ""


def phase(job: JobView, pods: Sequence[PodView]) -> str:
    """The phase status shows: ended, Scaling while pods differ from the spec, else
    Running once any pod runs, else Pending."""
    ended, _ = outcome(job, pods)
    if ended is not None:
        return ended
    if job.suspended:
        state = effective_admission(job)
        return QUEUED_PHASE if state is not None and state.state == QUEUED else SUSPENDED_PHASE
    if diff(job, pods):
        return "Scaling"
    if any(p.running for p in live(pods, job)):
        return RUNNING
    return PENDING


def suspended_condition(
    job: JobView, current: JobCondition | None, now: str | None = None
) -> JobCondition | None:
    """The job's ``Suspended`` condition: True while it is queued or suspended, False
    once admitted or resumed, with the reason and message; None for a job never
    suspended. Its time moves only when its status does."""
    state = effective_admission(job)
    if state is None:
        return None
    status = state.suspended
    since = current.since if current is not None and current.status == status else now
    return JobCondition(SUSPENDED_CONDITION, status, state.reason, state.message, since)


def job_status(
    job: JobView,
    pods: Sequence[PodView],
    *,
    last_plan: str | None = None,
    last_plan_time: str | None = None,
    now: str | None = None,
) -> OperatorJobStatus | None:
    """The status the job should show (phase, pods per role, the generation seen, the
    last plan, whether it is suspended and why), None when it already says all this."""
    current = job.status
    if last_plan is None and current is not None:
        last_plan, last_plan_time = current.last_plan_id, current.last_plan_time
    wanted = OperatorJobStatus(
        phase=phase(job, pods),
        roles=counts(job, pods),
        observed_generation=job.generation,
        last_plan_id=last_plan,
        last_plan_time=last_plan_time,
        suspended=suspended_condition(
            job, current.suspended if current is not None else None, now or last_plan_time
        ),
    )
    if (
        current is not None
        and (current.phase, current.roles, current.observed_generation)
        == (wanted.phase, wanted.roles, wanted.observed_generation)
        and current.last_plan_id == wanted.last_plan_id
        and _same(current.suspended, wanted.suspended)
    ):
        return None
    return wanted


def _same(a: JobCondition | None, b: JobCondition | None) -> bool:
    """Two conditions that say the same (their times aside)."""
    if a is None or b is None:
        return a is b
    return (a.status, a.reason, a.message) == (b.status, b.reason, b.message)


__all__ = [
    "COMPLETION_ROLES",
    "DEFAULT_GRACE_S",
    "HELD",
    "PLAN_MEMORY",
    "QUEUED_PHASE",
    "SUSPENDED_PHASE",
    "TRAINING_JOB_RULES",
    "Actions",
    "admission_change",
    "admitted_by",
    "cannot_suspend",
    "check_bounds",
    "counts",
    "diff",
    "effective_admission",
    "gives_count",
    "grace_seconds",
    "held",
    "held_by",
    "job_status",
    "live",
    "missing",
    "outcome",
    "phase",
    "plan_change",
    "queued",
    "released_by",
    "remaining",
    "replaces",
    "rescale_mode",
    "resumes",
    "role_ready",
    "success_roles",
    "suspended_by",
    "suspended_condition",
    "waiting",
]
