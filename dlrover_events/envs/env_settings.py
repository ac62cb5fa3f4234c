"""An env's settings as the runtime handles them: validated, read from a file, edited
with `--set`/`--unset`, shown.

Validation is one path for every way settings are given (`env create --settings`,
`env settings`, `up`, the install's bootstrap, an A/B arm), and `EnvRegistry` takes it
before it stores anything: first the schema (`schemas.env_settings.EnvSettings`), then
the checks that streams and handlers declare in the entry point group
``dlrover_events.env_settings`` (the brain's: its optimizers' and schedulers' names and
parameters), so this package judges them without importing those packages. A problem is
one line naming the setting.

Editing: ``--file`` replaces the whole document (it is the desired state: a key left out
goes back to its default), then each ``--set key.path=value`` (the value is YAML:
``16``, ``goodput``, ``null``, ``{explore: false}``) and ``--unset key.path`` (back to
the default) is applied in order.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import ValidationError

from dlrover_events.errors import UserError
from schemas.bounds import MAX_DOCUMENT_DEPTH, json_problem
from schemas.env_settings import MAX_SETTINGS_BYTES, SETTING, EnvSettings, problem

#: Entry points: ``name = "package.module:check"``, a check being `SettingsCheck`.
CHECK_GROUP = "dlrover_events.env_settings"

#: Raises ValueError (one line, naming the setting) for settings it cannot run with.
SettingsCheck = Callable[[EnvSettings], None]

#: A key of a settings path: what names of settings, optimizers and stages are made of.
_KEY = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
#: Characters of one `--set` or `--unset` argument, at most.
MAX_ASSIGNMENT_CHARS = 64 * 1024


class EnvSettingsError(UserError):
    """Settings an env cannot run with; the message names the setting."""


class _Loader(yaml.SafeLoader):
    """YAML as JSON has it: a date stays the string it was written as, and there are no
    aliases (`*a`): a few of them make a value that takes exponential time to walk, or
    one that contains itself."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases (&, *) are not taken", event.start_mark
            )
        return super().compose_node(parent, index)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _load_yaml(text: str | bytes) -> Any:
    """Raises yaml.YAMLError for anything it does not take, a value nested too deep for
    the parser (which recurses) included."""
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader: no object is made from a tag
    except RecursionError:
        raise yaml.YAMLError(
            f"nests deeper than the parser goes (settings nest {MAX_DOCUMENT_DEPTH} deep)"
        ) from None


def _not_json(value: Any) -> str | None:
    """What in a loaded YAML value JSON cannot say (a set, bytes, a key that is not a
    string), or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"has a key that is not a string ({key!r:.40})"
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)
        elif not isinstance(item, str | int | float | bool) and item is not None:
            return f"holds a {type(item).__name__}, which JSON has not (quote it)"
    return None


@cache
def settings_checks() -> tuple[tuple[str, SettingsCheck], ...]:
    """The checks streams and handlers declare (loaded once)."""
    found = [(ep.name, ep.load()) for ep in entry_points(group=CHECK_GROUP)]
    return tuple(sorted(found, key=lambda item: item[0]))


def parse_settings(raw: Mapping[str, Any]) -> EnvSettings:
    """The schema's reading of a settings document (no registry checks)."""
    if not isinstance(raw, Mapping):
        raise EnvSettingsError(f"{SETTING}s must be a mapping (brain:, operator:), not {raw!r:.60}")
    data = dict(raw)
    found = json_problem(data)
    if found is not None:
        raise EnvSettingsError(f"{SETTING}s: the document {found}")
    try:
        return EnvSettings.model_validate(data)
    except ValidationError as exc:
        raise EnvSettingsError(problem(exc, data)) from None


def validate_settings(
    raw: Mapping[str, Any] | EnvSettings, checks: Iterable[tuple[str, SettingsCheck]] | None = None
) -> EnvSettings:
    """Settings an env can run with, or an EnvSettingsError naming what is wrong: the schema,
    then every declared check (`checks`: those of the entry points)."""
    settings = raw if isinstance(raw, EnvSettings) else parse_settings(raw)
    for _, check in settings_checks() if checks is None else checks:
        try:
            check(settings)
        except ValueError as exc:
            raise EnvSettingsError(str(exc)) from None
    return settings


