"""Prometheus metrics of the long-running services, all declared here.

One place lists every metric a user can scrape (`dlrover-events metrics list` prints the
table of `catalogue()`, docs/metrics.md holds it, a test checks both agree), so names
follow one convention (Prometheus'): `dlrover_events_<service>_<what>[_<unit>][_total]`;
a count that only grows is a Counter (its name ends in `_total`), a value that goes up
and down a Gauge, a unit is in the name (`_seconds`, `_bytes`, `_records`), and every
series carries an `env` label (tests/unit/test_metrics_conventions.py walks them all).

No metric lives in a process-global registry: `up` runs several services (and `ab run`
one brain per arm) in one process, so each service instance declares its metrics on the
`CollectorRegistry` it is given (`ServiceContext.metrics`), and `MetricsServer` serves
the registries of a process on one port. Two instances of one service in one process get
two registries and say which is which by their `env` label.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from dlrover_events.lifecycle import AsyncResource

log = logging.getLogger(__name__)

#: Seconds: from milliseconds (a plan decided in a batch) to a minute (a pod created).
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class BrainMetrics:
    """What an operator watches to see a brain keep up: lag per input partition, the
    decisions and plans it makes, how long an event waits for its plan, checkpoints."""

    def __init__(self, registry: CollectorRegistry, env: str) -> None:
        self.env = env
        self.consumer_lag = Gauge(
            "dlrover_events_brain_consumer_lag_records",
            "records of an input partition not yet decided (the log's end as last fetched minus "
            "the next offset to decide)",
            ["env", "topic", "partition"],
            registry=registry,
        )
        self.decisions = Counter(
            "dlrover_events_brain_decisions_total",
            "events that triggered an optimizer",
            ["env"],
            registry=registry,
        ).labels(env)
        self.events = Counter(
            "dlrover_events_brain_events_total",
            "input records decided (dead letters included)",
            ["env"],
            registry=registry,
        ).labels(env)
        self.plans = Counter(
            "dlrover_events_brain_plans_total",
            "plans published, by kind (optimize, scale)",
            ["env", "kind"],
            registry=registry,
        )
        self.plan_latency = Histogram(
            "dlrover_events_brain_plan_latency_seconds",
            "from fetching the record that caused a plan to the broker's ack of the plan",
            ["env"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(env)
        self.plan_publication_latency = Histogram(
            "dlrover_events_brain_plan_publication_latency_seconds",
            "from the publication of the input record that caused a plan (its record's "
            "timestamp) to the broker's ack of the plan: the fetch, the wait behind a backlog, "
            "the decision and the publication",
            ["env"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(env)
        self.checkpoint_duration = Histogram(
            "dlrover_events_brain_checkpoint_duration_seconds",
            "one checkpoint: job states and offsets to Postgres, then the commit",
            ["env"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(env)
        self.dead_letters = Counter(
            "dlrover_events_brain_dead_letters_total",
            "records sent to the env's DLQ, by failure kind",
            ["env", "kind"],
            registry=registry,
        )
        #: where a brain's wall time goes (`bench ab` splits a lockstep tick with it)
        self.decide_duration = Histogram(
            "dlrover_events_brain_decide_duration_seconds",
            "one fetched batch decided by the processor (the brain's own CPU)",
            ["env"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(env)
        self.publish_duration = Histogram(
            "dlrover_events_brain_publish_duration_seconds",
            "one decided batch's plans, dead letters and lockstep acks, to the broker's acks",
            ["env"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(env)
        self.scheduler_leader = Gauge(
            "dlrover_events_brain_scheduler_leader",
            "1 while this instance leads its env's cluster scheduler, 0 while it stands by "
            "(absent in an env without a scheduler)",
            ["env"],
            registry=registry,
        )

    def lag(self, topic: str, partition: int, records: int) -> None:
        self.consumer_lag.labels(self.env, topic, str(partition)).set(records)


class OperatorMetrics:
    """What an operator did with the plans it read, per platform."""

    def __init__(self, registry: CollectorRegistry, env: str, platform: str) -> None:
        self.env = env
        self.platform = platform
        self._plans = Counter(
            "dlrover_events_operator_plans_total",
            "ScalePlans answered, by result status (applied, partial, rejected, failed); platform "
            "kubernetes, local or virtual",
            ["env", "platform", "status"],
            registry=registry,
        )
        self.apply_latency = Histogram(
            "dlrover_events_operator_apply_duration_seconds",
            "from reading a plan to publishing its ScaleResult",
            ["env", "platform"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(env, platform)

        self.ticks = Counter(
            "dlrover_events_operator_ticks_total",
            "lockstep ticks run by a virtual operator",
            ["env", "platform"],
            registry=registry,
        ).labels(env, platform)
        self._phase = Counter(
            "dlrover_events_operator_phase_seconds_total",
            "wall seconds a virtual operator spent, by phase (simulate: the simulated "
            "cluster; apply; checkpoint: saving it to Postgres; publish: its events to the "
            "broker; mark_published; wait_acks: a lockstep tick waiting for its brain's "
            "acknowledgements; input_*: handling its consumer's records)",
            ["env", "platform", "phase"],
            registry=registry,
        )

    def answered(self, status: str, seconds: float) -> None:
        self._plans.labels(self.env, self.platform, status).inc()
        self.apply_latency.observe(seconds)

    def spent(self, phase: str, seconds: float) -> None:
        self._phase.labels(self.env, self.platform, phase).inc(seconds)


class ArchiverMetrics:
    def __init__(self, registry: CollectorRegistry, env: str) -> None:
        self.records = Counter(
            "dlrover_events_archiver_records_total",
            "records archived to Postgres",
            ["env"],
            registry=registry,
        ).labels(env)
        self.dead_letters = Counter(
            "dlrover_events_archiver_dead_letters_total",
            "records sent to the env's DLQ, by failure kind",
            ["env", "kind"],
            registry=registry,
        )
        self.batch_duration = Histogram(
            "dlrover_events_archiver_batch_duration_seconds",
            "one batch written to Postgres and committed",
            ["env"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(env)


class SearcherMetrics:
    def __init__(self, registry: CollectorRegistry, env: str) -> None:
        self.inputs = Counter(
            "dlrover_events_searcher_inputs_total",
            "inputs that concern an experiment, decided (actions, trial metrics, the "
            "operator's answers, trial jobs' ends)",
            ["env"],
            registry=registry,
        ).labels(env)
        self.skipped = Counter(
            "dlrover_events_searcher_skipped_total",
            "inputs read again and skipped: its checkpoint had them already (read again "
            "after a restart, or after another instance had them)",
            ["env"],
            registry=registry,
        ).labels(env)
        self.decisions = Counter(
            "dlrover_events_searcher_decisions_total",
            "trial decisions made, by kind (create, run, pause, resume, stop, complete, done)",
            ["env", "decision"],
            registry=registry,
        )
        self.dead_letters = Counter(
            "dlrover_events_searcher_dead_letters_total",
            "records sent to the env's DLQ, by failure kind",
            ["env", "kind"],
            registry=registry,
        )
        self.batch_duration = Histogram(
            "dlrover_events_searcher_batch_duration_seconds",
            "one batch decided, checkpointed with its outbox, published and committed",
            ["env"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(env)


class EvaluatorMetrics:
    def __init__(self, registry: CollectorRegistry, env: str) -> None:
        self.records = Counter(
            "dlrover_events_evaluator_records_total",
            "records the evaluators read",
            ["env"],
            registry=registry,
        ).labels(env)
        self.reports = Counter(
            "dlrover_events_evaluator_reports_total",
            "evaluation reports published, by evaluator",
            ["env", "evaluator"],
            registry=registry,
        )


class ConsoleMetrics:
    def __init__(self, registry: CollectorRegistry, env: str) -> None:
        self.clients = Gauge(
            "dlrover_events_console_clients",
            "browsers following the live view",
            ["env"],
            registry=registry,
        ).labels(env)


class CountersRead(Collector):
    """Counters whose values a service keeps anyway (changes applied, jobs evicted), read
    at each scrape rather than incremented twice: `name -> (help, read)`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        env: str,
        counters: dict[str, tuple[str, Callable[[], float]]],
    ) -> None:
        self.env = env
        self.counters = counters
        registry.register(self)

    def _families(self, read: bool) -> Iterator[Metric]:
        for name, (documentation, value) in self.counters.items():
            family = CounterMetricFamily(name, documentation, labels=["env"])
            if read:
                family.add_metric([self.env], value())
            yield family

    def describe(self) -> Iterator[Metric]:
        return self._families(read=False)

    def collect(self) -> Iterator[Metric]:
        return self._families(read=True)


