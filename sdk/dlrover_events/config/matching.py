"""Which config documents apply to a job, and what they add up to.

Pure and synchronous on purpose: everything that decides what a job gets lives here, so it
is property-tested without a broker, a database or an event loop, and the HTTP layer can
only ask questions of it. It is in the core, not in the gateway, because the brain asks the
same question (which optimizer a job's documents name) and must get the gateway's answer:
one matcher, one mapping of a job to attributes, one way to apply the change feed.

Rules (DLRover's Brain design):

* a job is a set of attributes (user, group, cluster, namespace, app, scenario, job,
  ``labels.<name>``, or anything else); attribute names compare case-insensitively, values
  exactly (after turning numbers and booleans into their JSON spelling);
* a document matches when every Include condition holds and no Exclude condition holds; a
  condition holds when the job has that attribute with one of the condition's values (a
  list means "any of"); an attribute the job does not have satisfies no condition;
* the Configure parts of all matching documents are merged, nested objects key by key,
  the more specific document (more Include conditions) winning, then the higher
  ``priority``, then the name that sorts first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from schemas.config import ConditionValue, ConfigChange, ConfigDocument, Scalar
from schemas.jobs import JobMeta

#: Longest attribute name a document may target (and a query may name).
MAX_KEY = 128

#: A job as the matcher sees it: normalised attribute name -> the values it has.
Job = Mapping[str, frozenset[str]]


def norm_key(key: str) -> str:
    """Case-insensitive names: ``User``, ``user`` and ``USER`` are one attribute."""
    return key.casefold()


def norm_value(value: Scalar) -> str:
    """One spelling per value, so ``1``, ``1.0`` and ``"1"`` all match a job's ``1``.

    Query strings carry every job attribute as text, while documents may say ``true`` or
    ``3``; comparing JSON spellings makes both sides agree.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def norm_condition(value: ConditionValue) -> frozenset[str]:
    if isinstance(value, list):
        return frozenset(norm_value(v) for v in value)
    return frozenset((norm_value(value),))


Conditions = tuple[tuple[str, frozenset[str]], ...]


def conditions(raw: Mapping[str, ConditionValue]) -> Conditions:
    """Conditions with normalised names, sorted so equal documents compile equally.

    Kept as pairs, not a dict: two spellings of one name (``User`` and ``user``) stay two
    conditions, which Include requires both of and Exclude either of. The admin API
    refuses such documents, but documents from elsewhere still get a defined meaning.
    """
    pairs = ((norm_key(k), norm_condition(v)) for k, v in raw.items())
    return tuple(sorted(pairs, key=lambda kv: (kv[0], sorted(kv[1]))))


def make_job(attrs: Mapping[str, Scalar | Iterable[Scalar]]) -> dict[str, frozenset[str]]:
    """A job from loose attributes (a value may be one value or several)."""
    job: dict[str, set[str]] = {}
    for key, value in attrs.items():
        vals = [value] if isinstance(value, str | int | float | bool) else list(value)
        job.setdefault(norm_key(key), set()).update(norm_value(v) for v in vals)
    return {k: frozenset(v) for k, v in job.items()}


def job_attributes(meta: JobMeta) -> dict[str, str]:
    """A job's attributes as documents target them (``make_job`` turns them into a Job).

    The one mapping from a job to attributes: the SDK sends these as the gateway's query
    (adding the process's role and rank) and the brain matches them itself, so both see the
    same documents for a job. Empty fields are left out: an attribute a job does not have
    satisfies no condition, whereas ``""`` would satisfy ``Include: {user: ""}``.
    """
    attrs = {
        "job": meta.uuid,
        "name": meta.name,
        "namespace": meta.namespace,
        "cluster": meta.cluster,
        "user": meta.user,
        "group": meta.group,
        "scenario": meta.scenario,
        "app": meta.app,
    }
    attrs.update({f"labels.{k}": v for k, v in meta.labels.items()})
    return {k: v for k, v in attrs.items() if v}


