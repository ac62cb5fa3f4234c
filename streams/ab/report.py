"""The A/B comparison: which arm is better on each KPI, by how much, how sure we are;
rendered as a terminal table, and as an HTML report with plots (and the plots as PNG).

Pure computation first (`compare`), rendering second; matplotlib draws off-screen.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from dlrover_events.extras import SIM
from streams.evaluators.api import Metrics
from streams.evaluators.compare import Interval, bootstrap_mean, paired_difference, verdict
from streams.evaluators.registry import HIGHER_IS_BETTER


@dataclass
class ArmResult:
    name: str
    env: str
    settings_source: str
    jct: dict[str, float]  # job -> seconds, finished jobs only
    metrics: Metrics
    gpu_use: list[tuple[float, int]] = field(default_factory=list)
    unfinished: int = 0


@dataclass(frozen=True)
class Row:
    metric: str
    values: dict[str, float]


@dataclass
class Comparison:
    arms: list[ArmResult]
    jct_ci: dict[str, Interval]  # arm -> mean JCT with CI
    jct_diff: dict[str, Interval]  # arm (not the first) -> paired diff vs the first arm
    rows: list[Row]
    verdicts: list[str]


def compare(arms: Sequence[ArmResult], *, seed: int = 0) -> Comparison:
    base = arms[0]
    jct_ci = {a.name: bootstrap_mean(list(a.jct.values()), seed=seed) for a in arms}
    jct_diff = {a.name: paired_difference(base.jct, a.jct, seed=seed) for a in arms[1:]}
    keys = sorted({k for a in arms for k in a.metrics})
    rows = [Row(k, {a.name: a.metrics.get(k, 0.0) for a in arms}) for k in keys]
    verdicts = [
        verdict(diff, f"JCT {base.name} -> {name}")
        .replace(" A ", f" {base.name} ")
        .replace(" B ", f" {name} ")
        for name, diff in jct_diff.items()
    ]
    return Comparison(list(arms), jct_ci, jct_diff, rows, verdicts)


def table(c: Comparison) -> Table:
    t = Table("metric", *[a.name for a in c.arms], title="A/B comparison")
    t.add_row(
        "JCT mean s (95% CI)",
        *[
            f"{ci.estimate:,.0f} [{ci.low:,.0f}, {ci.high:,.0f}] n={ci.n}"
            for ci in (c.jct_ci[a.name] for a in c.arms)
        ],
    )
    for name, diff in c.jct_diff.items():
        cells = [""] * len(c.arms)
        cells[[a.name for a in c.arms].index(name)] = (
            f"{diff.estimate:+,.0f} [{diff.low:+,.0f}, {diff.high:+,.0f}]"
        )
        t.add_row(f"JCT vs {c.arms[0].name} (paired)", *cells)
    for row in c.rows:
        marker = " (higher is better)" if row.metric in HIGHER_IS_BETTER else ""
        t.add_row(row.metric + marker, *[f"{row.values[a.name]:,.4g}" for a in c.arms])
    t.add_row("unfinished jobs", *[str(a.unfinished) for a in c.arms])
    return t


def plot_png(c: Comparison) -> bytes:
    """JCT distributions (CDF) and cluster GPU use over time, one figure."""
    try:
        import matplotlib
    except ImportError:
        raise SIM.missing() from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm in c.arms:
        values = sorted(arm.jct.values())
        if values:
            ax1.step(
                values,
                [(i + 1) / len(values) for i in range(len(values))],
                where="post",
                label=f"{arm.name} (mean {c.jct_ci[arm.name].estimate:,.0f} s)",
            )
        if arm.gpu_use:
            ax2.plot(
                [t / 3600 for t, _ in arm.gpu_use], [g for _, g in arm.gpu_use], label=arm.name
            )
    ax1.set(
        xscale="log",
        xlabel="job completion time (s)",
        ylabel="fraction of jobs",
        title="JCT distribution",
    )
    ax2.set(
        xlabel="hours since a job first held GPUs",
        ylabel="GPUs allocated",
        title="GPU use over time",
    )
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # (an experiment alone has no jobs' JCTs)
            ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def render_html(c: Comparison, png: bytes, title: str) -> str:
    head = "".join(f"<th>{html.escape(a.name)}</th>" for a in c.arms)
    settings = "".join(
        f"<li><b>{html.escape(a.name)}</b>: env <code>{html.escape(a.env)}</code>, settings "
        f"{html.escape(a.settings_source)}</li>"
        for a in c.arms
    )
    ci_cells = "".join(
        f"<td>{ci.estimate:,.0f} s<br><small>95% CI [{ci.low:,.0f}, {ci.high:,.0f}], "
        f"n={ci.n}</small></td>"
        for ci in (c.jct_ci[a.name] for a in c.arms)
    )
    rows = "".join(
        f"<tr><td>{html.escape(r.metric)}</td>"
        + "".join(f"<td>{r.values[a.name]:,.4g}</td>" for a in c.arms)
        + "</tr>"
        for r in c.rows
    )
    verdicts = "".join(f"<li>{html.escape(v)}</li>" for v in c.verdicts)
    img = base64.b64encode(png).decode()
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}td:first-child{{text-align:left}}
</style></head><body>
<h1>{html.escape(title)}</h1>
<ul>{settings}</ul>
<h2>Verdict</h2><ul>{verdicts}</ul>
<h2>Average job completion time</h2>
<table><tr><th></th>{head}</tr><tr><td>JCT mean</td>{ci_cells}</tr></table>
<h2>All KPIs</h2>
<table><tr><th>metric</th>{head}</tr>{rows}</table>
<h2>Plots</h2><img alt="JCT distribution and GPU use" src="data:image/png;base64,{img}">
<p><small>Confidence intervals: bootstrap over jobs (2000 resamples, seeded); the paired
difference resamples the jobs both arms finished.</small></p>
</body></html>
"""


def write_report(c: Comparison, folder: Path, title: str) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    png = plot_png(c)
    png_path, html_path = folder / "ab-report.png", folder / "ab-report.html"
    png_path.write_bytes(png)
    html_path.write_text(render_html(c, png, title))
    return html_path, png_path
