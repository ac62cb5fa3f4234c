"""How fast and how usefully an application trains, from the Pollux (OSDI'21) measurements.

The virtual environment must answer "what would this job do under that plan" without a
cluster, so every number here comes from measured traces, never from a fitted model of our
own: step time and sync time per placement and per-GPU batch size, and the gradient
statistics that make a larger batch worth less than its size (AdaScale's gain).

Lookups follow the artifact's simulator (``simulator/applications.py`` of petuum/adaptdl at
the OSDI'21 commit) so results stay comparable with the paper:

- a placement measured in ``placements.csv`` interpolates linearly between its measured
  local batch sizes only;
- any other placement interpolates linearly over (num_nodes, num_replicas, local_bsz) across
  ``placements.csv`` averaged per configuration plus ``scalability.csv``;
- gradient statistics interpolate linearly between the two traced batch sizes around the
  batch size, per epoch;
- progress is counted in scale-invariant iterations, and a job is done once it reaches the
  progress of the final traced epoch.

The trace files are the only I/O: read once per (folder, application) and cached.
"""

from __future__ import annotations

import bisect
import csv
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Protocol

from dlrover_events.extras import SIM

try:
    import numpy as np
    from scipy.interpolate import LinearNDInterpolator
except ImportError:  # the core install: brains, operators and gateways need no simulator
    raise SIM.missing() from None

POLLUX_DIR_ENV = "DLROVER_EVENTS_POLLUX_DIR"

#: The Pollux artifact's traces and workloads, shipped inside the package (data/pollux,
#: with SOURCE.md: the source commit and its Apache-2.0 licence), so a clone or a wheel
#: simulates without anything beside it.
DEFAULT_POLLUX_DIR = Path(__file__).resolve().parent / "data" / "pollux"

#: The traces stop at 4 GPUs per node; a bigger node is modelled as several 4-GPU nodes,
#: which overstates its sync cost (NVLink inside a node beats the network) but stays inside
#: measured data instead of extrapolating.
TRACED_GPUS_PER_NODE = 4

#: The artifact's scalability runs stop at 16 nodes and it clamps larger node counts to 16.
TRACED_MAX_NODES = 16

#: Per-application settings the artifact passes explicitly instead of reading them from the
#: traces (``APPLICATIONS`` in its applications.py): yolov3 runs out of GPU memory above a
#: local batch of 8 even though the throughput traces go further.
_MAX_LOCAL_BSZ_OVERRIDE: Mapping[str, int] = {"yolov3": 8}


class TraceDataError(FileNotFoundError):
    """The Pollux data is not where the configuration says."""


class OutOfTraceError(ValueError):
    """A configuration outside everything measured: answering would be a guess."""


def pollux_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The data folder: DLROVER_EVENTS_POLLUX_DIR, else the copy the package ships."""
    env = os.environ if environ is None else environ
    configured = env.get(POLLUX_DIR_ENV)
    path = Path(configured) if configured else DEFAULT_POLLUX_DIR
    if not path.is_dir():
        raise TraceDataError(
            f"Pollux data folder {path} does not exist: set {POLLUX_DIR_ENV} to the folder "
            f"holding traces/ and workloads/ (default {DEFAULT_POLLUX_DIR})"
        )
    return path


@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds of one micro-step (one local batch per replica) including gradient sync."""

    step_time: float
    sync_time: float

    @property
    def compute_time(self) -> float:
        """What each extra accumulation micro-step costs: it skips the all-reduce."""
        return self.step_time - self.sync_time

    def iteration_time(self, accumulation_steps: int) -> float:
        """Seconds per optimizer step when each replica accumulates that many local batches."""
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
        return self.step_time + (accumulation_steps - 1) * self.compute_time


@dataclass(frozen=True, slots=True)
class EpochTrace:
    """One epoch of a validation run at a fixed global batch size."""

    progress: float
    iteration: int
    metric: float
    grad_sqr: float
    grad_var: float