@dataclass(frozen=True, slots=True)
class Compiled:
    """A document with its conditions normalised once, not on every request."""

    doc: ConfigDocument
    include: Conditions
    exclude: Conditions
    #: distinct Include attributes: how specific the document is.
    specificity: int

    @property
    def name(self) -> str:
        return self.doc.name

    def precedence(self) -> tuple[int, int, str]:
        """Sort key, highest precedence first: specific, then priority, then name."""
        return (-self.specificity, -self.doc.priority, self.doc.name)


def compile_doc(doc: ConfigDocument) -> Compiled:
    include = conditions(doc.include)
    return Compiled(doc, include, conditions(doc.exclude), len({k for k, _ in include}))


def _holds(job: Job, key: str, values: frozenset[str]) -> bool:
    have = job.get(key)
    return have is not None and not have.isdisjoint(values)


def matches(doc: Compiled | ConfigDocument, job: Job) -> bool:
    # Plain loops, not any()/all() over generators: this runs for every candidate of
    # every request.
    c = doc if isinstance(doc, Compiled) else compile_doc(doc)
    get = job.get
    for key, values in c.exclude:
        have = get(key)
        if have is not None and not have.isdisjoint(values):
            return False
    for key, values in c.include:
        have = get(key)
        if have is None or have.isdisjoint(values):
            return False
    return True


