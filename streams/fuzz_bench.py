"""`dlrover-events bench fuzz`: labelled bad messages among valid ones, into a running
archiver and brain, and what each consumer made of every one.

Every record is labelled by its class before it is sent and found again by its
coordinates (topic, partition, offset): in the env's archive (what the archiver took), in
the dead letters on `<env>.dlq` (who refused it, and why), and in the brain's counters.
A consumer must dead-letter every bad record with a reason, take every valid one, and
never stop; the report says per consumer how far each got, and the last line printed is
one JSON object.

The classes are the ways producers got it wrong that the contract refuses (lax
coercions, non-finite numbers, NUL, counts past their bounds, oversize, deep nesting,
another env, an unknown type, truncated JSON, ...), and one probe it takes on purpose
(``PROBES``: a 900 KB job name, within the event's bound), so the report shows what
such a record does to the consumers. A class the broker itself refuses (a record past
its message size) is counted as refused at the send, not as sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
import sys
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import typer
from aiokafka import AIOKafkaProducer

from dlrover_events.bus.kafka_client import kafka_connection
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import DLQ, JOB_EVENTS, JOB_METRICS, topic
from dlrover_events.cli.params import duration
from dlrover_events.cli.runner import run_async
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.runtime.embedded import bench_broker, resolve_postgres
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings, load_settings
from dlrover_events.store import EnvStore
from schemas.bounds import MAX_BYTES, MAX_EVENT_BYTES, MAX_NODES, MAX_REPLICAS
from schemas.codec import decode, encode
from schemas.control import EnvMode
from schemas.dlq import DeadLetter
from schemas.envelope import Event
from schemas.jobs import (
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeOOM,
    NodeRef,
    NodeUsage,
    OOMKind,
    RoleSpec,
    RuntimeSample,
)
from streams import archiver
from streams.brain.runtime.app import Brain

log = logging.getLogger(__name__)

GiB = 1 << 30
VALID = "valid"
Obj = dict[str, Any]
#: A bad class: from a valid event as a JSON object (and a random source), the bytes
#: to send (None: a tombstone).
Spoil = Callable[[Obj, random.Random], bytes | None]


def _dumps(obj: Obj) -> bytes:
    return orjson.dumps(obj)


def _set(obj: Obj, path: str, value: Any) -> Obj:
    out = json.loads(json.dumps(obj))  # a deep copy
    node = out
    *parents, last = path.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    return out


def _raw(obj: Obj, path: str, literal: str) -> bytes:
    """``obj`` with the value at ``path`` written as ``literal``, which JSON (and so
    orjson) cannot write: NaN, Infinity, 1e400."""
    marker = f"__fuzz_{uuid.uuid4().hex}__"
    return _dumps(_set(obj, path, marker)).replace(f'"{marker}"'.encode(), literal.encode())


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _sample_classes() -> dict[str, Spoil]:
    """Bad runtime samples (job.metrics)."""
    return {
        "lax_bool_step": lambda o, r: _dumps(_set(o, "global_step", True)),
        "string_step": lambda o, r: _dumps(_set(o, "global_step", "12")),
        "float_step": lambda o, r: _dumps(_set(o, "global_step", 12.5)),
        "numeric_occurred_at": lambda o, r: _dumps(_set(o, "occurred_at", 12345)),
        "string_schema_version": lambda o, r: _dumps(_set(o, "schema_version", "1")),
        "newer_schema_version": lambda o, r: _dumps(_set(o, "schema_version", 99)),
        "naive_occurred_at": lambda o, r: _dumps(_set(o, "occurred_at", "2026-01-01T00:00:00")),
        "nan_speed": lambda o, r: _raw(o, "speed", "NaN"),
        "infinity_speed": lambda o, r: _raw(o, "speed", "Infinity"),
        "overflow_speed_1e400": lambda o, r: _raw(o, "speed", "1e400"),
        "negative_speed": lambda o, r: _dumps(_set(o, "speed", -1.0)),
        "huge_rate": lambda o, r: _dumps(_set(o, "samples_per_s", 1e300)),
        "step_beyond_int64": lambda o, r: _raw(o, "global_step", str(2**70)),
        "node_memory_past_bound": lambda o, r: _dumps(
            _set(o, "nodes", [{"type": "worker", "id": 0, "memory": MAX_BYTES * 2}])
        ),
        "node_memory_1e30": lambda o, r: _raw(
            o, "nodes", '[{"type": "worker", "id": 0, "memory": ' + str(10**30) + "}]"
        ),
        "node_id_2_31": lambda o, r: _dumps(_set(o, "nodes", [{"type": "worker", "id": 2**31}])),
        "too_many_nodes": lambda o, r: _dumps(
            _set(o, "nodes", [{"type": "w", "id": i} for i in range(MAX_NODES + 1)])
        ),
        "nul_in_string": lambda o, r: _dumps(_set(o, "job.name", "a\x00b")),
        "nul_in_key": lambda o, r: _dumps(_set(o, "job.labels", {"k\x00": "v"})),
        "invalid_utf8": lambda o, r: _dumps(_set(o, "job.name", "MARK")).replace(
            b"MARK", b"\xff\xfe"
        ),
        "lone_surrogate": lambda o, r: _dumps(_set(o, "job.name", "MARK")).replace(
            b"MARK", b"\\ud800"
        ),
        "too_many_labels": lambda o, r: _dumps(
            _set(o, "job.labels", {f"k{i}": "v" for i in range(300)})
        ),
        "unknown_field": lambda o, r: _dumps(_set(o, "surprise", 1)),
        "missing_job": lambda o, r: _dumps({k: v for k, v in o.items() if k != "job"}),
        "wrong_env": lambda o, r: _dumps(_set(o, "env", "some-other-env")),
        "invalid_env_name": lambda o, r: _dumps(_set(o, "env", "Not An Env")),
        "unknown_type": lambda o, r: _dumps(_set(o, "type", "job.teleported")),
        "missing_type": lambda o, r: _dumps({k: v for k, v in o.items() if k != "type"}),
        "bad_event_id": lambda o, r: _dumps(_set(o, "event_id", "not-a-uuid")),
        "key_not_job": lambda o, r: _dumps(_set(o, "key", "another-job")),
        "truncated_json": lambda o, r: (b := _dumps(o))[: r.randrange(1, len(b) - 1)],
        "not_json": lambda o, r: bytes(r.randrange(256) for _ in range(r.randrange(1, 200))),
        "json_not_object": lambda o, r: r.choice([b"[1, 2, 3]", b'"text"', b"42", b"null"]),
        "empty": lambda o, r: b"",
        "tombstone": lambda o, r: None,
        "deep_nesting_2000": lambda o, r: b"[" * 2000 + b"]" * 2000,
        "oversize_field": lambda o, r: _dumps(_set(o, "job.name", "x" * 900_000)),
        "over_event_bound": lambda o, r: _dumps(_set(o, "padding", "x" * (MAX_EVENT_BYTES + 64))),
    }


def _submission_classes() -> dict[str, Spoil]:
    """Bad job submissions (job.events)."""

    def role(**kw: Any) -> Callable[[Obj, random.Random], bytes | None]:
        return lambda o, r: _dumps(_set(o, "roles.worker", {**o["roles"]["worker"], **kw}))

    return {
        "replicas_1e30": lambda o, r: _raw(
            o, "roles", '{"worker": {"replicas": ' + str(10**30) + "}}"
        ),
        "replicas_past_bound": role(replicas=MAX_REPLICAS + 1),
        "lax_bool_replicas": role(replicas=True),
        "string_replicas": role(replicas="4"),
        "cpu_infinity": lambda o, r: _raw(o, "roles.worker.cpu", "Infinity"),
        "memory_past_bound": role(memory=MAX_BYTES + 1),
        "too_many_roles": lambda o, r: _dumps(
            _set(o, "roles", {f"r{i}": {"replicas": 1} for i in range(100)})
        ),
        "config_deep_nesting": lambda o, r: _dumps(_set(o, "config", {"k": _nested(200)})),
        "config_too_many_values": lambda o, r: _dumps(
            _set(o, "config", {f"k{i}": i for i in range(20_000)})
        ),
        "config_nul": lambda o, r: _dumps(_set(o, "config", {"k": "a\x00"})),
        "config_int_beyond_int64": lambda o, r: _raw(o, "config", '{"k": ' + str(2**64) + "}"),
    }


CLASSES: dict[str, tuple[str, Spoil]] = {
    **{name: (JOB_METRICS, spoil) for name, spoil in _sample_classes().items()},
    **{name: (JOB_EVENTS, spoil) for name, spoil in _submission_classes().items()},
}
#: Classes the contract takes (no bound of their own below the event's): sent to see
#: that the consumers hold them, not expected in the DLQ.
PROBES = frozenset({"oversize_field"})
#: Classes of a size that costs: a few of each are enough to show the rule.
RARE = {
    "too_many_nodes": 20,
    "config_too_many_values": 20,
    "oversize_field": 10,
    "over_event_bound": 5,
}


@dataclass
class FuzzRecords:
    """What to send, in order: (label, topic suffix, key, value)."""

    records: list[tuple[str, str, bytes, bytes | None]] = field(default_factory=list)


def build(env: str, bad: int, valid: int, jobs: int, seed: int) -> FuzzRecords:
    """Valid events of ``jobs`` jobs in each job's order, with ``bad`` labelled bad ones
    (about as many of each class, fewer of the large ones) among them."""
    rng = random.Random(seed)
    start = datetime.now(UTC) - timedelta(hours=1)
    metas = [JobMeta(uuid=f"fuzz-job-{j}", name=f"fuzz-{j}") for j in range(jobs)]
    streams: list[list[Event]] = []
    per_job = max(valid // jobs - 2, 1)
    for meta in metas:
        events: list[Event] = [
            JobSubmitted(
                env=env,
                job=meta,
                occurred_at=start,
                roles={"worker": RoleSpec(replicas=2, min_replicas=1, max_replicas=4, cpu=4)},
                batch_size=64,
            ),
            JobStarted(env=env, job=meta, occurred_at=start),
        ]
        for i in range(per_job):
            at = start + timedelta(seconds=15 * (i + 1))
            if i % 40 == 39:
                events.append(
                    NodeOOM(
                        env=env,
                        job=meta,
                        occurred_at=at,
                        node=NodeRef(type="worker", id=i % 2),
                        kind=OOMKind.HOST_MEMORY,
                        memory=8 * GiB,
                    )
                )
                continue
            events.append(
                RuntimeSample(
                    env=env,
                    job=meta,
                    occurred_at=at,
                    global_step=10 * i,
                    speed=1.0 + rng.random() / 10,
                    samples_per_s=64.0,
                    batch_size=64,
                    world_size=2,
                    nodes=[
                        NodeUsage(type="worker", id=k, cpu=2.0, memory=4 * GiB) for k in range(2)
                    ],
                )
            )
        streams.append(events)
    sample = next(e for e in reversed(streams[0]) if isinstance(e, RuntimeSample))
    templates = {
        JOB_METRICS: orjson.loads(encode(sample)),
        JOB_EVENTS: orjson.loads(encode(streams[0][0])),
    }
    common = [n for n in CLASSES if n not in RARE]
    labels = [name for name, count in RARE.items() for _ in range(min(count, bad))]
    labels += [common[i % len(common)] for i in range(max(bad - len(labels), 0))]
    rng.shuffle(labels)
    # the bad records go among the valid ones: each at a random place of a random job
    slots: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for name in labels:
        j = rng.randrange(jobs)
        slots[j].append((rng.randrange(len(streams[j]) + 1), name))
    plan = FuzzRecords()
    for j, events in enumerate(streams):
        key = metas[j].uuid.encode()
        inserts = sorted(slots[j])
        k = 0
        for i, event in enumerate([*events, None]):
            while k < len(inserts) and inserts[k][0] == i:
                name = inserts[k][1]
                suffix, spoil = CLASSES[name]
                template = {**templates[suffix], "event_id": str(uuid.uuid4())}
                template["job"] = {**template["job"], "uuid": metas[j].uuid}
                template["key"] = metas[j].uuid
                plan.records.append((name, suffix, key, spoil(template, rng)))
                k += 1
            if event is not None:
                suffix = JOB_METRICS if isinstance(event, RuntimeSample) else JOB_EVENTS
                plan.records.append((VALID, suffix, key, encode(event)))
    return plan


Coord = tuple[str, int, int]


@dataclass
class Sent:
    labels: dict[Coord, str] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)
    refused_why: dict[str, str] = field(default_factory=dict)


async def publish(settings: Settings, env: str, plan: FuzzRecords) -> Sent:
    """Send every record, in order per job; the broker's refusals are counted, not sent."""
    producer = AIOKafkaProducer(
        **kafka_connection(settings),
        linger_ms=20,
        max_batch_size=1 << 20,
        max_request_size=4 << 20,  # let the broker, not the client, refuse what is too big
        acks="all",
        enable_idempotence=False,
    )
    await producer.start()
    sent = Sent()
    try:
        pending = []
        for label, suffix, key, value in plan.records:
            future = await producer.send(topic(env, suffix), value, key=key)
            pending.append((label, future))
        for label, future in pending:
            try:
                meta = await future
            except Exception as err:
                sent.refused[label] += 1
                sent.refused_why.setdefault(label, f"{type(err).__name__}: {err}"[:200])
                continue
            sent.labels[(meta.topic, meta.partition, meta.offset)] = label
    finally:
        await producer.stop()
    return sent