def normalize_placement(placement: Sequence[int]) -> tuple[int, ...]:
    """The canonical key of a placement, as the traces store it.

    Empty nodes carry no replica; nodes above the traced GPU count are split (see
    TRACED_GPUS_PER_NODE); rotations of a ring all-reduce cost the same, so the
    lexicographically smallest rotation stands for all of them.
    """
    nodes: list[int] = []
    for gpus in placement:
        if gpus < 0:
            raise ValueError(f"a node cannot hold {gpus} replicas")
        while gpus > 0:
            nodes.append(min(gpus, TRACED_GPUS_PER_NODE))
            gpus -= TRACED_GPUS_PER_NODE
    if not nodes:
        raise ValueError("a placement needs at least one replica")
    ring = tuple(nodes)
    return min(ring[i:] + ring[:i] for i in range(len(ring)))


def split_batch(batch_size: int, num_replicas: int, max_local_bsz: int) -> tuple[int, int]:
    """(local_bsz, accumulation_steps) for a global batch over replicas: accumulate only
    when a replica's share does not fit in GPU memory (max_local_bsz)."""
    if num_replicas < 1:
        raise ValueError("a batch needs at least one replica")
    share = math.ceil(batch_size / num_replicas - 1e-8)
    accumulation = max(1, math.ceil(share / max_local_bsz - 1e-8))
    local_bsz = max(1, math.ceil(share / accumulation - 1e-8))
    return local_bsz, accumulation