class GatewayMetrics:
    """The config gateway: its requests, and what its index and plan book hold (read at
    each scrape from the callables given)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        env: str,
        *,
        documents: Callable[[], float],
        ready: Callable[[], float],
        changes_applied: Callable[[], float],
        plan_jobs: Callable[[], float],
        plan_waiters: Callable[[], float],
        plans_ready: Callable[[], float],
        plan_jobs_evicted: Callable[[], float],
    ) -> None:
        self.env = env
        self._requests = Counter(
            "dlrover_events_gateway_requests_total",
            "HTTP requests answered, by route, method and status",
            ["env", "route", "method", "status"],
            registry=registry,
        )
        self._duration = Histogram(
            "dlrover_events_gateway_request_duration_seconds",
            "HTTP request duration by route (long-polls included)",
            ["env", "route"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30, 60),
            registry=registry,
        )
        self.long_polls = Gauge(
            "dlrover_events_gateway_long_polls",
            "config long-polls waiting for a change",
            ["env"],
            registry=registry,
        ).labels(env)
        self._read: dict[str, Gauge] = {}
        for name, documentation, read in (
            ("documents", "config documents in the index", documents),
            ("ready", "1 once the index has caught up with the env's config changes", ready),
            ("plan_jobs", "jobs whose plan the gateway follows", plan_jobs),
            ("plan_waiters", "plan long-polls and optimize requests waiting", plan_waiters),
            ("plans_ready", "1 once the job and plan topics were read", plans_ready),
        ):
            gauge = Gauge(
                f"dlrover_events_gateway_{name}", documentation, ["env"], registry=registry
            )
            gauge.labels(env).set_function(read)
            self._read[name] = gauge
        self.counts = CountersRead(
            registry,
            env,
            {
                "dlrover_events_gateway_changes_applied_total": (
                    "config changes applied to the index from the env's feed",
                    changes_applied,
                ),
                "dlrover_events_gateway_plan_jobs_evicted_total": (
                    "jobs the gateway stopped following to stay within its cap",
                    plan_jobs_evicted,
                ),
            },
        )

    def answered(self, route: str, method: str, status: int, seconds: float) -> None:
        self._requests.labels(self.env, route, method, str(status)).inc()
        self._duration.labels(self.env, route).observe(seconds)


class ServiceMetrics:
    """What `up`'s supervisor knows of each service it runs, and of the bus."""

    def __init__(self, registry: CollectorRegistry, env: str) -> None:
        self.up = Gauge(
            "dlrover_events_service_up",
            "1 while the service runs, 0 once it stopped or failed",
            ["env", "service"],
            registry=registry,
        )
        self.restarts = Counter(
            "dlrover_events_service_restarts_total",
            "times the supervisor started a service again after it failed",
            ["env", "service"],
            registry=registry,
        )
        self.bus_up = Gauge(
            "dlrover_events_bus_up",
            "1 while the broker answers, 0 while it is away (as `up` of the env sees it)",
            ["env"],
            registry=registry,
        ).labels(env)


