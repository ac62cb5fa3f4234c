"""Learning curves: what a simulated trial measures when it has used so much of its budget.

A virtual env runs an experiment's trials without training anything: each trial trains at
the speed the throughput model gives its gang (training.py), and what it reports at a
budget comes from one of these models, a pure function of the trial's hyperparameters, the
budget used and a seed. So a trial's reports depend only on the decisions it got (which
budgets it was run to), never on the wall clock, and two runs of the same searcher with
the same seed see the same numbers.

Three models:

- ``ParametricCurve``: a built-in family, loss = f(lr, width, budget), a power law whose
  speed and floor depend on the learning rate's distance from the best one for the width
  (a larger rate drops faster and stalls higher: curves cross, so a short budget is a
  fair but imperfect guide to a long one, the situation ASHA is for). Deterministic noise
  from a hash of the seed, the hyperparameters and the budget.
- ``TableCurve``: curves a user recorded (a CSV or JSON table: hyperparameters, budget,
  metrics; `parse_table`), or that a real experiment of an env recorded in its
  ``trial_metrics`` table. A trial whose hyperparameters are not in the table follows the
  nearest recorded configuration (``distance``, below); between two recorded budgets a
  metric is interpolated linearly, before the first and after the last it is the nearest
  recorded value.

Pure: no I/O. Reading a file or the env's Postgres is the operator's (its shell).
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from schemas.experiments import ParamValue

#: A configuration: hyperparameter name -> value.
HParams = Mapping[str, ParamValue]

#: The metric the built-in family reports besides the experiment's own metric name, and
#: the training loss it reports between validations.
VAL_LOSS = "val_loss"
TRAIN_LOSS = "loss"

#: Names the built-in family reads its two hyperparameters under (the first found wins).
LR_NAMES = ("lr", "learning_rate", "learning-rate")
WIDTH_NAMES = ("width", "hidden", "hidden_size", "units")


class CurveError(ValueError):
    """A table that cannot be a learning curve; the message says which row and why."""


class LearningCurve(Protocol):
    """What a trial of ``hparams`` measures once it has used ``budget`` of its budget's
    unit: its validation metrics (``validation``) or its training ones."""

    def metrics(self, hparams: HParams, budget: float, *, validation: bool) -> dict[str, float]: ...


def _unit(*parts: object) -> float:
    """A number in [0, 1) that is a function of ``parts`` alone (no process-wide seed)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _normal(*parts: object) -> float:
    """A standard normal draw that is a function of ``parts`` alone (Box-Muller)."""
    u1 = max(_unit("u1", *parts), 1e-12)
    u2 = _unit("u2", *parts)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def _first(hparams: HParams, names: Sequence[str], default: float) -> float:
    for name in names:
        value = hparams.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return default


def _config_key(hparams: HParams) -> tuple[tuple[str, str], ...]:
    """A configuration as a hashable, ordered key (values by their JSON spelling, so 1
    and 1.0 differ as they do in the document)."""
    return tuple(sorted((k, json.dumps(v)) for k, v in hparams.items()))


@dataclass(frozen=True)
class ParametricCurve:
    """loss = final + (start - final) * (1 + budget / tau) ** -1, where, with
    x = log10(lr / best_lr(width)) and best_lr(width) = base_lr * sqrt(64 / width):

    - final = floor + 2 / sqrt(width) + mismatch * x**2 (too large a rate costs twice
      as much as too small), plus a per-configuration offset (seeded);
    - tau = scale * 10 ** (slow * -x) for a rate too small (it converges slower),
      scale * 10 ** (-fast * x) for one too large (a little faster, to a higher floor):
      the curves cross, and a short budget ranks configurations as a long one mostly
      does (Spearman 0.84 between 1/64 of the budget and all of it over the default
      space of the experiments' measurements), as ASHA assumes of real curves.

    Hyperparameters other than the rate and the width each add an offset in
    [0, other_weight) that depends on their value and the seed (a categorical choice
    that matters a little). Validation losses carry a multiplicative noise of
    ``noise`` (a normal draw per configuration and budget); the training loss is
    ``train_ratio`` of the noiseless validation loss."""

    seed: int = 0
    scale: float = 100.0
    noise: float = 0.01
    start: float = 2.5
    floor: float = 0.05
    base_lr: float = 1e-2
    mismatch: float = 0.15
    slow: float = 0.8
    fast: float = 0.1
    other_weight: float = 0.05
    train_ratio: float = 0.95
    default_lr: float = 1e-2
    default_width: float = 64.0

    def loss(self, hparams: HParams, budget: float) -> float:
        """The noiseless validation loss of ``hparams`` at ``budget``."""
        lr = _first(hparams, LR_NAMES, self.default_lr)
        width = max(_first(hparams, WIDTH_NAMES, self.default_width), 1.0)
        if lr <= 0:
            return self.start
        x = math.log10(lr / (self.base_lr * math.sqrt(64.0 / width)))
        final = self.floor + 2.0 / math.sqrt(width)
        final += self.mismatch * x * x * (2.0 if x > 0 else 1.0)
        known = {*LR_NAMES, *WIDTH_NAMES}
        final += sum(
            self.other_weight * _unit(self.seed, "other", name, json.dumps(value))
            for name, value in sorted(hparams.items())
            if name not in known
        )
        final += 0.02 * abs(_normal(self.seed, "init", _config_key(hparams)))
        final = min(final, self.start)
        tau = self.scale * 10.0 ** (-self.fast * x if x > 0 else -self.slow * x)
        return final + (self.start - final) / (1.0 + max(budget, 0.0) / tau)

    def metrics(self, hparams: HParams, budget: float, *, validation: bool) -> dict[str, float]:
        clean = self.loss(hparams, budget)
        if not validation:
            return {TRAIN_LOSS: clean * self.train_ratio}
        jitter = self.noise * _normal(self.seed, "val", _config_key(hparams), round(budget, 6))
        return {VAL_LOSS: max(clean * (1.0 + jitter), 0.0)}