class SimulatedApplication(Protocol):
    """What a simulated job asks of its application: step times by placement and local
    batch, how much one step at a batch is worth, and how much it must make. A traced
    Pollux model (Application) answers from its traces; a job replayed from a real env
    answers from its own measured samples (handlers.simulator.measured)."""

    @property
    def name(self) -> str: ...

    @property
    def init_batch_size(self) -> int:
        """The global batch a step is worth one unit of progress at."""
        ...

    @property
    def max_local_bsz(self) -> int:
        """The largest local batch that fits on a GPU."""
        ...

    @property
    def max_epochs(self) -> int: ...

    @property
    def target_progress(self) -> float: ...

    def step_time(self, placement: Sequence[int], local_bsz: int) -> StepTime: ...

    def gain(self, batch_size: float, epoch: int) -> float:
        """Progress one optimizer step at this global batch makes."""
        ...

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float] | None:
        """(grad_sqr, grad_var of a mean over the initial batch) the job's samples report;
        None: the job reports none."""
        ...

    def epoch_at(self, progress: float) -> int: ...

    def epoch_end_progress(self, epoch: int) -> float: ...

    def split_batch(self, batch_size: int, num_replicas: int) -> tuple[int, int]: ...


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear between the two measured neighbours of x (xs sorted, x within)."""
    i = bisect.bisect_left(xs, x)
    if xs[i] == x:
        return ys[i]
    x0, x1 = xs[i - 1], xs[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


class Application:
    """One traced model: its throughput surface and its statistical efficiency."""

    def __init__(
        self,
        name: str,
        placements: Mapping[tuple[int, ...], Sequence[tuple[int, float, float]]],
        scalability: Sequence[tuple[int, int, int, float, float]],
        validation: Mapping[int, Sequence[EpochTrace]],
        *,
        max_local_bsz: int | None = None,
    ) -> None:
        if not placements or not validation:
            raise ValueError(f"{name}: traces need placements and validation runs")
        self.name = name
        #: placement -> (local_bsz sorted, step_time, sync_time) measured at it.
        self._measured: dict[tuple[int, ...], tuple[list[int], list[float], list[float]]] = {}
        for placement, rows in placements.items():
            ordered = sorted(rows)
            self._measured[placement] = (
                [r[0] for r in ordered],
                [r[1] for r in ordered],
                [r[2] for r in ordered],
            )
        self._merged = self._merge(placements, scalability)
        self._scattered: LinearNDInterpolator | None = None
        self.validation: dict[int, tuple[EpochTrace, ...]] = {
            bsz: tuple(rows) for bsz, rows in sorted(validation.items())
        }
        self.batch_sizes: tuple[int, ...] = tuple(self.validation)
        #: The batch size of the reference run: scale 1, gain 1.
        self.init_batch_size = self.batch_sizes[0]
        self.max_batch_size = self.batch_sizes[-1]
        self.min_local_bsz = min(r[0] for rows in placements.values() for r in rows)
        self.max_local_bsz = max_local_bsz or max(
            r[0] for rows in placements.values() for r in rows
        )
        self.max_epochs = min(len(rows) for rows in self.validation.values())
        # Progress is almost equal across runs at one epoch; the smallest keeps an epoch
        # boundary reachable whichever run a job's batch size resembles (as the artifact).
        self._epoch_progress: tuple[float, ...] = tuple(
            min(rows[e].progress for rows in self.validation.values())
            for e in range(self.max_epochs)
        )

    @staticmethod
    def _merge(
        placements: Mapping[tuple[int, ...], Sequence[tuple[int, float, float]]],
        scalability: Sequence[tuple[int, int, int, float, float]],
    ) -> tuple[np.ndarray, np.ndarray]:
        sums: dict[tuple[int, int, int], list[float]] = {}
        for placement, rows in placements.items():
            for local_bsz, step, sync in rows:
                key = (len(placement), sum(placement), local_bsz)
                acc = sums.setdefault(key, [0.0, 0.0, 0.0])
                acc[0] += step
                acc[1] += sync
                acc[2] += 1
        points = [list(k) for k in sorted(sums)]
        values = [[sums[k][0] / sums[k][2], sums[k][1] / sums[k][2]] for k in sorted(sums)]
        for num_nodes, num_replicas, local_bsz, step, sync in scalability:
            points.append([num_nodes, num_replicas, local_bsz])
            values.append([step, sync])
        return np.asarray(points, dtype=float), np.asarray(values, dtype=float)

    # -- throughput ---------------------------------------------------------------------

    def step_time(self, placement: Sequence[int], local_bsz: float) -> StepTime:
        """Step and sync time of one micro-step at a placement and per-GPU batch size.

        Below the smallest traced local batch the GPU is under-used and step time is flat,
        so the smallest measurement stands in; above the largest one the batch does not fit
        (OutOfTraceError), which the job simulator reports as a GPU OOM.
        """
        if local_bsz > self.max_local_bsz:
            raise OutOfTraceError(
                f"{self.name}: local batch {local_bsz} exceeds the largest that fits on a GPU "
                f"({self.max_local_bsz})"
            )
        return self._step_time(normalize_placement(placement), max(local_bsz, self.min_local_bsz))

    @lru_cache(maxsize=4096)  # noqa: B019 - applications are few and live as long as the process
    def _step_time(self, placement: tuple[int, ...], local_bsz: float) -> StepTime:
        measured = self._measured.get(placement)
        if measured is not None and measured[0][0] <= local_bsz <= measured[0][-1]:
            bszs, steps, syncs = measured
            return StepTime(_interp(bszs, steps, local_bsz), _interp(bszs, syncs, local_bsz))
        num_nodes = min(len(placement), TRACED_MAX_NODES)
        if self._scattered is None:
            self._scattered = LinearNDInterpolator(*self._merged)
        step, sync = (
            float(v) for v in self._scattered([[num_nodes, sum(placement), local_bsz]])[0]
        )
        if math.isnan(step) or math.isnan(sync):
            raise OutOfTraceError(
                f"{self.name}: placement {placement} at local batch {local_bsz} lies outside "
                "every measured configuration"
            )
        return StepTime(step, sync)

    # -- statistical efficiency ---------------------------------------------------------

    def _neighbours(self, batch_size: float) -> tuple[int, int]:
        """The traced runs around a batch size; beyond the traced range, the nearest run."""
        bszs = self.batch_sizes
        if batch_size <= bszs[0]:
            return bszs[0], bszs[0]
        if batch_size >= bszs[-1]:
            return bszs[-1], bszs[-1]
        i = bisect.bisect_left(bszs, batch_size)
        if bszs[i] == batch_size:
            return bszs[i], bszs[i]
        return bszs[i - 1], bszs[i]

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during an epoch, between the traced runs around the batch."""
        epoch = min(max(epoch, 0), self.max_epochs - 1)
        lo, hi = self._neighbours(batch_size)
        a, b = self.validation[lo][epoch], self.validation[hi][epoch]
        if lo == hi:
            return a.grad_sqr, a.grad_var
        w = (batch_size - lo) / (hi - lo)
        return (
            a.grad_sqr + w * (b.grad_sqr - a.grad_sqr),
            a.grad_var + w * (b.grad_var - a.grad_var),
        )

    def gain(self, batch_size: float, epoch: int) -> float:
        """Scale-invariant iterations one optimizer step is worth (AdaScale, <= scale)."""
        grad_sqr, grad_var = self.grad_stats(batch_size, epoch)
        scale = batch_size / self.init_batch_size
        return (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)

    def epoch_end_progress(self, epoch: int) -> float:
        """Progress at the end of the 0-based epoch."""
        return self._epoch_progress[epoch]

    @property
    def target_progress(self) -> float:
        """Progress at which the job has trained all of its epochs."""
        return self._epoch_progress[-1]

    def epoch_at(self, progress: float) -> int:
        """The 0-based epoch being trained at a progress (max_epochs once done)."""
        return bisect.bisect_right(self._epoch_progress, progress)

    # -- batch size rule ----------------------------------------------------------------

    def split_batch(self, batch_size: int, num_replicas: int) -> tuple[int, int]:
        """(local_bsz, accumulation_steps) for a global batch over replicas.

        Accumulate only when a replica's share does not fit in GPU memory, like the
        artifact's fixed-batch policies (without its forced accumulation for one replica).
        """
        return split_batch(batch_size, num_replicas, self.max_local_bsz)


