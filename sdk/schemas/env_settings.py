"""An env's settings: what its brain decides with and how its operator simulates.

One schema for every way an env gets its settings (`env create --settings`, `env settings`,
`up`, the install's bootstrap, an A/B arm) and for every reader (the brain, the virtual
operator, the CLI that validates before anything is stored). It lives in `schemas` so the
CLI can check a file without importing `streams` or `handlers`; what only a registry there
can judge (an optimizer's or a scheduler's parameters) is checked by the checks those
packages declare as entry points (`dlrover_events.env_settings`).

The stored document is sparse: only what was set, so a default that a later version
changes reaches every env that did not set it. docs/env-settings.md is rendered from these
models (`schemas.settings_doc`) and a test keeps it so.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from schemas.bounds import MAX_BYTES, MAX_CPU, MAX_GPUS, Document, Gpus, Text
from schemas.envelope import Model
from schemas.jobs import GroupName
from schemas.plans import RescaleMode
from schemas.rescale_cost import rescale_cost_s

#: Bytes of a settings file the CLI reads at most (the stored document has the bounds of
#: any free-form document besides: `schemas.bounds.MAX_DOCUMENT_VALUES`, depth 32).
MAX_SETTINGS_BYTES = 256 * 1024

#: How long a finished job's state is kept by default: the history optimizers' 7 days.
RETENTION_AFTER_S = 7 * 86400.0
#: ... and its tombstone after that, and how many tombstones a brain keeps.
TOMBSTONE_S = 30 * 86400.0
MAX_TOMBSTONES = 100_000
#: The least time between two prunes of one brain.
PRUNE_EVERY_S = 300.0
#: A simulated job's checkpoint-restart after a rescale, and a rescale in place, in
#: simulated seconds (schemas/rescale_cost.py keeps them with their sources).
SIM_RESTART_DELAY_S = rescale_cost_s(RescaleMode.RESTART)
SIM_IN_PLACE_DELAY_S = rescale_cost_s(RescaleMode.IN_PLACE)

_CENTURY_S = 100 * 365 * 86400

_GiB = 2**30


class LimitSettings(Model):
    """`brain.limits`: what the planner never plans beyond, whichever optimizer asked
    (`streams.brain.core.planner` applies them)."""

    min_cpu: float = Field(default=4.0, gt=0, le=MAX_CPU, description="cores of a node, at least")
    max_cpu: float = Field(default=32.0, gt=0, le=MAX_CPU, description="cores of a node, at most")
    min_memory: int = Field(
        default=6 * _GiB, gt=0, le=MAX_BYTES, description="bytes of a node, at least"
    )
    max_memory: int = Field(
        default=64 * _GiB, gt=0, le=MAX_BYTES, description="bytes of a node, at most"
    )
    ps_cooldown_s: float = Field(
        default=3600.0, ge=0, le=_CENTURY_S, description="seconds between two plans of a PS job"
    )
    running_cooldown_s: float = Field(
        default=300.0,
        ge=0,
        le=_CENTURY_S,
        description="seconds between two plans of a running job (OOMs and stragglers do not wait)",
    )
    max_memory_step: int = Field(
        default=8 * _GiB,
        gt=0,
        le=MAX_BYTES,
        description="the most one plan raises a node's memory (bytes)",
    )


class SchedulerSettings(Model):
    """`brain.scheduler`: which cluster scheduler, on what cluster."""

    name: Text = Field(
        min_length=1, max_length=128, description="a registered scheduler, e.g. goodput-cluster"
    )
    params: Document = Field(
        default_factory=dict, description="the scheduler's parameters (its registry checks them)"
    )
    nodes: int = Field(ge=1, le=100_000, description="nodes of the cluster it schedules")
    gpus_per_node: int = Field(ge=1, le=64, description="GPUs of each of those nodes")
    interval_s: float = Field(
        default=60.0, gt=0, le=86400, description="event-time seconds between two rounds"
    )
    quotas: dict[GroupName, Gpus] = Field(
        default_factory=dict,
        max_length=10_000,
        description="group -> GPUs guaranteed to the jobs of that group (a job's `group`); "
        "idle ones are lent to others and taken back within one round",
    )

    @model_validator(mode="after")
    def _quotas_fit(self) -> SchedulerSettings:
        gpus = self.nodes * self.gpus_per_node
        promised = sum(self.quotas.values())
        if promised > gpus:
            raise ValueError(
                f"the quotas promise {promised} GPUs, more than the {gpus} of the cluster "
                f"({self.nodes} x {self.gpus_per_node})"
            )
        return self


#: An optimizer for every stage, or one per stage (`{running: goodput}`).
OptimizerChoice = Text | dict[Text, Text]


class JobDefaults(Model):
    """`brain.job_config`: the env's default job config for the router; a job's own
    config and the config service's documents win key by key. Keys besides these two are
    config the router reads too (`total_steps`, `pinned`, ...) and pass as they are."""

    model_config = ConfigDict(extra="allow")

    optimizer: OptimizerChoice | None = Field(
        default=None,
        description="the optimizer that answers a healthy job: a name, or stage -> name",
    )
    optimizer_params: dict[Text, Document] = Field(
        default_factory=dict,
        description="optimizer name -> its parameters (the optimizer registry checks them)",
    )


class BrainSettings(Model):
    """`brain`: how the env's brain decides."""

    sample_every: int = Field(
        default=2, ge=1, description="decide every this many samples of an initial stage"
    )
    running_every: int = Field(
        default=8, ge=1, description="decide every this many samples of the running stage"
    )
    limits: LimitSettings | None = Field(default=None, description="the planner's limits")
    job_config: JobDefaults = Field(
        default_factory=JobDefaults, description="the env's default job config (optimizers)"
    )
    cluster_gpus: int | None = Field(
        default=None, ge=0, description="the cluster's GPUs: goodput grows only into free ones"
    )
    lockstep: bool = Field(
        default=False, description="decide whole ticks of a virtual env's simulated clock"
    )
    retention_s: float | None = Field(
        default=RETENTION_AFTER_S,
        gt=0,
        le=_CENTURY_S,
        description="prune a finished job's state and samples this long after it ended "
        "(null: keep them)",
    )
    tombstone_s: float = Field(
        default=TOMBSTONE_S,
        ge=0,
        le=_CENTURY_S,
        description="how long a pruned job's id is kept after pruning, so that its late "
        "events are ignored",
    )
    max_tombstones: int = Field(
        default=MAX_TOMBSTONES, ge=0, description="pruned job ids kept per brain"
    )
    prune_every_s: float = Field(
        default=PRUNE_EVERY_S, gt=0, le=86400, description="the least time between two prunes"
    )
    scheduler: SchedulerSettings | None = Field(
        default=None, description="a cluster scheduler that owns the env's GPUs"
    )


