"""`dlrover-events job submit|list|describe|scale|suspend|resume|delete`: TrainingJobs from a
terminal.

submit/list/describe/delete talk to the cluster with the user's own kubeconfig, as kubectl
does (scale and delete through handlers.operator.doors.actions, as the console's actions and
the jobs API do). `scale` does not patch the job: it publishes a ScalePlan to the env's
scale.plans, so a scale by hand goes the way the brain's do (once, recorded, answered
with a ScaleResult). Its plan_id is derived from the request and the job's generation:
the same command repeated before it applied is the same plan, applied once.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
import yaml  # type: ignore[import-untyped,unused-ignore]

from dlrover_events.bus.producer import Producer
from dlrover_events.cli.params import env_name, json_option, print_json
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.settings import load_settings
from handlers.operator.document.trainingjob import ANN_WORKDIR, KIND
from handlers.operator.doors.actions import (
    delete_job,
    job_of,
    open_platform,
    resume_job,
    scale_job,
    suspend_job,
)
from handlers.operator.doors.jobs import JobRequestError, admission, scale_plan_id, submission
from handlers.operator.platform.api import JobEntry, Platform
from handlers.operator.platform.bodies import JobView, PodView
from handlers.operator.platform.errors import PlatformError
from handlers.operator.platform.registry import PLATFORMS, PlatformEntry
from schemas.plans import ScalePlan

T = TypeVar("T")

job_app = typer.Typer(help="TrainingJobs on the cluster: submit, list, describe, scale, delete.")

KUBECONFIG = typer.Option(None, "--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config")
NAMESPACE = typer.Option(None, "--namespace", "-n", help="default: the context's")


PLATFORM = typer.Option(
    "kubernetes",
    "--platform",
    help="where the jobs run: kubernetes, local (this machine) or hosts (agents)",
)
ENV = typer.Option(
    None, "--env", "-e", parser=env_name, help="default: the real env (the registry's)"
)
JSON = json_option("the TrainingJob objects as JSON")


async def _real_env(env: str | None) -> str:
    """The env named (which must exist), else the one the registry says is real now."""
    settings = load_settings()
    registry = EnvRegistry(settings, (await resolve_postgres(settings)).dsn)
    if env is not None:
        if await registry.get(env) is None:
            raise UserError(f"no env named {env!r} (see `dlrover-events env list`)")
        return env
    real = await registry.real()
    if real is None:
        raise UserError("no env is real; name one with --env")
    return real.name


def _entry(platform: str) -> PlatformEntry:
    return PLATFORMS[platform]


async def _target(platform: str, env: str | None) -> str:
    """The env whose jobs the command acts on: for a platform that keeps each env's jobs
    apart, the env named or the real one; else the env named, if any."""
    return await _real_env(env) if _entry(platform).env_scoped else (env or "")


async def _check_operator(
    platform: str, env: str | None, kubeconfig: Path | None, namespace: str | None
) -> None:
    """Refuse, in one line, a job that nothing on ``platform`` would start (the platform's
    own check: platform.registry)."""
    entry = _entry(platform)
    check = entry.load(entry.check_operator)
    options = entry.options_of(kubeconfig=kubeconfig, namespace=namespace)
    await check(load_settings(), await _target(platform, env), options)


def _run(
    kubeconfig: Path | None,
    namespace: str | None,
    work: Callable[[Platform], Awaitable[T]],
    *,
    platform: str = "kubernetes",
    env: str | None = None,
) -> T:
    """``work`` against the platform's jobs: the cluster with the user's kubeconfig, or
    the local platform's job objects of the env (the real one unless named). Options the
    platform does not take are refused before anything is opened."""
    _entry(platform).options_of(kubeconfig=kubeconfig, namespace=namespace)

    async def go() -> T:
        try:
            target = await _target(platform, env)
            async with open_platform(
                load_settings(), target, platform, kubeconfig=kubeconfig, namespace=namespace
            ) as jobs:
                try:
                    return await work(jobs)
                except JobRequestError as e:
                    raise UserError(str(e)) from None
        except PlatformError as e:
            raise UserError(str(e)) from None

    return asyncio.run(go())


@job_app.command("submit")
def submit(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="a TrainingJob YAML"),
    kubeconfig: Path | None = KUBECONFIG,
    namespace: str | None = NAMESPACE,
    platform: str = PLATFORM,
    env: str | None = ENV,
    queue: bool = typer.Option(
        False, "--queue", help="create it even when no operator runs it: it waits for one"
    ),
) -> None:
    """Create the TrainingJob of FILE (checked first for what the schema cannot check).
    On the local platform its commands run in the current directory. It says so when no
    operator would start it (the local platform: none runs the env; Kubernetes: the
    operators' Lease is released or stale), unless --queue."""
    try:
        docs = [d for d in yaml.safe_load_all(file.read_text()) if d]
    except yaml.YAMLError as e:
        raise UserError(f"{file} is not YAML: {str(e).splitlines()[0]}") from None
    if len(docs) != 1:
        raise UserError(f"{file} must hold one {KIND}")
    try:
        body = submission(
            docs[0],
            workdir=str(Path.cwd()) if _entry(platform).runs_in_workdir else None,
            annotation=ANN_WORKDIR,
        )
    except JobRequestError as e:
        raise UserError(f"{file}: {e}") from None

    async def work(kube: Platform) -> JobView:
        return await kube.submit_job(body)

    if not queue:
        asyncio.run(_check_operator(platform, env, kubeconfig, namespace))
    got = _run(kubeconfig, namespace, work, platform=platform, env=env)
    typer.echo(f"trainingjob {got.namespace}/{got.name} created")


@job_app.command("list")
def list_jobs(
    kubeconfig: Path | None = KUBECONFIG,
    namespace: str | None = NAMESPACE,
    platform: str = PLATFORM,
    env: str | None = ENV,
    as_json: bool = JSON,
) -> None:
    """The TrainingJobs of the namespace: phase, replicas per role, last plan, and whether
    each is queued, admitted or suspended (with why)."""

    async def work(kube: Platform) -> list[JobEntry]:
        return (await kube.list_jobs())[0]

    found = sorted(
        _run(kubeconfig, namespace, work, platform=platform, env=env), key=lambda j: j.name
    )
    if as_json:
        print_json([_document(j) for j in found])
        return
    for job in found:
        if not isinstance(job, JobView):
            typer.echo(f"{job.name:30} {'Invalid':10} {job.reason}")
            continue
        seen = job.status.roles if job.status is not None else {}
        roles = " ".join(
            f"{name}={(seen.get(name) or {}).get('running', 0)}/{role.replicas}"
            for name, role in sorted(job.roles.items())
        )
        state = admission(job)
        said = f"  {state['state']} ({state['reason']}: {state['message']})" if state else ""
        typer.echo(
            f"{job.name:30} {job.phase or '-':10} {roles}  last-plan={job.last_plan_id or '-'}"
            + said
        )


def _document(job: JobEntry) -> dict[str, Any]:
    """The job as its platform keeps it (a job that does not read: its name and why)."""
    if isinstance(job, JobView):
        return dict(job.document)
    return {"metadata": {"name": job.name, "uid": job.uid}, "error": job.reason}


@job_app.command("describe")
def describe(
    name: str,
    kubeconfig: Path | None = KUBECONFIG,
    namespace: str | None = NAMESPACE,
    platform: str = PLATFORM,
    env: str | None = ENV,
    as_json: bool = json_option("JSON: the TrainingJob object and its pods"),
) -> None:
    """One job: roles (desired, resources, pod counts), status and its pods."""

    async def work(kube: Platform) -> tuple[JobView, list[PodView]]:
        job = await job_of(kube, name)
        pods, _ = await kube.list_pods(name)
        return job, pods

    job, pods = _run(kubeconfig, namespace, work, platform=platform, env=env)
    pods = sorted(pods, key=lambda p: p.name)
    if as_json:
        print_json({"job": dict(job.document), "pods": [dataclasses.asdict(p) for p in pods]})
        return
    status = job.status
    typer.echo(f"name:      {job.namespace}/{job.name} (uid {job.uid})")
    typer.echo(f"phase:     {job.phase or '-'}")
    state = admission(job)
    if state is not None:
        typer.echo(f"admission: {state['state']} ({state['reason']}): {state['message']}")
    last, at = (status.last_plan_id, status.last_plan_time) if status else (None, None)
    typer.echo(f"last plan: {last or '-'} at {at or '-'}")
    for role_name, role in sorted(job.roles.items()):
        seen = (status.roles if status else {}).get(role_name) or {}
        low, high = (
            "-" if bound is None else bound for bound in (role.min_replicas, role.max_replicas)
        )
        order = f" after {', '.join(role.start_after)}" if role.start_after else ""
        ready = sum(1 for p in pods if p.role == role_name and p.ready and not p.deleting)
        typer.echo(
            f"role {role_name}: {role.replicas} replicas [{low}, {high}] resources "
            f"{role.resources.describe()} restart {role.restart_policy}{order}; "
            + ", ".join([*(f"{k} {v}" for k, v in sorted(seen.items())), f"ready {ready}"])
        )
    for pod in pods:
        said = " (deleting)" if pod.deleting else " (ready)" if pod.ready else ""
        on = f" on {pod.node_name}" if pod.node_name else ""
        typer.echo(f"  pod {pod.name}: {pod.phase}{on}{said}")


@job_app.command("scale")
def scale(
    name: str,
    role: str = typer.Option("worker", "--role", "-r"),
    replicas: int = typer.Option(..., "--replicas", min=1, help="a plan cannot say 0"),
    env: str | None = ENV,
    kubeconfig: Path | None = KUBECONFIG,
    namespace: str | None = NAMESPACE,
    platform: str = PLATFORM,
) -> None:
    """Publish a ScalePlan for one role of the job; the env's operator applies it once."""

    async def work(kube: Platform) -> ScalePlan:
        async with Producer(load_settings()) as producer:
            return await scale_job(
                kube, producer, await _real_env(env), name, role, replicas, source="cli"
            )

    plan = _run(kubeconfig, namespace, work, platform=platform, env=env)
    typer.echo(f"plan {plan.plan_id} published to {plan.env}.scale.plans: {name} {role}={replicas}")


def _act(
    action: Callable[..., Awaitable[ScalePlan]],
    name: str,
    env: str | None,
    kubeconfig: Path | None,
    namespace: str | None,
    platform: str,
) -> ScalePlan:
    async def work(kube: Platform) -> ScalePlan:
        async with Producer(load_settings()) as producer:
            return await action(kube, producer, await _real_env(env), name, source="cli")

    return _run(kubeconfig, namespace, work, platform=platform, env=env)


@job_app.command("suspend")
def suspend(
    name: str,
    env: str | None = ENV,
    kubeconfig: Path | None = KUBECONFIG,
    namespace: str | None = NAMESPACE,
    platform: str = PLATFORM,
) -> None:
    """Publish the ScalePlan that suspends the job: its pods stop after their checkpoint
    (SIGTERM, then their grace period); the job and its progress are kept."""
    plan = _act(suspend_job, name, env, kubeconfig, namespace, platform)
    typer.echo(f"plan {plan.plan_id} published to {plan.env}.scale.plans: suspend {name}")


@job_app.command("resume")
def resume(
    name: str,
    env: str | None = ENV,
    kubeconfig: Path | None = KUBECONFIG,
    namespace: str | None = NAMESPACE,
    platform: str = PLATFORM,
) -> None:
    """Publish the ScalePlan that resumes (or admits) a suspended job at its size; its
    training goes on from its checkpoint."""
    plan = _act(resume_job, name, env, kubeconfig, namespace, platform)
    typer.echo(f"plan {plan.plan_id} published to {plan.env}.scale.plans: resume {name}")


@job_app.command("delete")
def delete(
    name: str,
    kubeconfig: Path | None = KUBECONFIG,
    namespace: str | None = NAMESPACE,
    platform: str = PLATFORM,
    env: str | None = ENV,
) -> None:
    """Delete the job; the operator deletes its pods."""

    async def work(kube: Platform) -> None:
        await delete_job(kube, name)

    _run(kubeconfig, namespace, work, platform=platform, env=env)
    typer.echo(f"trainingjob {name} deleted")


__all__ = ["job_app", "scale_plan_id"]
