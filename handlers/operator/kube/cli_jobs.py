"""`dlrover-events job submit|list|describe|scale|delete`: TrainingJobs from a terminal.

submit/list/describe/delete talk to the cluster with the user's own kubeconfig, as kubectl
does (scale and delete through handlers.operator.job_actions, as the console's actions and
the jobs API do). `scale` does not patch the job: it publishes a ScalePlan to the env's
scale.plans, so a scale by hand goes the way the brain's do (once, recorded, answered
with a ScaleResult). Its plan_id is derived from the request and the job's generation:
the same command repeated before it applied is the same plan, applied once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import typer
import yaml  # type: ignore[import-untyped,unused-ignore]
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.bus.producer import Producer
from dlrover_events.cli.params import env_name, json_option, print_json
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.runtime.fence import serving
from dlrover_events.settings import load_settings
from dlrover_events.store.database import connect
from handlers.operator.job_actions import JobNotFound, delete_job, open_platform, scale_job
from handlers.operator.jobs import JobRequestError, scale_plan_id, submission
from handlers.operator.kube.client import KubeApi, api_error
from handlers.operator.kube.trainingjob import TRAINING_JOB
from handlers.operator.local.cluster import ANN_WORKDIR
from handlers.operator.platform import Platform
from schemas.plans import ScalePlan

T = TypeVar("T")

job_app = typer.Typer(help="TrainingJobs on the cluster: submit, list, describe, scale, delete.")

KUBECONFIG = typer.Option(None, "--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config")
NAMESPACE = typer.Option(None, "--namespace", "-n", help="default: the context's")


PLATFORM = typer.Option(
    "kubernetes", "--platform", help="where the jobs run: kubernetes, or local (this machine)"
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


#: What runs an env's TrainingJobs on the local platform: `up`'s service, or the `operator`
#: command (each holds its service's lock while it runs: dlrover_events.runtime.fence).
LOCAL_OPERATORS = ("local", "operator")


async def _check_operator(env: str | None) -> None:
    """Refuse, in one line, a local job that no operator would start."""
    target = await _real_env(env)
    conn = await connect((await resolve_postgres(load_settings())).dsn)
    try:
        running = await serving(conn, target, LOCAL_OPERATORS)
    finally:
        await conn.close()
    if not running:
        raise UserError(
            f"no operator runs env {target!r}, so nothing would start the job: start one "
            f"(`dlrover-events up`, or `dlrover-events operator --env {target} --platform "
            "local`), or pass --queue to create it now and let it wait for one"
        )


def _run(
    kubeconfig: Path | None,
    namespace: str | None,
    work: Callable[[Platform], Awaitable[T]],
    *,
    platform: str = "kubernetes",
    env: str | None = None,
) -> T:
    """``work`` against the platform's jobs: the cluster with the user's kubeconfig, or
    the local platform's job objects of the env (the real one unless named)."""

    async def go() -> T:
        try:
            target = await _real_env(env) if platform == "local" else (env or "")
            async with open_platform(
                load_settings(), target, platform, kubeconfig=kubeconfig, namespace=namespace
            ) as kube:
                try:
                    return await work(kube)
                except (aiohttp.ClientError, OSError, TimeoutError) as e:
                    if platform == "local":
                        raise
                    # the user's kubeconfig or network: say where, in one line
                    why = str(e).splitlines()[0] if str(e) else type(e).__name__
                    host = kube.api.configuration.host if isinstance(kube, KubeApi) else "?"
                    raise UserError(f"cannot reach the cluster at {host}: {why}") from None
                except JobRequestError as e:
                    raise UserError(str(e)) from None
        except ApiException as e:
            raise UserError(api_error(e)) from None

    return asyncio.run(go())


