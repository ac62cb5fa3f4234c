"""A fresh install's setup (`dlrover-events bootstrap`, the install's bootstrap Job), made
so that running it again changes nothing and says so.

In order: the Postgres migrations (the registry's and every env's); the real env and the
standby env the watchdog promotes, with their settings (a standby given none is made with
the real env's, as stored then; the registry's create and settings
change: the path `env create --settings` and `env settings` take; an existing env keeps
settings changed since, unless told to apply the given ones) and their topics (unless
`create_topics` is off: then they are only checked); then the gateway tokens each env
needs: an ``admin`` token (the admin API, the local jobs API) and a ``read`` token (what a
training pod follows its plan and reads its config with; the console). A token is kept
where the install keeps secrets (Kubernetes Secrets in a cluster, files elsewhere) and is
minted only when none is kept there, or when asked to rotate (the old one is revoked).
Only the SHA-256 of a token is stored in Postgres, so the kept copy is the token: one kept
but unknown to Postgres (a new database) is registered again, one revoked on purpose is
replaced.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from kubernetes_asyncio import client

from dlrover_events.bus.admin import TopicAdmin
from dlrover_events.bus.topics import ENV_TOPICS, check_env_name, topic
from dlrover_events.envs.registry import EnvRecord, EnvRegistry
from dlrover_events.envs.tokens import Scope, Tokens, new_token, token_env, token_id_of
from dlrover_events.errors import UserError
from dlrover_events.kube.secrets import read_secret_key, write_secret_key
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from dlrover_events.store.database import REGISTRY_SCHEMA, connect, env_schema, quote_ident
from dlrover_events.store.migrations import apply_migrations
from schemas.control import EnvMode

#: the Secret (key: the env) holding each env's token of a scope; the operator hands the
#: read one to training pods by secretKeyRef (`handlers/operator/kube`)
TOKEN_SECRETS: Mapping[Scope, str] = {
    Scope.ADMIN: "dlrover-events-admin-token",
    Scope.READ: "dlrover-events-gateway-read",
}
#: the name a bootstrap token has in `gateway-token list`
TOKEN_NAMES: Mapping[Scope, str] = {
    Scope.ADMIN: "bootstrap: admin",
    Scope.READ: "bootstrap: read (training pods, console)",
}


@dataclass(frozen=True)
class EnvSpec:
    """An env the install needs: its name, the mode it is made with, and its settings
    (None: the defaults when it is made, and what is stored left alone after)."""

    name: str
    mode: EnvMode
    settings: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class BootstrapPlan:
    envs: Sequence[EnvSpec]
    partitions: int | None = None
    rotate: bool = False
    #: an existing env whose settings differ from those given gets them (else: kept)
    apply_settings: bool = False


class TokenKeeper(Protocol):
    """Where the install keeps its tokens (a cluster's Secrets, a folder)."""

    def where(self, env: str, scope: Scope) -> str: ...

    async def read(self, env: str, scope: Scope) -> str | None: ...

    async def write(self, env: str, scope: Scope, token: str) -> list[str]:
        """Keep ``token``; returns the places that changed (none: all held it already)."""
        ...


class TokenFiles:
    """``<dir>/<env>.<scope>.token``, owner-only (outside a cluster)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, env: str, scope: Scope) -> Path:
        return self.folder / f"{env}.{scope.value}.token"

    def where(self, env: str, scope: Scope) -> str:
        return str(self.path(env, scope))

    async def read(self, env: str, scope: Scope) -> str | None:
        path = self.path(env, scope)
        try:
            return path.read_text().strip() or None
        except FileNotFoundError:
            return None
        except OSError as err:
            raise UserError(f"cannot read {path}: {err.strerror}") from None

    async def write(self, env: str, scope: Scope, token: str) -> list[str]:
        if await self.read(env, scope) == token:
            return []
        path = self.path(env, scope)
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(token + "\n")
        except OSError as err:
            raise UserError(f"cannot write {path}: {err.strerror}") from None
        return [str(path)]


class TokenSecrets:
    """Each scope's Secret (`TOKEN_SECRETS`, one key per env) in the install's namespace;
    the read one also in every namespace where training pods run (a secretKeyRef reads a
    Secret of the pod's own namespace)."""

    def __init__(
        self, api: client.ApiClient, namespace: str, jobs_namespaces: Sequence[str] = ()
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.jobs_namespaces = [n for n in dict.fromkeys(jobs_namespaces) if n != namespace]

    def namespaces(self, scope: Scope) -> list[str]:
        return [self.namespace, *(self.jobs_namespaces if scope == Scope.READ else [])]

    def where(self, env: str, scope: Scope) -> str:
        return f"Secret {self.namespace}/{TOKEN_SECRETS[scope]} (key {env})"

    async def read(self, env: str, scope: Scope) -> str | None:
        return await read_secret_key(self.api, self.namespace, TOKEN_SECRETS[scope], env)

    async def write(self, env: str, scope: Scope, token: str) -> list[str]:
        name = TOKEN_SECRETS[scope]
        return [
            f"Secret {namespace}/{name}"
            for namespace in self.namespaces(scope)
            if await write_secret_key(self.api, namespace, name, env, token)
        ]


@dataclass
class Report:
    """What bootstrap did, line by line; ``changes`` counts the lines that changed something."""

    say: Callable[[str], None]
    changes: int = 0
    lines: list[str] = field(default_factory=list)

    def changed(self, line: str) -> None:
        self.changes += 1
        self._say(line)

    def same(self, line: str) -> None:
        self._say(line)

    def _say(self, line: str) -> None:
        self.lines.append(line)
        self.say(line)


async def migrate(dsn: str, report: Report) -> None:
    """The registry's migrations, then every env's (an upgrade brings new tables)."""
    conn = await connect(dsn)
    try:
        applied = await apply_migrations(conn, REGISTRY_SCHEMA, "registry")
        _said(report, "registry", applied)
        rows = await conn.fetch(
            f"SELECT name FROM {quote_ident(REGISTRY_SCHEMA)}.envs"
            " WHERE deleting_since IS NULL ORDER BY name"
        )
        names = [r["name"] for r in rows]
        for name in names:
            _said(report, f"env {name}", await apply_migrations(conn, env_schema(name), "env"))
    finally:
        await conn.close()


def _said(report: Report, what: str, applied: list[int]) -> None:
    if applied:
        report.changed(f"migrations of {what}: applied {', '.join(map(str, applied))}")
    else:
        report.same(f"migrations of {what}: up to date")


async def ensure_env(
    registry: EnvRegistry,
    spec: EnvSpec,
    existing_topics: set[str],
    partitions: int | None,
    report: Report,
    *,
    apply_settings: bool = False,
) -> EnvRecord:
    """The env as the install needs it. One that exists keeps its mode: after a failover
    the standby is the real env and the old one virtual, and a re-run leaves it so."""
    record = await registry.get(spec.name)
    if record is None:
        if spec.mode == EnvMode.REAL and (real := await registry.real()) is not None:
            raise UserError(
                f"env {real.name!r} is the real env already; bootstrap it (--env {real.name}) "
                f"or promote {spec.name!r} later (`env promote`)"
            )
        record = await registry.create(
            spec.name, spec.mode, partitions=partitions, settings=dict(spec.settings or {})
        )
        report.changed(
            f"env {record.name}: created ({record.mode.value}, {record.partitions} partitions"
            f"{', with the settings given' if spec.settings else ''})"
        )
    else:
        await registry.create(spec.name, record.mode, exist_ok=True)  # topics, migrations
        moved = "" if record.mode == spec.mode else f" (not {spec.mode.value}: left as it is)"
        report.same(f"env {record.name}: exists, {record.mode.value}{moved}")
        if spec.settings is not None and dict(spec.settings) != record.settings:
            given = dict(spec.settings)
            if apply_settings:  # the path of `env settings NAME --file FILE`
                record, _ = await registry.change_settings(
                    spec.name, lambda _: given, reason="bootstrap --apply-settings"
                )
                report.changed(
                    f"env {record.name}: settings changed to those given "
                    f"(version {record.settings_version})"
                )
            else:  # changed since (`env settings`, live tuning): a re-run keeps that
                report.same(
                    f"env {record.name}: its settings differ from those given: left as they "
                    "are (--apply-settings, or `env settings --file`, changes them)"
                )
    missing = [topic(record.name, t.name) for t in ENV_TOPICS]
    made = [t for t in missing if t not in existing_topics]
    if made:
        report.changed(f"env {record.name}: topics created: {len(made)}")
    return record


async def ensure_token(
    dsn: str, env: str, scope: Scope, keeper: TokenKeeper, rotate: bool, report: Report
) -> None:
    """The env's token of ``scope`` kept and active; minted only when it must be."""
    where = keeper.where(env, scope)
    kept = await keeper.read(env, scope)
    if kept is not None and token_env(kept) != env:
        raise UserError(f"{where} does not hold a token of env {env!r}; remove it or --rotate")
    store = await EnvStore.open(dsn, env, max_size=1)
    try:
        tokens = Tokens(store.pool, env)
        state = "unknown" if kept is None else await tokens.state(kept)
        if kept is not None and state == "active" and not rotate:
            places = await keeper.write(env, scope, kept)  # copies a new place lacks
            if places:
                report.changed(f"{scope.value} token of {env}: copied to {', '.join(places)}")
            else:
                report.same(f"{scope.value} token of {env}: kept in {where}")
            return
        if kept is not None and state == "unknown" and not rotate:
            token_id = token_id_of(kept)
            assert token_id is not None  # token_env matched the same pattern
            await tokens.add(token_id, kept, TOKEN_NAMES[scope], [scope])
            await keeper.write(env, scope, kept)
            report.changed(f"{scope.value} token of {env}: the one in {where} registered again")
            return
        token_id, token = new_token(env)
        # kept first: a failure after it leaves a token that the next run registers
        await keeper.write(env, scope, token)
        await tokens.add(token_id, token, TOKEN_NAMES[scope], [scope])
        why = (
            "rotated"
            if rotate and kept is not None
            else "the kept one was revoked: minted anew"
            if kept is not None
            else "minted"
        )
        if kept is not None and state == "active":
            old = token_id_of(kept)
            if old is not None:
                await tokens.revoke(old)
                why += f" (the old one, {old}, is revoked)"
        report.changed(f"{scope.value} token of {env}: {why}; kept in {where}")
    finally:
        await store.close()


async def bootstrap(
    settings: Settings, dsn: str, plan: BootstrapPlan, keeper: TokenKeeper, report: Report
) -> None:
    """Migrations, envs, topics, tokens, in that order; see the module's docstring."""
    for spec in plan.envs:
        check_env_name(spec.name)
    await migrate(dsn, report)
    registry = EnvRegistry(settings, dsn)
    async with TopicAdmin(settings) as admin:
        existing = set(await admin.list_topics())
    real: EnvRecord | None = None
    for spec in plan.envs:
        made_as_real = spec.mode == EnvMode.VIRTUAL and spec.settings is None and real is not None
        if made_as_real and await registry.get(spec.name) is None:
            assert real is not None
            spec = replace(spec, settings=real.settings)  # a standby is made as the real env is
        record = await ensure_env(
            registry, spec, existing, plan.partitions, report, apply_settings=plan.apply_settings
        )
        if record.mode == EnvMode.REAL:
            real = record
    for spec in plan.envs:
        for scope in (Scope.ADMIN, Scope.READ):
            await ensure_token(dsn, spec.name, scope, keeper, plan.rotate, report)


__all__ = [
    "TOKEN_NAMES",
    "TOKEN_SECRETS",
    "BootstrapPlan",
    "EnvSpec",
    "Report",
    "TokenFiles",
    "TokenKeeper",
    "TokenSecrets",
    "bootstrap",
    "ensure_env",
    "ensure_token",
    "migrate",
]