@dataclass(frozen=True)
class CurvePoint:
    """One recorded measurement: a configuration's metrics at a budget."""

    hparams: HParams
    budget: float
    metrics: Mapping[str, float]
    validation: bool = True


@dataclass
class _Recorded:
    hparams: HParams
    #: per metric, (budget, value) in budget order, validation and training apart
    validation: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    training: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


class TableCurve:
    """Recorded curves, one per configuration; a trial follows the nearest one.

    The distance between two configurations is the Euclidean norm over every
    hyperparameter name either has, of: for numbers, the difference after scaling each
    name to [0, 1] over the table's range of it (on a log10 scale when all its values are
    positive and span more than a factor of 10, as a learning rate's do); for strings and
    booleans, 0 when equal and 1 when not; 1 for a name one side lacks. Equal distances
    go to the configuration whose sorted JSON spelling comes first, so the choice never
    depends on the table's row order."""

    def __init__(self, points: Iterable[CurvePoint]) -> None:
        self._configs: dict[tuple[tuple[str, str], ...], _Recorded] = {}
        for point in points:
            key = _config_key(point.hparams)
            recorded = self._configs.setdefault(key, _Recorded(dict(point.hparams)))
            kind = recorded.validation if point.validation else recorded.training
            for name, value in point.metrics.items():
                kind.setdefault(name, []).append((point.budget, value))
        if not self._configs:
            raise CurveError("a recorded curve table needs at least one row")
        for recorded in self._configs.values():
            for series in (*recorded.validation.values(), *recorded.training.values()):
                series.sort()
        self._ranges = self._numeric_ranges()
        self._nearest: dict[tuple[tuple[str, str], ...], _Recorded] = {}

    @property
    def configurations(self) -> int:
        return len(self._configs)

    def _numeric_ranges(self) -> dict[str, tuple[bool, float, float]]:
        """Per numeric name: (log scale?, low, span) over the table's values of it."""
        values: dict[str, list[float]] = {}
        for recorded in self._configs.values():
            for name, value in recorded.hparams.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    values.setdefault(name, []).append(float(value))
        ranges: dict[str, tuple[bool, float, float]] = {}
        for name, found in values.items():
            low, high = min(found), max(found)
            log = low > 0 and high / low > 10.0
            if log:
                low, high = math.log10(low), math.log10(high)
            ranges[name] = (log, low, (high - low) or 1.0)
        return ranges

    def _scaled(self, name: str, value: float) -> float:
        log, low, span = self._ranges[name]
        if log:
            value = math.log10(value) if value > 0 else low - span  # far below the range
        return (value - low) / span

    def distance(self, a: HParams, b: HParams) -> float:
        total = 0.0
        for name in set(a) | set(b):
            if name not in a or name not in b:
                total += 1.0
                continue
            x, y = a[name], b[name]
            numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (x, y))
            if numeric and name in self._ranges:
                total += (self._scaled(name, float(x)) - self._scaled(name, float(y))) ** 2
            else:
                total += 0.0 if json.dumps(x) == json.dumps(y) else 1.0
        return math.sqrt(total)

    def nearest(self, hparams: HParams) -> HParams:
        """The recorded configuration a trial of ``hparams`` follows."""
        return self._recorded(hparams).hparams

    def _recorded(self, hparams: HParams) -> _Recorded:
        key = _config_key(hparams)
        exact = self._configs.get(key)
        if exact is not None:
            return exact
        cached = self._nearest.get(key)
        if cached is None:
            best = min(
                self._configs, key=lambda k: (self.distance(hparams, self._configs[k].hparams), k)
            )
            cached = self._nearest[key] = self._configs[best]
        return cached

    def metrics(self, hparams: HParams, budget: float, *, validation: bool) -> dict[str, float]:
        recorded = self._recorded(hparams)
        series = recorded.validation if validation else (recorded.training or recorded.validation)
        return {name: _at(points, budget) for name, points in sorted(series.items())}