def read_settings_file(path: Path) -> dict[str, Any]:
    """A YAML (or JSON) settings file's document, unvalidated; bounded in size."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SETTINGS_BYTES + 1)
    except OSError as err:
        raise EnvSettingsError(f"cannot read {path}: {err.strerror}") from None
    if len(data) > MAX_SETTINGS_BYTES:
        raise EnvSettingsError(f"{path} is larger than {MAX_SETTINGS_BYTES // 1024} KiB")
    try:
        loaded = _load_yaml(data)
    except yaml.YAMLError as err:
        raise EnvSettingsError(f"{path} is not valid YAML: {_one_line(err)}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise EnvSettingsError(f"{path} must hold a mapping of settings (brain:, operator:)")
    found = json_problem(loaded) or _not_json(loaded)
    if found is not None:
        raise EnvSettingsError(f"{path}: the document {found}")
    return loaded


def load_settings_file(path: Path) -> EnvSettings:
    """A settings file, validated: what a bootstrap passes to `EnvRegistry.create`."""
    return validate_settings(read_settings_file(path))


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


# -- --set and --unset ------------------------------------------------------------------


@dataclass(frozen=True)
class Edit:
    """One change of a settings document: set `path` to `value`, or unset it."""

    path: tuple[str, ...]
    value: Any = None
    unset: bool = False

    def __str__(self) -> str:
        key = ".".join(self.path)
        if self.unset:
            return f"unset {key}"
        return f"set {key}={orjson.dumps(self.value).decode()}"


def _path(text: str, what: str) -> tuple[str, ...]:
    parts = tuple(text.strip().split("."))
    if not all(_KEY.match(p) for p in parts):
        raise EnvSettingsError(
            f"{what} {text!r}: a setting is a dotted path of names (letters, digits, _ and -), "
            "e.g. brain.limits.max_cpu"
        )
    return parts


def parse_set(text: str) -> Edit:
    """``key.path=value``; the value is YAML (a number, a name, null, ``{a: 1}``)."""
    if len(text) > MAX_ASSIGNMENT_CHARS:
        raise EnvSettingsError(f"--set: longer than {MAX_ASSIGNMENT_CHARS} characters")
    key, eq, raw = text.partition("=")
    if not eq:
        raise EnvSettingsError(f"--set {text!r}: write it as key.path=value")
    path = _path(key, "--set")
    if not raw.strip():
        raise EnvSettingsError(
            f"--set {key.strip()}: give a value (null for none; --unset for the default)"
        )
    name = ".".join(path)
    try:
        value = _load_yaml(raw)
    except yaml.YAMLError as err:
        raise EnvSettingsError(f"--set {name}: the value is not YAML: {_one_line(err)}") from None
    found = _not_json(value) or json_problem(value)
    if found is not None:
        raise EnvSettingsError(f"--set {name}: the value {found}")
    return Edit(path, value)


def parse_unset(text: str) -> Edit:
    """``key.path``: the setting goes back to its default."""
    if len(text) > MAX_ASSIGNMENT_CHARS:
        raise EnvSettingsError(f"--unset: longer than {MAX_ASSIGNMENT_CHARS} characters")
    return Edit(_path(text, "--unset"), unset=True)


def apply_edits(doc: Mapping[str, Any], edits: Sequence[Edit]) -> dict[str, Any]:
    """The document with the edits applied in order (pure: `doc` is not changed). Setting
    a key below another makes the mappings between; unsetting one removes it, and the
    mappings it leaves empty."""
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    for edit in edits:
        *parents, last = edit.path
        at: dict[str, Any] = out
        trail: list[tuple[dict[str, Any], str]] = []
        for i, key in enumerate(parents):
            child = at.get(key)
            if child is None and not edit.unset:
                child = at[key] = {}
            if not isinstance(child, dict):
                where = ".".join(edit.path[: i + 1])
                if edit.unset and child is None:
                    raise EnvSettingsError(f"--unset {'.'.join(edit.path)}: it is not set")
                raise EnvSettingsError(
                    f"{'--unset' if edit.unset else '--set'} {'.'.join(edit.path)}: "
                    f"{where} is {orjson.dumps(child).decode()}, not a mapping"
                )
            trail.append((at, key))
            at = child
        if edit.unset:
            if last not in at:
                raise EnvSettingsError(f"--unset {'.'.join(edit.path)}: it is not set")
            del at[last]
            for holder, key in reversed(trail):  # no empty mappings left behind
                if holder[key]:
                    break
                del holder[key]
        else:
            at[last] = copy.deepcopy(edit.value)
    return out


# -- showing ----------------------------------------------------------------------------


def render(doc: Mapping[str, Any], *, as_json: bool = False) -> str:
    """A settings document as `env settings` prints it."""
    if as_json:
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    if not doc:
        return "{}  # every setting has its default (docs/env-settings.md)"
    return yaml.safe_dump(dict(doc), sort_keys=True, default_flow_style=False).rstrip()


__all__ = [
    "CHECK_GROUP",
    "Edit",
    "EnvSettingsError",
    "SettingsCheck",
    "apply_edits",
    "load_settings_file",
    "parse_set",
    "parse_settings",
    "parse_unset",
    "read_settings_file",
    "render",
    "settings_checks",
    "validate_settings",
]
