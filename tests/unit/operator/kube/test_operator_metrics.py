"""The operator's metrics as a scrape sees them: one family per name, a series per env the
operator acted for (an operator that follows promotions acts for several in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from handlers.operator.kube.runner import EnvMetrics


def test_each_env_an_operator_acted_for_is_one_series_of_one_family() -> None:
    registry = CollectorRegistry(auto_describe=True)
    metrics = EnvMetrics(registry, "kubernetes")
    metrics.of("prod").answered("applied", 0.2)
    metrics.of("prod").answered("rejected", 0.01)
    metrics.of("standby").answered("applied", 3.0)
    assert metrics.of("prod") is metrics.of("prod")

    text = generate_latest(registry).decode()
    assert text.count("# TYPE dlrover_events_operator_plans_total counter") == 1, text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    plans = {
        (s.labels["env"], s.labels["status"]): s.value
        for s in families["dlrover_events_operator_plans"].samples
        if s.name.endswith("_total")
    }
    assert plans == {("prod", "applied"): 1, ("prod", "rejected"): 1, ("standby", "applied"): 1}
    latency = families["dlrover_events_operator_apply_duration_seconds"].samples
    counts = {s.labels["env"]: s.value for s in latency if s.name.endswith("_count")}
    assert counts == {"prod": 2, "standby": 1}
    assert {s.labels["platform"] for s in latency} == {"kubernetes"}
    get = registry.get_sample_value
    labels = {"env": "standby", "platform": "kubernetes", "status": "applied"}
    assert get("dlrover_events_operator_plans_total", labels) == 1
