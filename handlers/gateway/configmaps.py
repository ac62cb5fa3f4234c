"""Config documents from Kubernetes ConfigMaps, synced into the env's Postgres.

A ConfigMap labelled ``dlrover-events.io/config=true`` holds one document under its
``document.yaml`` key (Include / Exclude / Configure, optional priority). Postgres stays
the system of record: the ConfigMap is written there through ``ConfigStore``, like an
admin's change, so it reaches every gateway over ``<env>.config.changes`` and keeps a
history. The document is named ``cm.<namespace>.<name>``: the dots cannot be confused with
a name an admin would pick by accident, and each namespace's watcher owns only its prefix,
so two watchers (or the admin API) never delete each other's documents.

``dlrover-events.io/env=<env>`` narrows a ConfigMap to one env; without it, every env whose
gateway watches the namespace takes it. The label selector cannot say "this env or none",
so that choice is made here (``wanted``), not by the API server.

The deciding parts (ConfigMap -> document, desired vs current -> actions) are pure, so the
idempotence that matters (a re-list changes nothing) is tested without a cluster.
``ConfigMapSync`` applies their answer through the store; the watch lives in
``configmaps_runner``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import yaml  # type: ignore[import-untyped,unused-ignore]
from pydantic import ValidationError

from dlrover_events.config.matching import problems
from handlers.gateway.openapi import INT32
from handlers.gateway.store import ConfigStore, StoreError
from schemas.config import ConfigDocument

log = logging.getLogger(__name__)

LABEL = "dlrover-events.io/config"
ENV_LABEL = "dlrover-events.io/env"
DATA_KEY = "document.yaml"
PREFIX = "cm"
#: What a ConfigMap's document may say; name and version belong to the sync, not to it.
FIELDS = frozenset({"Include", "Exclude", "Configure", "priority"})
#: Writes that lost a race (another gateway replica, an admin) are re-planned this often.
RETRIES = 3

ConfigMap = Mapping[str, Any]


def selector() -> str:
    return f"{LABEL}=true"


def owned_prefix(namespace: str) -> str:
    return f"{PREFIX}.{namespace}."


def document_name(namespace: str, name: str) -> str:
    return f"{owned_prefix(namespace)}{name}"


def _meta(cm: ConfigMap) -> Mapping[str, Any]:
    meta = cm.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def cm_name(cm: ConfigMap) -> str:
    return str(_meta(cm).get("name") or "")


def wanted(cm: ConfigMap, env: str) -> bool:
    """Whether this env takes the ConfigMap: labelled for config, for this env or any."""
    labels = _meta(cm).get("labels") or {}
    return labels.get(LABEL) == "true" and labels.get(ENV_LABEL, env) == env


@dataclass(frozen=True, slots=True)
class Skipped:
    """A ConfigMap that says it holds a document but does not hold a usable one."""

    configmap: str
    reason: str


def _json_safe(value: Any) -> Any:
    """YAML's value as JSON would carry it, or a TypeError.

    What Postgres gives back is JSON; comparing the desired document with the stored one
    only holds still if both went through the same spelling (YAML dates become strings),
    and strict validation then judges it as the admin API judges a JSON body.
    """
    return orjson.loads(orjson.dumps(value))


def to_document(cm: ConfigMap, namespace: str, key: str = DATA_KEY) -> ConfigDocument | Skipped:
    """The document a ConfigMap holds, or why it cannot be one (never an exception)."""
    name = cm_name(cm)
    data = cm.get("data") or {}
    raw = data.get(key) if isinstance(data, Mapping) else None
    if not isinstance(raw, str):
        return Skipped(name, f"no {key!r} key in its data")
    try:
        parsed = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        return Skipped(name, f"{key} is not valid YAML: {err}")
    if parsed is None:
        parsed = {}
    if not isinstance(parsed, dict):
        return Skipped(name, f"{key} must be a mapping with Include, Exclude, Configure")
    unknown = sorted(str(k) for k in parsed if k not in FIELDS)
    if unknown:
        return Skipped(
            name,
            f"{key} may only hold {', '.join(sorted(FIELDS))}; not {', '.join(unknown)}"
            " (the name is the ConfigMap's, the version the gateway's)",
        )
    try:
        body = _json_safe(parsed)
    except TypeError as err:
        return Skipped(name, f"{key} is not representable as JSON: {err}")
    try:
        doc = ConfigDocument.model_validate_json(
            orjson.dumps({**body, "name": document_name(namespace, name)}), strict=True
        )
    except ValidationError as err:
        first = err.errors(include_url=False)
        where = ".".join(str(p) for p in first[0]["loc"]) if first else ""
        msg = first[0]["msg"] if first else str(err)
        return Skipped(name, f"{key} does not validate: {where}: {msg}")
    found = problems(doc)
    if not -INT32 <= doc.priority <= INT32:
        found.append(f"priority must be within ±{INT32}")
    if found:
        return Skipped(name, f"{key}: {'; '.join(found)}")
    return doc


@dataclass(frozen=True, slots=True)
class Desired:
    """What the ConfigMaps ask for: documents by name, and the names held back.

    A skipped name keeps whatever document it had: a typo in a ConfigMap must not take a
    working config away from running jobs.
    """

    documents: Mapping[str, ConfigDocument] = field(default_factory=dict)
    skipped: Mapping[str, Skipped] = field(default_factory=dict)


def entry(
    cm: ConfigMap, namespace: str, env: str, key: str = DATA_KEY
) -> ConfigDocument | Skipped | None:
    """One ConfigMap's part of ``Desired``; None: not this env's (or no longer labelled)."""
    if not wanted(cm, env):
        return None
    return to_document(cm, namespace, key)


def desired(
    configmaps: Iterable[ConfigMap], namespace: str, env: str, key: str = DATA_KEY
) -> Desired:
    docs: dict[str, ConfigDocument] = {}
    skipped: dict[str, Skipped] = {}
    for cm in configmaps:
        got = entry(cm, namespace, env, key)
        name = document_name(namespace, cm_name(cm))
        if isinstance(got, ConfigDocument):
            docs[name] = got
        elif isinstance(got, Skipped):
            skipped[name] = got
    return Desired(docs, skipped)


def content(doc: ConfigDocument) -> dict[str, Any]:
    """What a ConfigMap decides; version and updated_at are the store's bookkeeping."""
    return doc.model_dump(mode="json", by_alias=True, exclude={"version", "updated_at"})


