"""`dlrover-events optimize --state FILE.json`: the plan the brain would make, offline.

Users try an optimizer (or their own parameters) on a job state without a cluster or a
broker; the decision is the same pure `decide` the brain runs. Only this module's command
functions touch files and stdout; `dry_run` itself is pure so it is tested as such.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from pydantic import TypeAdapter, ValidationError

from dlrover_events.cli.params import json_option, print_json
from dlrover_events.errors import UserError
from streams.brain.core.decide import JobDecision, NoDecision, decide
from streams.brain.core.optimizers import REGISTRY, Registry
from streams.brain.core.router import RouteError
from streams.brain.core.state import REFUSE_UNKNOWN_STAGE, JobState

_HISTORY = TypeAdapter(list[JobState])


def _summary(exc: ValidationError, what: str) -> str:
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        return f"{what} is not valid JSON: {first['msg']}"
    where = ".".join(str(part) for part in first["loc"]) or "top level"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{what} is not a valid job state: {where}: {first['msg']}{more}"


def parse_state(text: str | bytes, what: str = "state") -> JobState:
    try:
        return JobState.model_validate_json(text, context=REFUSE_UNKNOWN_STAGE)
    except ValidationError as exc:
        raise UserError(_summary(exc, what)) from None


def parse_history(text: str | bytes, what: str = "history") -> list[JobState]:
    try:
        return _HISTORY.validate_json(text, context=REFUSE_UNKNOWN_STAGE)
    except ValidationError as exc:
        raise UserError(_summary(exc, what)) from None


def dry_run(
    state: JobState,
    now: datetime,
    *,
    optimizer: str | None = None,
    history: list[JobState] | None = None,
    free_gpus: int | None = None,
    registry: Registry = REGISTRY,
) -> dict[str, Any]:
    """The brain's decision as JSON-ready data; a routing error is the user's to fix."""
    result = decide(
        state,
        now,
        optimizer=optimizer,
        history=history or [],
        free_gpus=free_gpus,
        registry=registry,
    )
    if isinstance(result, RouteError):
        raise UserError(result.message)
    if isinstance(result, NoDecision):
        return {
            "stage": result.stage,
            "optimizers": list(result.optimizers),
            "optimize_plan": None,
            "scale_plan": None,
            "reason": result.reason,
        }
    assert isinstance(result, JobDecision)
    return {
        "stage": result.optimize_plan.stage,
        "optimizers": list(result.optimizers),
        "optimize_plan": result.optimize_plan.model_dump(mode="json"),
        "scale_plan": (
            None if result.scale_plan is None else result.scale_plan.model_dump(mode="json")
        ),
        "handled_ooms": list(result.handled_ooms),
        "notes": list(result.notes),
    }


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {what} file {path}: {exc.strerror or exc}") from None


def optimize(
    state: Path = typer.Option(..., "--state", help="job state JSON (JobState model)"),
    optimizer: str | None = typer.Option(
        None, "--optimizer", "-o", help="run this optimizer instead of the routed ones"
    ),
    history: Path | None = typer.Option(
        None, "--history", help="JSON list of completed job states (history-based optimizers)"
    ),
    free_gpus: int | None = typer.Option(
        None, "--free-gpus", min=0, help="free GPUs in the cluster (goodput)"
    ),
    now: datetime | None = typer.Option(
        None, "--now", help="decide as of this time (default: now; UTC if no zone)"
    ),
) -> None:
    """Print the OptimizePlan and ScalePlan the brain would make for a job state."""
    job = parse_state(_read(state, "state"), f"state file {state}")
    past = None if history is None else parse_history(_read(history, "history"), str(history))
    when = datetime.now(UTC) if now is None else now
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    out = dry_run(job, when, optimizer=optimizer, history=past, free_gpus=free_gpus)
    typer.echo(json.dumps(out, indent=2))


def optimizers(
    as_json: bool = json_option("a JSON list of the optimizers (name, what it is for)"),
) -> None:
    """List the optimizers the brain knows, with what each is for."""
    described = REGISTRY.describe()
    if as_json:
        print_json([{"name": name, "what": what} for name, what in described])
        return
    for name, description in described:
        typer.echo(f"{name:<18} {description}")
