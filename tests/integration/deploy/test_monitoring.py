"""deploy/components/monitoring, read: its ServiceMonitor and PrometheusRule are valid by
the Prometheus Operator's own schemas (as compiled from its CRDs by the npm package
@kubernetes-models/prometheus-operator: node and npm needed, the package installed here
from package.json when missing); every PromQL expression of the alerts and of the Grafana
dashboard parses, and names only metrics the services declare (docs/metrics.md) with
labels they carry (or that Prometheus adds when it scrapes); the dashboard shows what an
operator of the install needs. That a running service serves each of those metrics is
checked on real processes by tests/integration/k8s/test_cluster_as_processes.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from dlrover_events.runtime.metrics import catalogue
from schemas.plans import ScaleStatus
from tests.integration.deploy.manifests import Doc, of_kind, with_component
from tests.integration.deploy.promql import (
    TARGET_LABELS,
    Query,
    base_name,
    expressions,
    parse,
)

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
DECLARED = {m.name: set(m.labels) for m in catalogue()}
#: Prometheus' own series about each target
PROMETHEUS = {"up": set()}
#: what the dashboard must show (issue 24): the metrics behind each
SHOWN = {
    "consumer lag": "dlrover_events_brain_consumer_lag_records",
    "decisions per second": "dlrover_events_brain_decisions_total",
    "plan latency": "dlrover_events_brain_plan_latency_seconds",
    "plans applied, partial, rejected": "dlrover_events_operator_plans_total",
    "dead letters": "dlrover_events_brain_dead_letters_total",
    "gateway requests": "dlrover_events_gateway_requests_total",
    "trial decisions": "dlrover_events_searcher_decisions_total",
}


@pytest.fixture(scope="module")
def monitoring(tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    return with_component("monitoring", tmp_path_factory.mktemp("monitoring"))


@pytest.fixture(scope="module")
def queries(monitoring: list[Doc]) -> list[Query]:
    found = [parse(where, expr) for where, expr in expressions(monitoring)]
    assert len(found) > 10
    return found


def test_objects_are_valid_by_the_prometheus_operator_schemas(monitoring: list[Doc]) -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "node and npm are needed for @kubernetes-models/prometheus-operator"
    if not (HERE / "node_modules" / "@kubernetes-models" / "prometheus-operator").exists():
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund"], cwd=HERE, check=True, timeout=300
        )
    objects = [d for d in monitoring if d["kind"] in ("ServiceMonitor", "PrometheusRule")]
    assert sorted(d["kind"] for d in objects) == ["PrometheusRule", "ServiceMonitor"]

    def validate(docs: list[Doc]) -> list[str]:
        done = subprocess.run(
            [node, str(HERE / "validate_monitoring.mjs")],
            input=json.dumps(docs), capture_output=True, text=True, cwd=HERE, timeout=60,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    assert validate(objects) == [
        f"ok {d['kind']} {d['metadata']['name']}" for d in objects
    ]  # fmt: skip
    # ... and the validator does reject: a rule's `for` that is no duration.
    broken = json.loads(json.dumps(of_kind(monitoring, "PrometheusRule")["dlrover-events"]))
    broken["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    (said,) = validate([broken])
    assert said.startswith("invalid PrometheusRule dlrover-events: ") and "/for" in said


def test_every_query_names_declared_metrics_and_their_labels(queries: list[Query]) -> None:
    known = DECLARED | PROMETHEUS
    for query in queries:
        names = {base_name(s.name) for s in query.selectors}
        assert names, f"{query.where}: selects nothing: {query.expr}"
        unknown = names - set(known)
        assert not unknown, f"{query.where}: no such metric {sorted(unknown)} (docs/metrics.md)"
        carried = set().union(*(known[n] for n in names)) | TARGET_LABELS
        if any(s.name.endswith("_bucket") for s in query.selectors):
            carried.add("le")
        assert query.labels <= carried, (
            f"{query.where}: labels {sorted(query.labels - carried)} are on none of "
            f"{sorted(names)}: {query.expr}"
        )


def test_label_values_are_ones_the_services_set(queries: list[Query]) -> None:
    statuses = {s.value for s in ScaleStatus}
    for query in queries:
        for selector in query.selectors:
            wanted = selector.matchers.get("status")
            if selector.name == "dlrover_events_operator_plans_total" and wanted:
                assert set(wanted.split("|")) <= statuses, (query.where, wanted)


def test_the_dashboard_shows_what_the_install_needs(monitoring: list[Doc]) -> None:
    (dashboards,) = [
        d
        for d in monitoring
        if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard")
    ]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = dashboards["data"].values()
    dashboard = json.loads(text)
    assert dashboard["uid"] == "dlrover-events"
    shown = {
        base_name(s.name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for s in parse(panel["title"], target["expr"]).selectors
    }
    missing = {what: metric for what, metric in SHOWN.items() if metric not in shown}
    assert not missing, missing
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert all('env=~"$env"' in t["expr"] for t in panel["targets"]), panel["title"]


def test_the_service_monitor_scrapes_every_metrics_port(monitoring: list[Doc]) -> None:
    (monitor,) = of_kind(monitoring, "ServiceMonitor").values()
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["endpoints"]
    services = [d for d in monitoring if d["kind"] == "Service"]
    picked = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
    assert picked == services
    for service in picked:
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