@dataclass(frozen=True)
class MetricInfo:
    """One metric as a scrape shows it: the name (a counter's with `_total`), its type,
    its labels (`env` first) and what it says."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str


#: Every service's metrics, built as the service builds them (an example env and
#: platform; the gateway's readings at 0): what `catalogue()` lists.
def _every_service(registry: CollectorRegistry) -> list[object]:
    env = "<env>"
    zero: Callable[[], float] = lambda: 0.0  # noqa: E731
    return [
        BrainMetrics(registry, env),
        OperatorMetrics(registry, env, "<platform>"),
        ArchiverMetrics(registry, env),
        SearcherMetrics(registry, env),
        EvaluatorMetrics(registry, env),
        ConsoleMetrics(registry, env),
        GatewayMetrics(
            registry,
            env,
            documents=zero,
            ready=zero,
            changes_applied=zero,
            plan_jobs=zero,
            plan_waiters=zero,
            plans_ready=zero,
            plan_jobs_evicted=zero,
        ),
        ServiceMetrics(registry, env),
    ]


def example_registry() -> CollectorRegistry:
    """A registry with every metric of every service and a series of each (label values
    `<label>`), as a scrape of all of them would show: for the catalogue and the test of
    the conventions.

    A labelled metric shows no series until its labels are given; its label names are
    read from prometheus_client's `_labelnames`, the one private member used here."""
    registry = CollectorRegistry(auto_describe=True)
    for metrics in _every_service(registry):
        for held in vars(metrics).values():
            for metric in held.values() if isinstance(held, dict) else [held]:
                if not isinstance(metric, MetricWrapperBase) or metric._labelvalues:
                    continue  # not a metric, or one labelled already
                if metric._labelnames:
                    metric.labels(*(f"<{name}>" for name in metric._labelnames))
    return registry


