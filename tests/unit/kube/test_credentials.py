"""One credentials loader for every service (the operator, the gateway's ConfigMaps):
which kubeconfig, which context, which namespace; in a pod, the service account; and
every mistake a user can fix said in one line. No cluster is needed: loading credentials
makes no call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import certifi
import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]
from kubernetes_asyncio import client

from dlrover_events.errors import UserError
from dlrover_events.kube.credentials import connect, kubeconfig_path, pod_namespace

HINT = "set DLROVER_EVENTS_TEST_KUBECONFIG"


def kubeconfig(path: Path, current: str, contexts: dict[str, str | None]) -> Path:
    """A kubeconfig with one cluster per context (server https://<context>.test:6443),
    each context in the namespace given (None: none)."""
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "clusters": [
            {"name": c, "cluster": {"server": f"https://{c}.test:6443"}} for c in contexts
        ],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [
            {
                "name": c,
                "context": {"cluster": c, "user": "u", **({"namespace": ns} if ns else {})},
            }
            for c, ns in contexts.items()
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def no_ambient(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Neither $KUBECONFIG nor ~/.kube/config nor a pod: only what a test sets."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)
    return home


Connect = Callable[..., Any]


@pytest.fixture
async def connected() -> AsyncIterator[Connect]:
    """``connect``, whose ApiClients are closed at the end."""
    made: list[client.ApiClient] = []

    async def go(*args: Any, **kwargs: Any) -> tuple[client.ApiClient, str]:
        api, namespace = await connect(*args, hint=HINT, **kwargs)
        made.append(api)
        return api, namespace

    yield go
    for api in made:
        await api.close()


async def test_namespace_is_the_one_asked_else_the_contexts_else_default(
    no_ambient: Path, tmp_path: Path, connected: Connect
) -> None:
    path = kubeconfig(tmp_path / "kc", "east", {"east": "team-e", "west": "team-w", "bare": None})
    api, ns = await connected(path, None, None)
    assert (api.configuration.host, ns) == ("https://east.test:6443", "team-e")
    api, ns = await connected(path, "west", None)
    assert (api.configuration.host, ns) == ("https://west.test:6443", "team-w")
    api, ns = await connected(path, "west", "mine")
    assert ns == "mine"
    api, ns = await connected(path, "bare", None)
    assert (api.configuration.host, ns) == ("https://bare.test:6443", "default")
    api, ns = await connected(path, None, "")  # empty is unset, as in the settings
    assert ns == "team-e"


async def test_kubeconfig_from_the_environment_then_home(
    no_ambient: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connected: Connect
) -> None:
    assert kubeconfig_path(None) is None
    home_config = no_ambient / ".kube" / "config"
    home_config.parent.mkdir()
    kubeconfig(home_config, "home", {"home": "h"})
    assert kubeconfig_path(None) == home_config
    first = kubeconfig(tmp_path / "first", "one", {"one": "n1"})
    monkeypatch.setenv("KUBECONFIG", f"{first}:{tmp_path / 'second'}")
    api, ns = await connected(None, None, None)
    assert (api.configuration.host, ns) == ("https://one.test:6443", "n1")
    assert kubeconfig_path(tmp_path / "explicit") == tmp_path / "explicit"


@pytest.mark.parametrize(
    ("setup", "context", "says"),
    [
        ("missing", None, "does not exist"),
        ("unknown-context", "nowhere", "nowhere"),
        ("not-yaml", None, "kubeconfig"),
    ],
)
async def test_a_kubeconfig_mistake_is_one_line(
    no_ambient: Path, tmp_path: Path, connected: Connect, setup: str, context: str | None, says: str
) -> None:
    path = tmp_path / "kc"
    if setup == "unknown-context":
        kubeconfig(path, "east", {"east": "e"})
    elif setup == "not-yaml":
        path.write_text("clusters: [unclosed\n")
    with pytest.raises(UserError) as got:
        await connected(path, context, None)
    message = str(got.value)
    assert says in message and str(path) in message and "\n" not in message, message


def service_account(root: Path, namespace: str | None) -> Path:
    root.mkdir()
    (root / "token").write_text("sa-token")
    # any real PEM does: the client loads it, and no call is made
    (root / "ca.crt").write_text(Path(certifi.where()).read_text())
    if namespace is not None:
        (root / "namespace").write_text(f"{namespace}\n")
    return root


async def test_in_a_pod_the_service_account_and_its_namespace(
    no_ambient: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connected: Connect
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    sa = service_account(tmp_path / "sa", "jobs-ns")
    api, ns = await connected(None, None, None, service_account=sa)
    assert (api.configuration.host, ns) == ("https://10.0.0.1:443", "jobs-ns")
    assert api.configuration.api_key["BearerToken"] == "Bearer sa-token"
    _, ns = await connected(None, None, "asked", service_account=sa)
    assert ns == "asked"
    # Each client has its own Configuration: the process-wide default is left alone, so
    # another service of the same process never gets these credentials by accident.
    assert client.Configuration.get_default().host != "https://10.0.0.1:443"
    bare = service_account(tmp_path / "bare", None)
    _, ns = await connected(None, None, None, service_account=bare)
    assert ns == "default"
    assert pod_namespace(tmp_path / "nowhere") == "default"


async def test_no_credentials_at_all_says_which_setting_fixes_it(
    no_ambient: Path, tmp_path: Path, connected: Connect
) -> None:
    with pytest.raises(UserError) as got:
        await connected(None, None, None, service_account=tmp_path / "none")
    message = str(got.value)
    assert message.startswith("no cluster credentials") and HINT in message, message
    assert "\n" not in message