@dataclass(frozen=True, slots=True)
class Create:
    document: ConfigDocument


@dataclass(frozen=True, slots=True)
class Update:
    document: ConfigDocument
    expected_version: int


@dataclass(frozen=True, slots=True)
class Delete:
    name: str
    expected_version: int


Action = Create | Update | Delete


def action_name(action: Action) -> str:
    return action.name if isinstance(action, Delete) else action.document.name


def plan(want: Desired, current: Mapping[str, ConfigDocument], prefix: str) -> list[Action]:
    """The writes that make ``current`` (live documents) what ``want`` asks, by name.

    Only names under ``prefix`` are ever deleted; equal content is never rewritten, so
    planning again from the result plans nothing.
    """
    actions: list[Action] = []
    for name in sorted(set(want.documents) | set(current)):
        doc = want.documents.get(name)
        have = current.get(name)
        if doc is not None:
            if have is None:
                actions.append(Create(doc))
            elif content(have) != content(doc):
                actions.append(Update(doc, have.version))
        elif have is not None and name.startswith(prefix) and name not in want.skipped:
            actions.append(Delete(name, have.version))
    return actions


@dataclass
class SyncReport:
    created: int = 0
    updated: int = 0
    deleted: int = 0

    @property
    def changes(self) -> int:
        return self.created + self.updated + self.deleted


