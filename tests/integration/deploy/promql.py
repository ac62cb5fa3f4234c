"""What the monitoring of deploy/components/monitoring asks Prometheus: every PromQL
expression of its alert rules and of its Grafana dashboard, parsed (promql-parser, a
parser of Prometheus' grammar), and the series each one selects with the labels it uses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import promql_parser

from tests.integration.deploy.manifests import Doc

#: labels Prometheus adds to every series it scrapes through a ServiceMonitor
TARGET_LABELS = frozenset(
    {"namespace", "service", "pod", "job", "instance", "endpoint", "container"}
)
#: Grafana's variables, as a query sends them (a range, and an env regex)
GRAFANA = {"$__rate_interval": "5m", "$__interval": "1m"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass
class Selector:
    """A series selector (`name{matchers}`) and the labels the expression around it names."""

    name: str
    matchers: dict[str, str] = field(default_factory=dict)  # label -> value or regex


@dataclass
class Query:
    where: str
    expr: str
    selectors: list[Selector]
    #: every label the expression names (matchers, by/without, on/ignoring, group_*)
    labels: set[str]


def expressions(docs: list[Doc]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every alert rule and every dashboard panel's target."""
    for doc in docs:
        if doc["kind"] == "PrometheusRule":
            for group in doc["spec"]["groups"]:
                for rule in group["rules"]:
                    yield f"rule {rule.get('alert') or rule.get('record')}", rule["expr"]
        if doc["kind"] == "ConfigMap" and "grafana_dashboard" in doc["metadata"].get("labels", {}):
            for key, text in doc["data"].items():
                dashboard = json.loads(text)
                for panel in dashboard["panels"]:
                    for target in panel["targets"]:
                        yield f"{key}: panel {panel['title']!r}", target["expr"]
                for var in dashboard["templating"]["list"]:
                    if var["type"] == "query":
                        query = var["query"]["query"]
                        # label_values(METRIC, LABEL): Grafana's, not PromQL
                        metric, _, label = (
                            query.removeprefix("label_values(").rstrip(")").partition(",")
                        )
                        yield (
                            f"{key}: variable {var['name']}",
                            f"count by ({label.strip()}) ({metric})",
                        )


def parse(where: str, expr: str) -> Query:
    for variable, value in GRAFANA.items():
        expr = expr.replace(variable, value)
    try:
        tree = promql_parser.parse(expr)
    except ValueError as err:
        raise AssertionError(f"{where}: {err}: {expr}") from None
    selectors: list[Selector] = []
    labels: set[str] = set()
    _walk(tree, selectors, labels)
    return Query(where, expr, selectors, labels)


def _walk(node: Any, selectors: list[Selector], labels: set[str]) -> None:
    kind = type(node).__name__
    if kind == "VectorSelector":
        matchers = {m.name: m.value for m in node.matchers.matchers}
        selectors.append(Selector(node.name or matchers.get("__name__", ""), matchers))
        labels.update(m for m in matchers if m != "__name__")
        return
    if kind == "AggregateExpr" and node.modifier is not None:
        labels.update(node.modifier.labels)
    if kind == "BinaryExpr" and node.modifier is not None:
        if node.modifier.matching is not None:
            labels.update(node.modifier.matching.labels)
        labels.update(getattr(node.modifier, "group_labels", None) or [])
    for attr in ("lhs", "rhs", "expr", "vector_selector", "param"):
        child = getattr(node, attr, None)
        if child is not None and type(child).__module__.startswith("promql_parser"):
            _walk(child, selectors, labels)
    for child in getattr(node, "args", None) or []:
        _walk(child, selectors, labels)


def base_name(name: str) -> str:
    """A histogram's series name to the histogram's name."""
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name
