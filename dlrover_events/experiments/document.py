"""An experiment document checked where it enters (`experiment create`, ``POST
/v1/experiments``): valid, or one `ExperimentInvalid` naming the field that is wrong, in
the words a user acts on. Pure.

The contract (schemas.experiments.ExperimentDocument) says what is valid; this module
says what is wrong, once for every door: pydantic's location of the first error, with the
tag of a hyperparameter's kind left out (``spec.hyperparameters.lr.minval``, not
``...lr.int.minval``, which names no key of the document). A field is spelled as a path:
names joined by dots, a list's item by its index (``vals[2]``), a key that is no plain
name (a dot in it, a space) quoted as JSON (``spec.hyperparameters["opt.lr"].minval``), so
a path names one place whatever the keys hold.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any

import yaml  # type: ignore[import-untyped,unused-ignore]
from pydantic import ValidationError

from dlrover_events.errors import UserError
from schemas.experiments import ExperimentDocument

#: pydantic's wording for the mistakes a hand-written document makes most, as a user reads it
_SAID = {
    "extra_forbidden": "unknown field",
    "missing": "required field missing",
}


class ExperimentInvalid(UserError):
    """A document that is not an experiment: ``field`` is where (a path, `spell`; empty
    for the whole document), ``problem`` what is wrong there."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem


#: a key written as it is in a path; any other is quoted
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
#: pydantic's last part of the location of a mapping's key that is refused
_KEY = "[key]"


def spell(parts: list[int | str]) -> str:
    """A path as a field is written (the module's docstring)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out


def _field(loc: tuple[int | str, ...], data: Any, *, missing: bool = False) -> str:
    """The path of ``loc`` in ``data``. pydantic puts labels in a location that name no
    place in the document (a tagged union's tag, a plain union's member type, ``bool`` or
    ``str``): a name that is no key where it stands is such a label and left out, unless
    it is the last part of a ``missing`` error, the field that is not there."""
    parts: list[int | str] = []
    here = data
    for i, part in enumerate(loc):
        if isinstance(part, str) and not (isinstance(here, Mapping) and part in here):
            if missing and i == len(loc) - 1:
                parts.append(part)
            continue
        parts.append(part)
        if isinstance(here, Mapping):
            here = here.get(part)
        elif isinstance(here, list) and isinstance(part, int) and 0 <= part < len(here):
            here = here[part]
        else:
            here = None
    return spell(parts)


def first_problem(err: ValidationError, data: Any) -> ExperimentInvalid:
    """The first error of a validation, as one `ExperimentInvalid` (the others counted)."""
    errors = err.errors(include_url=False)
    first = errors[0]
    problem = _SAID.get(first["type"], first["msg"]).removeprefix("Value error, ")
    loc = tuple(first["loc"])
    if loc and loc[-1] == _KEY:  # the key itself is refused: the field is that key
        loc, problem = loc[:-1], f"not a valid name: {problem}"
    # a check of an object that names its own field first ("trial: ...") is that field's
    head, _, rest = problem.partition(": ")
    if rest and isinstance(_at(loc, data), Mapping) and head in _at(loc, data):
        loc, problem = (*loc, head), rest
    if len(errors) > 1:
        problem += f" (and {len(errors) - 1} more)"
    return ExperimentInvalid(_field(loc, data, missing=first["type"] == "missing"), problem)


def _at(loc: tuple[int | str, ...], data: Any) -> Any:
    """The value at ``loc`` in ``data`` (labels skipped as `_field` skips them), or None."""
    here = data
    for part in loc:
        if isinstance(part, str) and not (isinstance(here, Mapping) and part in here):
            continue
        if isinstance(here, Mapping):
            here = here.get(part)
        elif isinstance(here, list) and isinstance(part, int) and 0 <= part < len(here):
            here = here[part]
        else:
            return None
    return here


def experiment_document(
    data: Any, *, searchers: Collection[str] | None = None
) -> ExperimentDocument:
    """``data`` (a parsed JSON or YAML value) as an experiment; with ``searchers``, its
    searcher must be one of them (the registry lives in streams/, so a door that cannot
    import it passes None and the searcher refuses an unknown one itself)."""
    if not isinstance(data, Mapping):
        raise ExperimentInvalid("", "an experiment is a mapping (apiVersion, kind, metadata, spec)")
    try:
        document = ExperimentDocument.model_validate(data)
    except ValidationError as err:
        raise first_problem(err, data) from None
    name = document.spec.searcher.name
    if searchers is not None and name not in searchers:
        known = ", ".join(sorted(searchers)) or "none"
        raise ExperimentInvalid("spec.searcher.name", f"unknown searcher {name!r}; known: {known}")
    return document


def _yaml_problem(err: yaml.YAMLError) -> str:
    """Where the parser stopped and why, in one line."""
    problem = getattr(err, "problem", None)
    mark = getattr(err, "problem_mark", None)
    if problem is None:
        return str(err).splitlines()[0]
    return f"line {mark.line + 1}: {problem}" if mark is not None else str(problem)


def experiment_yaml(text: str, *, searchers: Collection[str] | None = None) -> ExperimentDocument:
    """One YAML document as an experiment (`experiment_document`)."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise ExperimentInvalid("", f"not YAML: {_yaml_problem(err)}") from None
    if len(documents) != 1:
        raise ExperimentInvalid("", f"one experiment per file, not {len(documents)}")
    return experiment_document(documents[0], searchers=searchers)


__all__ = [
    "ExperimentInvalid",
    "experiment_document",
    "experiment_yaml",
    "first_problem",
    "spell",
]
