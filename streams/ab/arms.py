"""Arms of an A/B test: a name and the brain settings its virtual env gets."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any

import yaml

from dlrover_events.errors import UserError

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,19}$")

#: Arms a bare `--arm NAME` gives (examples/ab/NAME.yaml holds the same settings, to copy
#: and change): the baselines and the brain's policies a user compares first.
PRESETS: dict[str, dict[str, Any]] = {
    "static": {"brain": False},
    "goodput": {"brain": {"job_config": {"optimizer": "goodput"}}},
    # (a round per 60 s tick, as the Pollux artifact schedules)
    "tiresias": {"brain": {"scheduler": {"name": "tiresias"}}, "operator": {"tick_s": 60}},
    "goodput-cluster": {
        "brain": {
            "scheduler": {"name": "goodput-cluster", "params": {"hysteresis": 0.05}},
        },
        "operator": {"tick_s": 60, "rescale_mode": "restart"},
    },
    # the same scheduler, its jobs rescaling in place: a reallocation that keeps one of a
    # job's pods costs the in-place figure instead of a restart (docs/inplace.md)
    "cluster-inplace": {
        "brain": {
            "scheduler": {"name": "goodput-cluster", "params": {"hysteresis": 0.05}},
        },
        "operator": {"tick_s": 60, "rescale_mode": "in_place"},
    },
}


@dataclass(frozen=True)
class Arm:
    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # where the settings came from, for the report

    def env(self, run: str) -> str:
        """The arm's env: ``ab-<run>-<arm>``, short enough for an env name."""
        return f"ab-{run}-{self.name}"


def parse_arm(spec: str) -> Arm:
    """``name=settings.yaml``; a bare ``name`` is a preset's (PRESETS), and refused when no
    preset has that name (a typo must not run the default brain); ``name=`` is the default
    brain settings."""
    name, eq, path = spec.partition("=")
    name = name.strip()
    if not _NAME.match(name) or name.endswith("-"):
        raise UserError(
            f"arm {spec!r}: the name must be 1-20 lowercase letters, digits or dashes, "
            "starting with a letter (it becomes part of the arm's env name)"
        )
    if not eq:
        if name not in PRESETS:
            close = get_close_matches(name, PRESETS, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise UserError(
                f"arm {name!r}: no preset of that name ({hint}presets: {', '.join(PRESETS)}); "
                f"the default brain settings are `--arm {name}=`, a file's `--arm {name}=FILE`"
            )
        return Arm(name, PRESETS[name], f"preset {name}")
    if not path.strip():
        return Arm(name, {}, "defaults")
    file = Path(path.strip())
    try:
        loaded = yaml.safe_load(file.read_text())
    except OSError as err:
        raise UserError(f"arm {name}: cannot read {file}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise UserError(f"arm {name}: {file} is not valid YAML: {err}") from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise UserError(f"arm {name}: {file} must hold a mapping of brain settings")
    return Arm(name, loaded, str(file))


def parse_arms(specs: list[str]) -> list[Arm]:
    arms = [parse_arm(s) for s in specs]
    if len(arms) < 2:
        raise UserError("an A/B test needs at least two arms (--arm a=x.yaml --arm b=y.yaml)")
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise UserError(f"arm names must differ: {', '.join(names)}")
    return arms
