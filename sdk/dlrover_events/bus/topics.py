"""Topic naming: every topic of an env is ``<env>.<topic>``; the env registry is global.

This is the one place that knows which event goes to which topic.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlrover_events.errors import UserError
from dlrover_events.settings import Settings
from schemas.control import EnvAnnouncement
from schemas.envelope import ENV_NAME_PATTERN, Event, _check_env

CONTROL_TOPIC = EnvAnnouncement.topic


@dataclass(frozen=True)
class TopicSpec:
    name: str
    compacted: bool
    purpose: str
    #: which retention setting (`retention_<kind>_ms`) bounds it; none for a compacted one
    retention: str | None = None


JOB_METRICS = "job.metrics"
JOB_EVENTS = "job.events"
BRAIN_PLANS = "brain.plans"
SCALE_PLANS = "scale.plans"
SCALE_RESULTS = "scale.results"
CONFIG_CHANGES = "config.changes"
EVAL_REPORTS = "eval.reports"
DLQ = "dlq"
CLUSTER_CAPACITY = "cluster.capacity"
JOB_REQUESTS = "job.requests"
EXPERIMENTS = "experiments"
TRIAL_METRICS = "trial.metrics"
TRIAL_DECISIONS = "trial.decisions"
HOSTS_REPORTS = "hosts.reports"
HOSTS_ORDERS = "hosts.orders"
CHECKPOINTS = "checkpoints"

ENV_TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(JOB_METRICS, False, "runtime samples from training jobs", "metrics"),
    TopicSpec(JOB_EVENTS, False, "job lifecycle and node events", "events"),
    TopicSpec(BRAIN_PLANS, False, "OptimizePlans: what the brain wants, and why", "plans"),
    TopicSpec(SCALE_PLANS, False, "ScalePlans: the diff for the operator", "plans"),
    TopicSpec(SCALE_RESULTS, False, "what the operator did with each plan", "results"),
    TopicSpec(CONFIG_CHANGES, True, "config document changes (compacted)"),
    TopicSpec(EVAL_REPORTS, False, "evaluator KPIs", "eval"),
    TopicSpec(DLQ, False, "messages that could not be processed, with the reason", "dlq"),
    TopicSpec(CLUSTER_CAPACITY, True, "the real cluster's hosts and GPUs (compacted)"),
    TopicSpec(
        JOB_REQUESTS,
        False,
        "JobRequests: jobs a stream processor asks the operator to create or delete, "
        "and the answers",
        "plans",
    ),
    TopicSpec(EXPERIMENTS, False, "experiments submitted, paused, activated and killed", "plans"),
    TopicSpec(TRIAL_METRICS, False, "what trials measured (training and validation)", "metrics"),
    TopicSpec(TRIAL_DECISIONS, False, "what an experiment's searcher decided, and why", "plans"),
    TopicSpec(
        CHECKPOINTS, False, "checkpoints committed by jobs, and deleted by retention", "events"
    ),
    TopicSpec(HOSTS_REPORTS, True, "plain hosts' agents: slots, liveness, pods (compacted)"),
    TopicSpec(HOSTS_ORDERS, True, "the pods the operator wants of each plain host (compacted)"),
)
#: the env registry's announcements: one for the whole bus, one partition, compacted
CONTROL_SPEC = TopicSpec(CONTROL_TOPIC, True, "env announcements (compacted)")
ENV_TOPIC_NAMES = tuple(t.name for t in ENV_TOPICS)


class InvalidEnvName(UserError, ValueError):
    pass


def check_env_name(name: str) -> str:
    try:
        return _check_env(name)
    except ValueError as err:
        raise InvalidEnvName(str(err)) from None


def topic(env: str, name: str) -> str:
    """Full topic name of an env topic; rejects names that are not env topics."""
    if name not in ENV_TOPIC_NAMES:
        raise ValueError(f"unknown topic {name!r}; env topics are: {', '.join(ENV_TOPIC_NAMES)}")
    return f"{check_env_name(env)}.{name}"


def env_topics(env: str) -> list[str]:
    return [topic(env, t) for t in ENV_TOPIC_NAMES]


def topic_of(event: Event) -> str:
    """Where an event is published: its class names the topic, its env the prefix."""
    if isinstance(event, EnvAnnouncement):
        return CONTROL_TOPIC
    return topic(event.env, type(event).topic)


def topic_configs(spec: TopicSpec, settings: Settings) -> dict[str, str]:
    """The Kafka configs a topic is created with (by `env create`, `up`, or a rendered
    Strimzi KafkaTopic): compaction, retention by kind of topic, min.insync.replicas."""
    configs: dict[str, str] = {}
    if spec.compacted:
        configs["cleanup.policy"] = "compact"
    elif spec.retention is not None:
        retention_ms = getattr(settings, f"retention_{spec.retention}_ms")
        if retention_ms is not None:
            configs["retention.ms"] = str(retention_ms)
    if settings.min_insync_replicas is not None:
        configs["min.insync.replicas"] = str(settings.min_insync_replicas)
    return configs


def split_topic(full: str) -> tuple[str, str]:
    """``prod.job.metrics`` -> (``prod``, ``job.metrics``)."""
    env, _, name = full.partition(".")
    if not name:
        raise ValueError(f"{full!r} is not an env topic (<env>.<topic>)")
    return env, name


__all__ = [
    "BRAIN_PLANS",
    "CHECKPOINTS",
    "CLUSTER_CAPACITY",
    "CONFIG_CHANGES",
    "CONTROL_SPEC",
    "CONTROL_TOPIC",
    "DLQ",
    "ENV_NAME_PATTERN",
    "ENV_TOPICS",
    "ENV_TOPIC_NAMES",
    "EVAL_REPORTS",
    "EXPERIMENTS",
    "HOSTS_ORDERS",
    "HOSTS_REPORTS",
    "JOB_EVENTS",
    "JOB_METRICS",
    "JOB_REQUESTS",
    "SCALE_PLANS",
    "SCALE_RESULTS",
    "TRIAL_DECISIONS",
    "TRIAL_METRICS",
    "TopicSpec",
    "check_env_name",
    "env_topics",
    "split_topic",
    "topic",
    "topic_configs",
    "topic_of",
]
