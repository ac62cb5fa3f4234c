"""Cluster credentials and the namespace to work in, the same way for every service.

Credentials: an explicit kubeconfig, then $KUBECONFIG (its first file), then
~/.kube/config when it exists, else the pod's service account (in-cluster). Namespace: the
one asked for, else the kubeconfig context's, else the pod's, else ``default``.

Each ApiClient gets a Configuration of its own: nothing is set as the process-wide default,
so two services in one process (``up``) with different credentials never share them.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import yaml  # type: ignore[import-untyped,unused-ignore]
from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

from dlrover_events.errors import UserError

#: where a pod's service account is mounted (token, ca.crt, namespace)
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_NAMESPACE = "default"


def kubeconfig_path(explicit: Path | None) -> Path | None:
    """The kubeconfig to use, or None for in-cluster credentials."""
    if explicit is not None:
        return explicit.expanduser()
    if env := os.environ.get("KUBECONFIG"):
        return Path(env.split(os.pathsep)[0]).expanduser()
    default = Path.home() / ".kube" / "config"
    return default if default.exists() else None


def context_namespace(path: Path, context: str | None) -> str | None:
    """The namespace the kubeconfig's context (named, else the current one) names."""
    contexts, active = config.list_kube_config_contexts(config_file=str(path))
    chosen = next((c for c in contexts if c["name"] == context), active)
    namespace = ((chosen or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else None


def pod_namespace(service_account: Path = SERVICE_ACCOUNT) -> str:
    """The pod's own namespace, from its service account; ``default`` outside a pod."""
    file = service_account / "namespace"
    if not file.exists():
        return DEFAULT_NAMESPACE
    return file.read_text().strip() or DEFAULT_NAMESPACE


async def connect(
    kubeconfig: Path | None,
    context: str | None,
    namespace: str | None,
    *,
    hint: str,
    service_account: Path = SERVICE_ACCOUNT,
) -> tuple[client.ApiClient, str]:
    """An ApiClient with the cluster's credentials, and the namespace to work in.

    Every mistake the user can fix (a kubeconfig that is missing or unreadable, a context
    it lacks, no credentials at all) is a one-line UserError; ``hint`` says which setting
    fixes the last one (each service has its own).
    """
    path = kubeconfig_path(kubeconfig)
    if path is not None:
        if not path.exists():
            raise UserError(f"kubeconfig {path} does not exist")
        try:
            api = await config.new_client_from_config(config_file=str(path), context=context)
            if not namespace:
                namespace = await asyncio.to_thread(context_namespace, path, context)
        except (config.ConfigException, OSError, ValueError, yaml.YAMLError) as e:
            raise UserError(f"kubeconfig {path}: {_first_line(e)}") from None
        return api, namespace or DEFAULT_NAMESPACE
    configuration = type.__call__(client.Configuration)  # not a copy of any default
    loader = InClusterConfigLoader(
        token_filename=str(service_account / "token"),
        cert_filename=str(service_account / "ca.crt"),
    )
    try:
        loader.load_and_set(configuration)
    except config.ConfigException as e:
        raise UserError(
            f"no cluster credentials: no kubeconfig and not in a pod ({e}); {hint}"
        ) from None
    if not namespace:
        namespace = await asyncio.to_thread(pod_namespace, service_account)
    return client.ApiClient(configuration), namespace


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


__all__ = [
    "DEFAULT_NAMESPACE",
    "SERVICE_ACCOUNT",
    "connect",
    "context_namespace",
    "kubeconfig_path",
    "pod_namespace",
]