class ConfigMapSync:
    """Keeps one namespace's ConfigMap documents of one env in its store.

    Fed whole lists (``replace_all``, after a (re)list) and single watch events
    (``observe``); both converge the same way, so a watch lost and re-listed ends where an
    unbroken one would have.
    """

    def __init__(self, store: ConfigStore, namespace: str, env: str, key: str = DATA_KEY) -> None:
        self.store = store
        self.namespace = namespace
        self.env = env
        self.key = key
        self.prefix = owned_prefix(namespace)
        #: ConfigMap name -> why its document is not synced; kept for operators to read.
        self.skipped: dict[str, str] = {}
        self.total = SyncReport()
        self._docs: dict[str, ConfigDocument] = {}
        self._held: dict[str, Skipped] = {}

    @property
    def want(self) -> Desired:
        return Desired(dict(self._docs), dict(self._held))

    async def replace_all(self, configmaps: Iterable[ConfigMap]) -> SyncReport:
        want = desired(configmaps, self.namespace, self.env, self.key)
        self._docs, self._held = dict(want.documents), dict(want.skipped)
        self._record_skipped()
        current = {d.name: d for d in await self.store.documents(prefix=self.prefix)}
        return await self._apply(plan(want, current, self.prefix))

    async def observe(self, event: str, cm: ConfigMap) -> SyncReport:
        """One watch event (ADDED, MODIFIED, DELETED) of one ConfigMap."""
        name = document_name(self.namespace, cm_name(cm))
        got = None if event == "DELETED" else entry(cm, self.namespace, self.env, self.key)
        self._docs.pop(name, None)
        self._held.pop(name, None)
        if isinstance(got, ConfigDocument):
            self._docs[name] = got
        elif isinstance(got, Skipped):
            self._held[name] = got
        self._record_skipped()
        report = SyncReport()
        await self._converge(name, report)
        self._add(report)
        return report

    async def _apply(self, actions: list[Action]) -> SyncReport:
        report = SyncReport()
        for action in actions:
            try:
                await self._do(action, report)
            except StoreError as err:  # lost a race: read again, plan again
                if err.status not in (404, 409):
                    raise
                await self._converge(action_name(action), report)
        self._add(report)
        return report

    async def _converge(self, name: str, report: SyncReport) -> None:
        want = Desired(
            {name: self._docs[name]} if name in self._docs else {},
            {name: self._held[name]} if name in self._held else {},
        )
        for attempt in range(RETRIES):
            have = await self.store.get(name)
            actions = plan(want, {name: have} if have is not None else {}, self.prefix)
            if not actions:
                return
            try:
                await self._do(actions[0], report)
                return
            except StoreError as err:
                if err.status not in (404, 409) or attempt == RETRIES - 1:
                    raise

    async def _do(self, action: Action, report: SyncReport) -> None:
        if isinstance(action, Create):
            await self.store.create(action.document)
            report.created += 1
        elif isinstance(action, Update):
            await self.store.update(action.document, action.expected_version)
            report.updated += 1
        else:
            await self.store.delete(action.name, action.expected_version)
            report.deleted += 1
        log.info("configmap sync (%s): %s", self.namespace, _describe(action))

    def _add(self, report: SyncReport) -> None:
        self.total.created += report.created
        self.total.updated += report.updated
        self.total.deleted += report.deleted

    def _record_skipped(self) -> None:
        now = {s.configmap: s.reason for s in self._held.values()}
        for cm, reason in now.items():
            if self.skipped.get(cm) != reason:
                log.warning(
                    "ConfigMap %s/%s skipped (its last good document, if any, stays): %s",
                    self.namespace,
                    cm,
                    reason,
                )
        self.skipped = now


def _describe(action: Action) -> str:
    if isinstance(action, Create):
        return f"created {action.document.name}"
    if isinstance(action, Update):
        return f"updated {action.document.name} (was version {action.expected_version})"
    return f"deleted {action.name} (was version {action.expected_version})"