class _Errors(logging.Handler):
    """Counts ERROR records (and keeps the first few) of the consumers under test."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count: Counter[str] = Counter()
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count[record.name] += 1
        if len(self.first) < 5:
            self.first.append(f"{record.name}: {record.getMessage()[:300]}")


@dataclass
class Observed:
    archived: set[Coord]
    letters: dict[str, dict[Coord, DeadLetter]]


async def _seen(settings: Settings, env: str, store: EnvStore, groups: list[str]) -> Observed:
    inputs = {topic(env, JOB_METRICS), topic(env, JOB_EVENTS)}
    rows = await store.fetch('SELECT topic, partition, "offset" FROM events_archive')
    archived = {(r["topic"], r["partition"], r["offset"]) for r in rows if r["topic"] in inputs}
    letters: dict[str, dict[Coord, DeadLetter]] = {g: {} for g in groups}
    for record in await read_topic(settings, topic(env, DLQ), timeout_s=30):
        letter = decode(record.value)
        if isinstance(letter, DeadLetter) and letter.consumer_group in letters:
            coord = (letter.original_topic, letter.partition, letter.offset)
            letters[letter.consumer_group][coord] = letter
    return Observed(archived, letters)


_POSITION = re.compile(r"(:? at)? line \d+ column \d+( \(char \d+\))?|found `.` at \d+")
_ENV_NAME = re.compile(r"fuzz-[0-9a-f]{8}")


def _reason(letter: DeadLetter) -> str:
    """The reason without what varies per record (positions, the env's name)."""
    head = letter.error.split(";")[0]
    if head.startswith("job.") and ": " in head:
        head = head.split(": ", 1)[1]
    head = _ENV_NAME.sub("<env>", _POSITION.sub("", head))
    return f"{letter.error_kind.value}: {head[:100]}"


def report(
    name: str, sent: Sent, accepted: set[Coord] | None, letters: dict[Coord, DeadLetter]
) -> dict[str, Any]:
    """One consumer's figures over the labelled records it reads."""
    valid = {c for c, label in sent.labels.items() if label == VALID}
    bad = {c: label for c, label in sent.labels.items() if label != VALID}
    lettered_bad = {c: letters[c] for c in bad if c in letters}
    reasons: Counter[str] = Counter(_reason(x) for x in lettered_bad.values())
    kinds: Counter[str] = Counter(x.error_kind.value for x in lettered_bad.values())
    not_lettered: Counter[str] = Counter(label for c, label in bad.items() if c not in letters)
    probes = sum(n for label, n in not_lettered.items() if label in PROBES)
    out: dict[str, Any] = {
        "consumer": name,
        "sent": len(sent.labels),
        "sent_valid": len(valid),
        "sent_bad": len(bad),
        "dead_lettered": len(letters),
        "dead_lettered_bad": len(lettered_bad),
        "dead_lettered_valid": len(valid & letters.keys()),
        "dead_lettered_by_kind": dict(kinds.most_common()),
        "dead_letter_reasons": dict(reasons.most_common(100)),
        "bad_not_dead_lettered_by_class": dict(not_lettered.most_common()),
        "bad_not_dead_lettered_not_probes": sum(not_lettered.values()) - probes,
        "truncated_letters": sum(1 for x in letters.values() if x.truncated),
    }
    if accepted is not None:
        out["processed_valid"] = len(valid & accepted)
        out["processed_bad"] = len(accepted & bad.keys())
    return out


#: A consumer that has read nothing new for this long has stopped (or is stuck).
STALL_S = 120.0


async def _wait(
    seen: Callable[[], Awaitable[int]],
    total: int,
    timeout_s: float,
    what: str,
    progress: Callable[[str], None],
) -> bool:
    """Until ``seen()`` reaches ``total``; False if it stalls or the time is up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last, moved = -1, loop.time()
    while True:
        now_seen = await seen()
        if now_seen >= total:
            return True
        now = loop.time()
        if now_seen != last:
            last, moved = now_seen, now
        if now - moved > STALL_S or now > deadline:
            progress(f"{what}: {now_seen} of {total} after {now - moved:.0f} s without progress")
            return False
        await asyncio.sleep(1.0)


async def run_fuzz(
    settings: Settings,
    *,
    bad: int,
    valid: int,
    jobs: int,
    seed: int,
    timeout_s: float,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    pg = await resolve_postgres(settings)
    registry = EnvRegistry(settings, pg.dsn)
    env = f"fuzz-{uuid.uuid4().hex[:8]}"
    await registry.create(env, EnvMode.VIRTUAL)
    errors = _Errors()
    watched = [logging.getLogger(n) for n in ("streams", "dlrover_events", "faust", "mode")]
    for logger in watched:
        logger.addHandler(errors)
    # one warning per dead letter is the consumers' rule; here they are counted instead
    bus_log = logging.getLogger("dlrover_events.bus")
    bus_level = bus_log.level
    bus_log.setLevel(logging.ERROR)
    ctx = ServiceContext(settings, env, pg.dsn)
    archiving: asyncio.Task[None] | None = None
    brain: Brain | None = None
    store = await EnvStore.open(pg.dsn, env, max_size=2)
    try:
        plan = build(env, bad, valid, jobs, seed)
        progress(f"env {env}: {len(plan.records)} records ({bad} bad) of {jobs} jobs")
        archiving = asyncio.create_task(archiver.run(ctx), name="fuzz-archiver")
        brain = Brain(settings, env, pg.dsn, freeze_gc=False)
        await brain.start()
        sent = await publish(settings, env, plan)
        total = len(sent.labels)
        progress(f"sent {total}; refused by the broker: {sum(sent.refused.values())}")
        counters = brain.processor.counters

        async def brain_seen() -> int:
            seen = counters.processed + counters.dead_lettered + counters.ignored
            return seen + counters.skipped

        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        brain_finished = await _wait(brain_seen, total, timeout_s, "brain", progress)
        brain_s = loop.time() - sent_at
        groups = [f"{env}.{archiver.GROUP}", brain.group]

        async def archiver_seen() -> int:
            """Inputs archived, and the archiver's letters (it archives the dlq too)."""
            rows = await store.fetch(
                "SELECT count(*) FILTER (WHERE topic = ANY($1::text[])) AS taken,"
                " count(*) FILTER (WHERE topic = $2 AND body->>'consumer_group' = $3)"
                " AS lettered FROM events_archive",
                [topic(env, JOB_METRICS), topic(env, JOB_EVENTS)],
                topic(env, DLQ),
                groups[0],
            )
            return int(rows[0]["taken"]) + int(rows[0]["lettered"])

        archiver_finished = await _wait(archiver_seen, total, timeout_s, "archiver", progress)
        archiver_s = loop.time() - sent_at
        await asyncio.sleep(2.0)  # the last letters are published after their count
        seen = await _seen(settings, env, store, groups)
        arch = report("archiver", sent, seen.archived, seen.letters[groups[0]])
        arch["finished"] = archiver_finished
        arch["seconds_after_sent"] = round(archiver_s, 1)
        arch["crashes"] = (
            errors.count["streams.archiver"] + (1 if archiving.done() else 0)  # restarts
        )
        br = report("brain", sent, None, seen.letters[groups[1]])
        br["finished"] = brain_finished or await brain_seen() >= total
        br["seconds_after_sent"] = round(brain_s, 1)
        br["processed"] = counters.processed
        br["ignored"] = counters.ignored
        br["skipped"] = counters.skipped
        br["errors"] = counters.errors
        br["crashes"] = sum(
            n for name, n in errors.count.items() if name.startswith("streams.brain")
        )
        return {
            "env": env,
            "seed": seed,
            "classes": len(CLASSES),
            "sent": total,
            "sent_bad": sum(1 for x in sent.labels.values() if x != VALID),
            "sent_valid": sum(1 for x in sent.labels.values() if x == VALID),
            "refused_by_broker": dict(sent.refused),
            "refused_by_broker_why": sent.refused_why,
            "error_log_lines": dict(errors.count),
            "first_errors": errors.first,
            "consumers": [arch, br],
        }
    finally:
        ctx.stop.set()
        if archiving is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(archiving, 30)
        if brain is not None:
            with contextlib.suppress(Exception):
                await brain.stop()
        for logger in watched:
            logger.removeHandler(errors)
        bus_log.setLevel(bus_level)
        await store.close()
        with contextlib.suppress(Exception):
            await registry.delete(env, force=True)
        pg.stop()


def bench_fuzz(
    bad: int = typer.Option(10_000, "--bad", min=1, help="bad messages to send"),
    valid: int = typer.Option(2_000, "--valid", min=1, help="valid events around them"),
    jobs: int = typer.Option(20, "--jobs", min=1, help="jobs the events belong to"),
    seed: int = typer.Option(7, "--seed", help="what is sent, and where, is a function of it"),
    timeout_s: float = typer.Option(
        600.0,
        "--timeout",
        parser=duration,
        help="longest wait for each consumer to read everything: 10m, 600 (at least 1s)",
    ),
) -> None:
    """Send BAD labelled bad messages among VALID valid events into a fresh env with an
    archiver and a brain running, and report per consumer what it dead-lettered (and
    why), processed, and wrongly refused; the last line is one JSON object."""
    if timeout_s < 1:
        raise UserError(f"--timeout {timeout_s:g}s: at least 1s")

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with bench_broker(load_settings(), progress) as settings:
        result = run_async(
            run_fuzz(
                settings,
                bad=bad,
                valid=valid,
                jobs=jobs,
                seed=seed,
                timeout_s=timeout_s,
                progress=progress,
            )
        )
    for consumer in result["consumers"]:
        progress(
            f"{consumer['consumer']}: sent {consumer['sent']} ({consumer['sent_bad']} bad),"
            f" dead-lettered {consumer['dead_lettered']}"
            f" ({consumer['dead_lettered_valid']} valid), crashes {consumer['crashes']}"
        )
    typer.echo(json.dumps(result))