def _at(points: Sequence[tuple[float, float]], budget: float) -> float:
    """The value at ``budget``: linear between the recorded budgets around it, the
    nearest recorded value outside them."""
    if budget <= points[0][0]:
        return points[0][1]
    if budget >= points[-1][0]:
        return points[-1][1]
    for (b0, v0), (b1, v1) in itertools.pairwise(points):
        if b0 <= budget <= b1:
            return v0 if b1 == b0 else v0 + (v1 - v0) * (budget - b0) / (b1 - b0)
    return points[-1][1]  # (unreachable: the budgets are sorted)


# -- tables --------------------------------------------------------------------------------

#: A CSV column of a hyperparameter: ``hparams.<name>``; ``budget`` is the budget used;
#: ``validation`` (optional, true by default) says which kind of metric the row holds;
#: every other column is a metric.
HPARAM_PREFIX = "hparams."
BUDGET = "budget"
VALIDATION = "validation"


def _scalar(text: str) -> ParamValue:
    """A CSV cell as the value a document would carry: an int, a float, a boolean or a
    string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _number(value: Any, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CurveError(f"{where}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise CurveError(f"{where}: {value!r} is not a finite number")
    return number


def _flag(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", ""):
        return value.strip().lower() in ("true", "1", "")
    raise CurveError(f"{where}: validation is true or false, not {value!r}")


def parse_table(text: str, *, fmt: str) -> list[CurvePoint]:
    """Recorded curves from a table's text: ``fmt`` ``csv`` (columns ``hparams.<name>``,
    ``budget``, optional ``validation``, metrics) or ``json`` (a list of objects
    ``{"hparams": {...}, "budget": B, "metrics": {...}, "validation": true}``).
    CurveError names the row and what is wrong with it."""
    if fmt == "csv":
        try:
            return _parse_csv(text)
        except csv.Error as e:
            raise CurveError(f"not CSV: {e}") from None
    if fmt == "json":
        return _parse_json(text)
    raise CurveError(f"a curve table is csv or json, not {fmt!r}")


def _parse_csv(text: str) -> list[CurvePoint]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    columns = reader.fieldnames or []
    if BUDGET not in columns:
        raise CurveError(f"a curve table needs a {BUDGET!r} column (has {columns})")
    hparam_columns = [c for c in columns if c.startswith(HPARAM_PREFIX)]
    metric_columns = [c for c in columns if c not in (BUDGET, VALIDATION, *hparam_columns)]
    if not metric_columns:
        raise CurveError("a curve table needs at least one metric column")
    points: list[CurvePoint] = []
    for line, row in enumerate(reader, start=2):
        where = f"line {line}"
        hparams = {
            c.removeprefix(HPARAM_PREFIX): _scalar(row[c])
            for c in hparam_columns
            if row.get(c) not in (None, "")
        }
        metrics = {
            c: _number(row[c], f"{where}, {c}")
            for c in metric_columns
            if row.get(c) not in (None, "")
        }
        if not metrics:
            raise CurveError(f"{where}: no metric value")
        points.append(
            CurvePoint(
                hparams,
                _number(row.get(BUDGET), f"{where}, {BUDGET}"),
                metrics,
                _flag(row.get(VALIDATION, ""), where),
            )
        )
    return points


def _parse_json(text: str) -> list[CurvePoint]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise CurveError(f"not JSON: {e}") from None
    if isinstance(raw, Mapping):
        raw = raw.get("rows")
    if not isinstance(raw, list):
        raise CurveError('a JSON curve table is a list of rows (or {"rows": [...]})')
    points: list[CurvePoint] = []
    for index, row in enumerate(raw):
        where = f"row {index}"
        if not isinstance(row, Mapping):
            raise CurveError(f"{where}: an object, not {type(row).__name__}")
        hparams = row.get("hparams", {})
        metrics = row.get("metrics")
        if not isinstance(hparams, Mapping) or not all(
            isinstance(v, bool | int | float | str) for v in hparams.values()
        ):
            raise CurveError(f"{where}: hparams is an object of scalars")
        if not isinstance(metrics, Mapping) or not metrics:
            raise CurveError(f"{where}: metrics is a non-empty object")
        points.append(
            CurvePoint(
                {str(k): v for k, v in hparams.items()},
                _number(row.get(BUDGET), f"{where}, {BUDGET}"),
                {str(k): _number(v, f"{where}, {k}") for k, v in metrics.items()},
                _flag(row.get(VALIDATION, True), where),
            )
        )
    return points


__all__ = [
    "BUDGET",
    "HPARAM_PREFIX",
    "LR_NAMES",
    "TRAIN_LOSS",
    "VALIDATION",
    "VAL_LOSS",
    "WIDTH_NAMES",
    "CurveError",
    "CurvePoint",
    "HParams",
    "LearningCurve",
    "ParametricCurve",
    "TableCurve",
    "parse_table",
]
