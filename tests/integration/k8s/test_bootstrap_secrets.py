"""`dlrover-events bootstrap --tokens kubernetes` on the real kube-apiserver: the tokens
are kept in Secrets (the read one also in the namespace of the training pods, where a
pod's secretKeyRef finds it), and a re-run changes nothing."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from dlrover_events.envs.bootstrap import TOKEN_SECRETS
from dlrover_events.envs.tokens import Scope
from dlrover_events.settings import Settings
from tests.conftest import cli_environ, unique_env
from tests.integration.test_bootstrap import bootstrap, verdict

from .kube import create_namespace

pytestmark = pytest.mark.integration


async def secret_data(api: client.ApiClient, namespace: str, name: str) -> dict[str, str]:
    secret = await client.CoreV1Api(api).read_namespaced_secret(name, namespace)
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


async def test_tokens_go_into_secrets_once(
    own_settings: Settings, own_pg: str, kube: Path, api: client.ApiClient, namespace: str
) -> None:
    jobs = await create_namespace(api, "jobs")
    conf = own_settings  # its real env is announced to no other test's operator
    environ = cli_environ(conf, own_pg)
    real, standby = unique_env("prod"), unique_env("standby")
    args = [
        "--env",
        real,
        "--standby",
        standby,
        "--tokens",
        "kubernetes",
        "--kubeconfig",
        str(kube),
        "--namespace",
        namespace,
        "--jobs-namespace",
        jobs,
    ]
    code, out = await bootstrap(environ, *args)
    assert code == 0, out

    admin = await secret_data(api, namespace, TOKEN_SECRETS[Scope.ADMIN])
    read = await secret_data(api, namespace, TOKEN_SECRETS[Scope.READ])
    assert set(admin) == set(read) == {real, standby}
    for env in (real, standby):
        assert await verdict(own_pg, env, admin[env], Scope.ADMIN) == 200
        assert await verdict(own_pg, env, read[env], Scope.READ) == 200
    assert await secret_data(api, jobs, TOKEN_SECRETS[Scope.READ]) == read, (
        "the training pods' namespace holds the same read tokens"
    )
    with pytest.raises(client.ApiException) as missing:
        await secret_data(api, jobs, TOKEN_SECRETS[Scope.ADMIN])
    assert missing.value.status == 404, "the admin token stays in the install's namespace"

    # again, with one more namespace for training pods: only the copy is new
    more = await create_namespace(api, "jobs")
    code, out = await bootstrap(environ, *args, "--jobs-namespace", more)
    assert code == 0, out
    assert out.strip().splitlines()[-1] == "bootstrap: done (2 changes)", out
    assert await secret_data(api, more, TOKEN_SECRETS[Scope.READ]) == read
    assert await secret_data(api, namespace, TOKEN_SECRETS[Scope.ADMIN]) == admin

    code, out = await bootstrap(environ, *args, "--jobs-namespace", more)
    assert code == 0, out
    assert out.strip().splitlines()[-1] == "bootstrap: nothing to do (everything was in place)"
    assert await secret_data(api, namespace, TOKEN_SECRETS[Scope.READ]) == read