class CurveSettings(Model):
    """`operator.trials.curves`: what a virtual env's simulated trials measure
    (handlers/simulator/curves.py). ``parametric``: the built-in family loss = f(lr, width,
    budget), deterministic given ``seed``; ``table``: the curves of a CSV or JSON file
    (``path``); ``recorded``: the curves experiment ``experiment`` of env ``env`` stored in
    its Postgres (trial_metrics). A trial whose hyperparameters were not recorded follows the
    nearest recorded configuration (docs/experiments.md, Trials in a virtual env)."""

    kind: Literal["parametric", "table", "recorded"] = Field(
        default="parametric", description="parametric, table or recorded"
    )
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="parametric: its noise's seed")
    scale: float = Field(
        default=100.0,
        gt=0,
        le=1e15,
        description="parametric: the budget at which a trial at its best rate has come half "
        "way down",
    )
    noise: float = Field(
        default=0.01, ge=0, le=1, description="parametric: relative noise of a validation loss"
    )
    path: Text | None = Field(
        default=None, max_length=4096, description="table: the CSV or JSON file (by suffix)"
    )
    env: str | None = Field(
        default=None,
        pattern=r"^[a-z][a-z0-9-]{0,30}$",
        description="recorded: the env whose Postgres holds the experiment's curves",
    )
    experiment: str | None = Field(
        default=None, max_length=50, description="recorded: the experiment whose curves to take"
    )

    @model_validator(mode="after")
    def _says_where(self) -> CurveSettings:
        if self.kind == "table" and not self.path:
            raise ValueError("table curves need a path")
        if self.kind == "recorded" and not (self.env and self.experiment):
            raise ValueError("recorded curves need the env and the experiment")
        return self


