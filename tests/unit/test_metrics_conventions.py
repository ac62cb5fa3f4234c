"""Every metric of every service follows Prometheus' conventions and is in docs/metrics.md.

The services declare their metrics in `dlrover_events/runtime/metrics.py` alone (checked here
too), each on the registry it is given; `example_registry` builds every one of them with
a series of each, so these rules walk every series a scrape could show."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from dlrover_events.runtime import metrics
from dlrover_events.runtime.metrics import catalogue, catalogue_markdown, example_registry

REPO = Path(__file__).resolve().parents[2]
#: the suffixes Prometheus gives a counter's or a histogram's series
_SERIES_SUFFIXES = ("_total", "_created", "_count", "_sum", "_bucket")
#: what a duration or a size is measured in
_UNITS = ("_seconds", "_bytes")

FAMILIES = list(example_registry().collect())


def test_every_service_has_metrics_in_the_walk() -> None:
    services = {f.name.removeprefix("dlrover_events_").split("_")[0] for f in FAMILIES}
    assert services >= {"brain", "operator", "archiver", "evaluator", "console", "gateway"}
    assert "service" in services and "bus" in services  # up's supervisor


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_series_carries_env(family: object) -> None:
    samples = family.samples  # type: ignore[attr-defined]
    assert samples, "no series: the walk did not give it its labels"
    for sample in samples:
        assert sample.labels.get("env"), sample


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_names_say_what_they_count_and_in_which_unit(family: object) -> None:
    name: str = family.name  # type: ignore[attr-defined]
    kind: str = family.type  # type: ignore[attr-defined]
    assert re.fullmatch(r"dlrover_events_[a-z][a-z0-9_]*[a-z0-9]", name), name
    assert not name.endswith(_SERIES_SUFFIXES), f"{name}: a suffix Prometheus adds itself"
    if kind == "counter":
        for sample in family.samples:  # type: ignore[attr-defined]
            assert sample.name in (f"{name}_total", f"{name}_created"), sample.name
    elif kind == "gauge":
        # a gauge named for what happened so far ("applied", "evicted") is a cumulative
        # count: a counter, else rate() and resets mean nothing
        last = name.rsplit("_", 1)[-1]
        assert not last.endswith("ed"), f"{name}: a cumulative count must be a counter"
    elif kind == "histogram":
        assert name.endswith(_UNITS), f"{name}: a histogram says its unit"
    else:
        pytest.fail(f"{name}: {kind} (the services declare counters, gauges, histograms)")


def test_a_counter_of_seconds_says_so_before_total() -> None:
    for m in catalogue():
        if m.type == "counter" and "seconds" in m.name:
            assert m.name.endswith("_seconds_total"), m.name


def test_metrics_are_declared_in_the_metrics_module_only() -> None:
    """A metric declared elsewhere would escape every rule here and the table."""
    declaring = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
    offenders = []
    for folder in ("dlrover_events", "streams", "handlers", "sdk"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == Path(metrics.__file__).resolve():
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "prometheus_client"
                ):
                    names = {alias.name for alias in node.names} & declaring
                    if names:
                        offenders.append(f"{path.relative_to(REPO)}: {sorted(names)}")
    assert not offenders, offenders


def test_every_metrics_class_is_in_the_walk() -> None:
    classes = {
        cls
        for _, cls in inspect.getmembers(metrics, inspect.isclass)
        if cls.__module__ == metrics.__name__
        and "registry" in inspect.signature(cls.__init__).parameters
        and cls is not metrics.CountersRead
    }
    built = {type(m) for m in metrics._every_service(metrics.CollectorRegistry())}
    assert classes == built


def test_docs_metrics_md_is_the_table_the_code_writes() -> None:
    doc = (REPO / "docs" / "metrics.md").read_text()
    found = re.search(r"<!-- metrics list: begin -->\n(.*)<!-- metrics list: end -->", doc, re.S)
    assert found, "docs/metrics.md lost its markers"
    assert found.group(1) == catalogue_markdown(), (
        "docs/metrics.md is out of date: paste the output of `dlrover-events metrics list`"
    )