def catalogue() -> list[MetricInfo]:
    """Every metric of every service, by name."""
    out = []
    for family in example_registry().collect():
        labels: dict[str, None] = {"env": None}
        for sample in family.samples:
            labels.update(dict.fromkeys(k for k in sample.labels if k != "le"))
        name = f"{family.name}_total" if family.type == "counter" else family.name
        out.append(MetricInfo(name, family.type, tuple(labels), family.documentation))
    return sorted(out, key=lambda m: m.name)


def catalogue_markdown() -> str:
    """The table of docs/metrics.md (`dlrover-events metrics list`)."""
    rows = [
        "| metric | type | labels | what |",
        "| --- | --- | --- | --- |",
    ]
    for m in catalogue():
        text = m.help.replace("|", "\\|")
        rows.append(f"| `{m.name}` | {m.type} | {', '.join(m.labels)} | {text} |")
    return "\n".join(rows) + "\n"


class _Registries(Collector):
    """The collectors of several registries as one, for one scrape."""

    def __init__(self, registries: Iterable[CollectorRegistry]) -> None:
        self.registries = list(registries)

    def collect(self) -> Iterator[Metric]:
        for registry in self.registries:
            yield from registry.collect()


#: whether a process is ready, and what to say about it (`up`: the bus and each service)
Readiness = Callable[[], tuple[bool, dict[str, Any]]]


class MetricsServer(AsyncResource):
    """`GET /metrics` for the registries of this process, on 127.0.0.1 unless configured.

    `up` starts one for every service it runs; a standalone command starts one for its
    own service.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        readiness: Readiness | None = None,
    ) -> None:
        self.host = host
        self.port = port
        #: with it, also /healthz (the process answers) and /readyz (503 while not ready)
        self._readiness = readiness
        self._registries: list[CollectorRegistry] = []
        self._runner: web.AppRunner | None = None

    def add(self, registry: CollectorRegistry) -> None:
        if registry not in self._registries:
            self._registries.append(registry)

    def exposition(self) -> bytes:
        merged = CollectorRegistry(auto_describe=False)
        merged.register(_Registries(self._registries))
        return generate_latest(merged)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        assert self._readiness is not None
        ready, body = self._readiness()
        return web.json_response({"ready": ready, **body}, status=200 if ready else 503)

    async def start(self) -> None:
        """Listen; OSError when the port is taken (the caller says what to do then)."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics, allow_head=False)
        if self._readiness is not None:
            app.router.add_get("/healthz", self._healthz, allow_head=False)
            app.router.add_get("/readyz", self._readyz, allow_head=False)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        server: Any = site._server
        if self.port == 0 and server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        log.info("metrics on %s", self.url)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/metrics"


__all__ = [
    "LATENCY_BUCKETS",
    "ArchiverMetrics",
    "BrainMetrics",
    "CollectorRegistry",
    "ConsoleMetrics",
    "CountersRead",
    "EvaluatorMetrics",
    "GatewayMetrics",
    "MetricInfo",
    "MetricsServer",
    "OperatorMetrics",
    "SearcherMetrics",
    "ServiceMetrics",
    "catalogue",
    "catalogue_markdown",
    "example_registry",
]