class TrialSimSettings(Model):
    """`operator.trials`: how a virtual env simulates an experiment's trials (jobs asked
    for on the bus with a trial's variables): their learning curves, how often they report,
    and whether the simulated clock waits for the searcher's decisions."""

    curves: CurveSettings = Field(
        default_factory=CurveSettings, description="where the trials' learning curves come from"
    )
    application: Text = Field(
        default="cifar10",
        max_length=64,
        description="the traced application whose speed a trial has when its job names none "
        "(label dlrover-events.io/app)",
    )
    validate_every: float = Field(
        default=0.0,
        ge=0,
        le=1e15,
        description="a validation report every so much budget (0: only at a trial's budget)",
    )
    train_every: float = Field(
        default=0.0, ge=0, le=1e15, description="a training-loss report every so much (0: none)"
    )
    wait_for_searcher: bool = Field(
        default=True,
        description="out of wall-clock pace, the clock stops while an experiment's searcher "
        "has reports or answers to decide on, so the same searcher and seed give the same "
        "decisions however fast it runs",
    )


class OperatorSettings(Model):
    """`operator`: a virtual env's simulated cluster and its pace (the real env's
    operator reads none of these). Options of the `operator` command override them."""

    nodes: int = Field(default=16, ge=1, le=100_000, description="nodes of the simulated cluster")
    gpus_per_node: int = Field(default=4, ge=0, le=MAX_GPUS, description="GPUs of each node")
    cpu_per_node: float = Field(default=64.0, gt=0, le=1e6, description="cores of each node")
    memory_per_node_gib: float = Field(
        default=256.0, gt=0, le=2**18, description="memory of each node, GiB"
    )
    speed: float = Field(
        default=1.0,
        gt=0,
        le=1e9,
        description="simulated seconds per wall second (ignored when fast)",
    )
    fast: bool = Field(default=False, description="jump from event to event as fast as possible")
    lockstep: bool = Field(
        default=False,
        description="move the clock a tick at a time, each tick once the brain has decided it "
        "(barriers out, acknowledgements in); speed and fast are then ignored",
    )
    tick_s: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="simulated seconds per lockstep tick (default: sample_interval)",
    )
    sample_interval: float = Field(
        default=30.0,
        gt=0,
        le=86400,
        description="simulated seconds between a job's runtime samples",
    )
    restart_delay: float = Field(
        default=SIM_RESTART_DELAY_S,
        ge=0,
        le=86400,
        description="simulated checkpoint-restart seconds (a job's start, and a rescale "
        "that restarts it)",
    )
    rescale_mode: Literal["restart", "in_place"] = Field(
        default="restart",
        description="how the simulated jobs take a new allocation: restart (restart_delay "
        "each time) or in_place (in_place_delay when one of a job's pods stays where it was; "
        "a start, a resume or a move to other nodes still restarts)",
    )
    in_place_delay: float = Field(
        default=SIM_IN_PLACE_DELAY_S,
        ge=0,
        le=86400,
        description="simulated seconds of a rescale in place (schemas/rescale_cost.py: "
        "measured by `bench elastic`)",
    )
    admission: Literal["cluster", "brain"] = Field(
        default="cluster",
        description="who starts a submitted job: the simulated cluster as soon as its gang "
        "fits (cluster), or only a plan that gives it replicas (brain: a cluster scheduler "
        "in the brain owns admission)",
    )
    max_sleep: float = Field(
        default=0.5,
        gt=0,
        le=60,
        description="wall seconds the clock waits at most between looks",
    )
    trials: TrialSimSettings = Field(
        default_factory=TrialSimSettings,
        description="how an experiment's trials are simulated (docs/experiments.md)",
    )

    @property
    def tick_seconds(self) -> float:
        """A tick of one sample interval: every running job says something in each tick,
        and a plan lands at most one sample later than the sample that caused it."""
        return self.tick_s if self.tick_s is not None else self.sample_interval

    @property
    def in_place_seconds(self) -> float | None:
        """What a rescale in place costs the simulated jobs; None when they restart."""
        return self.in_place_delay if self.rescale_mode == "in_place" else None


