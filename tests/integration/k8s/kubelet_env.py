"""What the kubelet makes of a container spec, for running one as a process: its
environment (envFrom, then env; ConfigMap, Secret and field references resolved) and its
command line, with Kubernetes' `$(VAR)` expansion."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion of `$(VAR)` (k8s.io/kubernetes third_party expansion): a
    defined VAR is replaced by its value, an undefined one is left as written, and `$$`
    is a literal `$` (so `$$(VAR)` stays `$(VAR)`)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def container_environment(
    container: Mapping[str, Any],
    *,
    fields: Mapping[str, str],
    config_maps: Mapping[str, Mapping[str, str]],
    secrets: Mapping[str, Mapping[str, str]],
) -> dict[str, str]:
    """The container's variables as the kubelet sets them: every `envFrom` source first,
    then `env` in order (a later one wins; `value`s are expanded against what is defined
    so far). ``fields`` answers `fieldRef`s (metadata.name, metadata.namespace); a missing
    ConfigMap, Secret or key that is not `optional` is an error, as it is for a pod."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            ref, found = source["configMapRef"], config_maps
        else:
            ref, found = source["secretRef"], secrets
        if ref["name"] not in found:
            assert ref.get("optional"), f"envFrom: no {ref['name']}"
            continue
        env.update({prefix + k: v for k, v in found[ref["name"]].items()})
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var:
            env[name] = expand(var["value"], env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[name] = fields[source["fieldRef"]["fieldPath"]]
            continue
        if "configMapKeyRef" in source:
            ref, found = source["configMapKeyRef"], config_maps
        else:
            ref, found = source["secretKeyRef"], secrets
        value = found.get(ref["name"], {}).get(ref["key"])
        if value is None:
            assert ref.get("optional"), f"{name}: no key {ref['key']} in {ref['name']}"
            continue
        env[name] = value
    return env


def command_line(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args, each expanded against the container's environment."""
    return [expand(a, env) for a in [*container.get("command", []), *container.get("args", [])]]