@job_app.command("submit")
def submit(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="a TrainingJob YAML"),
    kubeconfig: Path | None = KUBECONFIG,
    namespace: str | None = NAMESPACE,
    platform: str = PLATFORM,
    env: str | None = ENV,
    queue: bool = typer.Option(
        False,
        "--queue",
        help="create it even when no operator runs the env (local platform): it waits",
    ),
) -> None:
    """Create the TrainingJob of FILE (checked first for what the schema cannot check).
    On the local platform its commands run in the current directory, and an operator
    must run the env (else it says so, unless --queue)."""
    try:
        docs = [d for d in yaml.safe_load_all(file.read_text()) if d]
    except yaml.YAMLError as e:
        raise UserError(f"{file} is not YAML: {str(e).splitlines()[0]}") from None
    if len(docs) != 1:
        raise UserError(f"{file} must hold one {TRAINING_JOB.kind}")
    try:
        body = submission(
            docs[0],
            workdir=str(Path.cwd()) if platform == "local" else None,
            annotation=ANN_WORKDIR,
        )
    except JobRequestError as e:
        raise UserError(f"{file}: {e}") from None

    async def work(kube: Platform) -> dict[str, Any]:
        return await kube.create_job(body)

    if platform == "local" and not queue:
        asyncio.run(_check_operator(env))
    got = _run(kubeconfig, namespace, work, platform=platform, env=env)
    typer.echo(f"trainingjob {got['metadata']['namespace']}/{got['metadata']['name']} created")


@job_app.command("list")
def list_jobs(
    kubeconfig: Path | None = KUBECONFIG,
    namespace: str | None = NAMESPACE,
    platform: str = PLATFORM,
    env: str | None = ENV,
    as_json: bool = JSON,
) -> None:
    """The TrainingJobs of the namespace: phase, replicas per role, last plan."""

    async def work(kube: Platform) -> list[dict[str, Any]]:
        return (await kube.list_jobs())[0]

    found = sorted(
        _run(kubeconfig, namespace, work, platform=platform, env=env),
        key=lambda o: o["metadata"]["name"],
    )
    if as_json:
        print_json(found)
        return
    for obj in found:
        status = obj.get("status") or {}
        roles = " ".join(
            f"{name}={(status.get('roles') or {}).get(name, {}).get('running', 0)}/"
            f"{role.get('replicas', 0)}"
            for name, role in sorted((obj.get("spec", {}).get("roles") or {}).items())
        )
        typer.echo(
            f"{obj['metadata']['name']:30} {status.get('phase', '-'):10} {roles}  "
            f"last-plan={status.get('lastPlanId', '-')}"
        )


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

    async def work(kube: Platform) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        obj = await kube.get_job(name)
        if obj is None:
            raise JobNotFound(f"no trainingjob {name!r} in namespace {kube.namespace}")
        pods, _ = await kube.list_pods(f"{TRAINING_JOB.pod_selector()}={name}")
        return obj, pods

    obj, pods = _run(kubeconfig, namespace, work, platform=platform, env=env)
    if as_json:
        print_json({"job": obj, "pods": pods})
        return
    meta, status = obj["metadata"], obj.get("status") or {}
    typer.echo(f"name:      {meta['namespace']}/{meta['name']} (uid {meta['uid']})")
    typer.echo(f"phase:     {status.get('phase', '-')}")
    typer.echo(f"last plan: {status.get('lastPlanId', '-')} at {status.get('lastPlanTime', '-')}")
    for role, spec in sorted(obj["spec"]["roles"].items()):
        seen = (status.get("roles") or {}).get(role, {})
        bounds = f"[{spec.get('minReplicas', '-')}, {spec.get('maxReplicas', '-')}]"
        typer.echo(
            f"role {role}: {spec['replicas']} replicas {bounds} resources "
            f"{spec.get('resources', {})} restart {spec.get('restartPolicy', '-')}; "
            + ", ".join(f"{k} {v}" for k, v in sorted(seen.items()))
        )
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        deleting = " (deleting)" if pod["metadata"].get("deletionTimestamp") else ""
        phase = (pod.get("status") or {}).get("phase", "Pending")
        typer.echo(f"  pod {pod['metadata']['name']}: {phase}{deleting}")


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