@dataclass(frozen=True, slots=True)
class Contribution:
    name: str
    version: int
    specificity: int
    priority: int

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "specificity": self.specificity,
            "priority": self.priority,
        }


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a job gets: the merged config, and which documents it came from.

    ``sources`` is in precedence order (the winner first); ``origin`` names, for each
    top-level key of ``config``, the document whose value won, so an operator can see why
    a job got what it got.
    """

    config: dict[str, Any]
    sources: tuple[Contribution, ...]
    origin: dict[str, str]

    def as_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "sources": [s.as_json() for s in self.sources],
            "origin": self.origin,
        }

    def etag(self) -> str:
        """Changes exactly when the answer does (config, sources or their versions)."""
        body = orjson.dumps(self.as_json(), option=orjson.OPT_SORT_KEYS)
        return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def deep_merge(low: Mapping[str, Any], high: Mapping[str, Any]) -> dict[str, Any]:
    """``high`` over ``low``; objects merge key by key, anything else is replaced whole."""
    out = dict(low)
    for key, value in high.items():
        below = out.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            out[key] = deep_merge(below, value)
        else:
            out[key] = value
    return out


def merge(matching: Iterable[Compiled]) -> Resolution:
    """Merge the documents that matched; the order they come in does not matter."""
    ranked = sorted(matching, key=Compiled.precedence)
    config: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for c in reversed(ranked):  # lowest precedence first, so the winner is applied last
        config = deep_merge(config, c.doc.configure)
        for key in c.doc.configure:
            origin[key] = c.name
    sources = tuple(
        Contribution(c.name, c.doc.version, c.specificity, c.doc.priority) for c in ranked
    )
    return Resolution(config, sources, dict(sorted(origin.items())))


def resolve(docs: Iterable[ConfigDocument | Compiled], job: Job) -> Resolution:
    """The reference answer: check every document. The index must agree with it."""
    compiled = (d if isinstance(d, Compiled) else compile_doc(d) for d in docs)
    return merge(c for c in compiled if matches(c, job))


#: A Kafka tombstone on the compacted change topic: the document's name, and nothing.
Tombstone = tuple[str, None]
#: What the change topic carries.
Change = ConfigChange | Tombstone
#: What applying one change did: ``replay`` is a change the index already holds exactly.
ApplyOutcome = Literal["changed", "unchanged", "replay"]


class Index:
    """Documents by name, with an inverted index so a request checks a few candidates
    instead of every document (10,000 documents, 10,000 requests a second).

    A document is filed under one of its Include conditions; a job can only match it if
    the job has one of that condition's values, so the job's own attributes find every
    candidate, whichever condition was chosen. The choice is the condition whose values
    currently have the fewest documents filed: per-user documents end up under the user,
    not under a group shared by hundreds. Documents with an empty Include match everyone
    and are always candidates. Not thread-safe; the gateway owns it on one event loop.
    """

    def __init__(self, docs: Iterable[ConfigDocument] = ()) -> None:
        self._docs: dict[str, Compiled] = {}
        self._postings: dict[tuple[str, str], set[str]] = {}
        self._filed: dict[str, list[tuple[str, str]]] = {}
        self._everyone: set[str] = set()
        #: bumped on every change, so caches of answers know when they are stale.
        self.generation = 0
        #: last version applied per name, deletions included, so replays are recognised and
        #: the gateway's reconcile can compare the topic with Postgres.
        self.versions: dict[str, int] = {}
        for d in docs:
            self.upsert(d)

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, name: object) -> bool:
        return name in self._docs

    def get(self, name: str) -> ConfigDocument | None:
        c = self._docs.get(name)
        return c.doc if c is not None else None

    def documents(self) -> list[ConfigDocument]:
        return [self._docs[n].doc for n in sorted(self._docs)]

    def _slots(self, c: Compiled) -> list[tuple[str, str]]:
        postings = self._postings

        def load(cond: tuple[str, frozenset[str]]) -> tuple[int, str]:
            key, values = cond
            return (sum(len(postings.get((key, v), ())) for v in values), key)

        key, values = min(c.include, key=load)
        return [(key, v) for v in sorted(values)]

    def upsert(self, doc: ConfigDocument) -> None:
        self.remove(doc.name)
        c = compile_doc(doc)
        self._docs[doc.name] = c
        if not c.include:
            self._everyone.add(doc.name)
        else:
            slots = self._filed[doc.name] = self._slots(c)
            for slot in slots:
                self._postings.setdefault(slot, set()).add(doc.name)
        self.generation += 1

    def remove(self, name: str) -> bool:
        c = self._docs.pop(name, None)
        if c is None:
            return False
        self._everyone.discard(name)
        for slot in self._filed.pop(name, ()):
            names = self._postings.get(slot)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._postings[slot]
        self.generation += 1
        return True

    def apply(self, change: Change) -> ApplyOutcome:
        """One change of the feed, as every reader of it must apply it.

        Per name, the topic's order is the truth (one key, one partition), even when a
        version is lower than the one held: that is how the gateway's ``reconcile`` puts
        back Postgres' state over a change whose commit failed, and a reader that kept the
        higher version would keep a document Postgres never had. Versions only recognise
        exact replays, so they leave answer caches alone.
        """
        if isinstance(change, tuple):
            name = change[0]
            self.versions.pop(name, None)
            return "changed" if self.remove(name) else "unchanged"
        if change.version == self.versions.get(change.name) and (
            self.get(change.name) == change.document
        ):
            return "replay"
        self.versions[change.name] = change.version
        if change.op == "upsert" and change.document is not None:
            self.upsert(change.document)
            return "changed"
        return "changed" if self.remove(change.name) else "unchanged"

    def candidates(self, job: Job) -> set[str]:
        found = set(self._everyone)
        postings = self._postings
        for key, values in job.items():
            for v in values:
                names = postings.get((key, v))
                if names:
                    found |= names
        return found

    def resolve(self, job: Job) -> Resolution:
        docs = self._docs
        return merge(c for n in self.candidates(job) if matches(c := docs[n], job))


def problems(doc: ConfigDocument) -> list[str]:
    """What makes a document unusable beyond its schema, for a clear 422.

    Spellings of one attribute that differ only in case would silently combine; an empty
    any-of list can never hold; NUL characters cannot be stored in Postgres text or jsonb.
    """
    out: list[str] = []
    for part, raw in (("Include", doc.include), ("Exclude", doc.exclude)):
        seen: dict[str, str] = {}
        for key, value in raw.items():
            k = norm_key(key)
            if not k or len(key) > MAX_KEY:
                out.append(f"{part}: attribute names must be 1 to {MAX_KEY} characters")
            elif k in seen:
                out.append(
                    f"{part}: {seen[k]!r} and {key!r} name the same attribute "
                    "(names are case-insensitive); keep one"
                )
            seen.setdefault(k, key)
            if isinstance(value, list) and not value:
                out.append(f"{part}.{key}: an empty list matches nothing; remove the condition")
    if _has_nul(doc.include) or _has_nul(doc.exclude) or _has_nul(doc.configure):
        out.append("strings must not contain NUL (\\u0000) characters")
    return out


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False