# -- loading -----------------------------------------------------------------------------


def _read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@cache
def _load(root: Path, name: str) -> Application:
    folder = root / "traces" / name
    if not folder.is_dir():
        known = sorted(p.name for p in (root / "traces").glob("*") if p.is_dir())
        raise TraceDataError(f"no traces for application {name!r} in {folder} (have {known})")
    placements: dict[tuple[int, ...], list[tuple[int, float, float]]] = {}
    for row in _read_rows(folder / "placements.csv"):
        key = normalize_placement([int(d) for d in row["placement"]])
        placements.setdefault(key, []).append(
            (int(row["local_bsz"]), float(row["step_time"]), float(row["sync_time"]))
        )
    scalability = [
        (
            int(row["num_nodes"]),
            int(row["num_replicas"]),
            int(row["local_bsz"]),
            float(row["step_time"]),
            float(row["sync_time"]),
        )
        for row in _read_rows(folder / "scalability.csv")
    ]
    validation: dict[int, list[EpochTrace]] = {}
    for path in folder.glob("validation-*.csv"):
        bsz = int(path.stem.rsplit("-", 1)[1])
        validation[bsz] = [
            EpochTrace(
                progress=float(row["progress"]),
                iteration=int(row["iteration"]),
                metric=float(row["metric"]),
                grad_sqr=float(row["grad_sqr"]),
                grad_var=float(row["grad_var"]),
            )
            for row in _read_rows(path)
        ]
    return Application(
        name,
        placements,
        scalability,
        validation,
        max_local_bsz=_MAX_LOCAL_BSZ_OVERRIDE.get(name),
    )


def load_application(name: str, root: Path | None = None) -> Application:
    """The traced application, read once per data folder."""
    return _load((root or pollux_dir()).resolve(), name)


def application_names(root: Path | None = None) -> tuple[str, ...]:
    folder = (root or pollux_dir()) / "traces"
    return tuple(sorted(p.name for p in folder.iterdir() if (p / "placements.csv").is_file()))
