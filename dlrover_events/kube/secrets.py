"""One key of a Secret, read and written: where the install keeps what it minted (the
gateway tokens that `bootstrap` makes and the operator hands to training pods by
secretKeyRef, never as a plain value).

A write touches only its key (other keys of the Secret stay) and creates the Secret when
it is missing; it says whether anything changed, so a re-run can say "nothing to do".
"""

from __future__ import annotations

import base64
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.errors import UserError
from dlrover_events.kube.api import api_error

#: labels of the Secrets the install makes (so `kubectl get secret -l` finds them)
LABELS = {
    "app.kubernetes.io/part-of": "dlrover-events",
    "app.kubernetes.io/managed-by": "dlrover-events-bootstrap",
}


async def read_secret_key(api: client.ApiClient, namespace: str, name: str, key: str) -> str | None:
    """The key's value, or None when the Secret or the key is missing."""
    try:
        secret = await client.CoreV1Api(api).read_namespaced_secret(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise UserError(f"cannot read Secret {namespace}/{name}: {api_error(e)}") from None
    data: dict[str, str] = secret.data or {}
    if key not in data:
        return None
    return base64.b64decode(data[key]).decode()


async def write_secret_key(
    api: client.ApiClient, namespace: str, name: str, key: str, value: str
) -> bool:
    """Set the key (creating the Secret if needed); False when it held ``value`` already."""
    if await read_secret_key(api, namespace, name, key) == value:
        return False
    core = client.CoreV1Api(api)
    data = {key: base64.b64encode(value.encode()).decode()}
    # a manifest as a dict (as the operator sends pods): the client serializes either
    body: Any = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": LABELS},
        "type": "Opaque",
        "data": data,
    }
    try:
        try:
            await core.create_namespaced_secret(namespace, body)
        except ApiException as e:
            if e.status != 409:  # exists: only our key changes
                raise
            await core.patch_namespaced_secret(name, namespace, {"data": data})
    except ApiException as e:
        raise UserError(f"cannot write Secret {namespace}/{name}: {api_error(e)}") from None
    return True


__all__ = ["LABELS", "read_secret_key", "write_secret_key"]