class EnvSettings(Model):
    """An env's settings (`env settings ENV` shows them)."""

    brain: BrainSettings | Literal[False] = Field(
        default_factory=BrainSettings,
        description="how the env's brain decides; false: the env runs no brain (an A/B "
        "test's baseline arm)",
    )
    operator: OperatorSettings = Field(
        default_factory=OperatorSettings, description="a virtual env's simulated cluster"
    )

    @field_validator("brain", mode="before")
    @classmethod
    def _brain_on_is_a_mapping(cls, value: Any) -> Any:
        if value is True:
            raise ValueError("give the brain's settings as a mapping, or false for no brain")
        return value

    def stored(self) -> dict[str, Any]:
        """The sparse document the registry keeps: only what was set."""
        return self.model_dump(mode="json", exclude_unset=True)


# -- what is wrong, in one line ----------------------------------------------------------

#: How every complaint about a setting begins (the CLI's one line, the brain's log).
SETTING = "env setting"


def _path(loc: tuple[int | str, ...], data: Any) -> tuple[str, ...]:
    """The setting a pydantic error location names, without the tags pydantic inserts
    for a union's members (`BrainSettings`, `literal[False]`, `function-after[...]`):
    a segment is kept only where the input has that key or index."""
    kept: list[str] = []
    at = data
    for part in loc:
        if _has(at, part):
            at = at[part]
        elif isinstance(at, dict) and isinstance(part, str) and not _is_tag(part):
            at = None  # a missing field (required, or an unknown one)
        else:
            continue
        kept.append(str(part))
    return tuple(kept)


def _has(at: Any, part: int | str) -> bool:
    if isinstance(at, dict):
        return part in at
    return isinstance(at, list) and isinstance(part, int) and 0 <= part < len(at)


def _is_tag(part: str) -> bool:
    return part[:1].isupper() or "[" in part


def problem(exc: ValidationError, data: Any, prefix: str = "") -> str:
    """The one line that says what is wrong with `data` (validated as the settings at
    `prefix`): the setting's dotted path, pydantic's words, and the value given. Of a
    union's alternatives' errors, the one that got deepest into the value is the one
    the user meant."""
    errors = exc.errors()
    paths = [_path(tuple(e["loc"]), data) for e in errors]
    best = max(range(len(errors)), key=lambda i: len(paths[i]))
    where = ".".join(p for p in (prefix, *paths[best]) if p) or "settings"
    error = errors[best]
    given = error.get("input")
    said = ""
    if isinstance(given, str | int | float | bool) and error["type"] != "missing":
        text = repr(given)
        said = f" (got {text[:60]}{'...' if len(text) > 60 else ''})"
    return f"{SETTING} {where}: {error['msg']}{said}"


__all__ = [
    "MAX_SETTINGS_BYTES",
    "SETTING",
    "BrainSettings",
    "CurveSettings",
    "EnvSettings",
    "JobDefaults",
    "LimitSettings",
    "OperatorSettings",
    "SchedulerSettings",
    "TrialSimSettings",
    "problem",
]
