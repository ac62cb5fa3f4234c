"""The reference tables of docs/ are the code's: each generated part equals what
`dlrover_events.cli.reference` renders now, every settings class is registered and every field
says what it is for, and every DLROVER_EVENTS_* variable the code reads is documented."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.cli import reference
from dlrover_events.cli.app import root_command
from dlrover_events.settings import Settings

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("dlrover_events", "schemas", "streams", "handlers")
#: a variable's full name (a prefix such as DLROVER_EVENTS_GATEWAY_ is not one)
VARIABLE = re.compile(r"DLROVER_EVENTS_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])")
#: where a variable may be documented
DOCS = [REPO / "sdk" / "README.md", REPO / "deploy" / "README.md", *(REPO / "docs").glob("*.md")]


def _cli_root() -> Any:
    return root_command()


@pytest.mark.parametrize("part", reference.parts(_cli_root()), ids=lambda p: p.path)
def test_each_generated_table_is_the_one_the_code_writes(part: reference.Part) -> None:
    text = (REPO / part.path).read_text("utf-8")
    assert part.render(text) == text, (
        f"{part.path} is out of date: run `dlrover-events docs write` (after a change of "
        "pyproject.toml's entry points, reinstall first: `make .venv/.installed`)"
    )


def test_every_settings_field_says_what_it_is_for() -> None:
    assert reference.undescribed_settings() == []


def _settings_classes_in_the_source() -> set[str]:
    found = set()
    for package, tree in ((p, t) for p in PACKAGES for t in (REPO, REPO / "sdk")):
        for path in (tree / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if isinstance(node, ast.ClassDef) and any(
                    isinstance(base, ast.Name) and base.id == "BaseSettings" for base in node.bases
                ):
                    module = ".".join(path.relative_to(tree).with_suffix("").parts)
                    found.add(f"{module}.{node.name}")
    return found


def test_every_settings_class_of_the_code_is_registered() -> None:
    listed = {f"{c.__module__}.{c.__name__}" for c in reference.settings_classes()}
    in_source = _settings_classes_in_the_source()
    assert len(in_source) >= 7
    assert in_source <= listed, (
        f"settings classes not in the entry points dlrover_events.settings: {in_source - listed}"
    )


def test_every_variable_the_code_names_is_documented() -> None:
    named = set()
    for package in PACKAGES:
        for path in [*(REPO / package).rglob("*.py"), *(REPO / "sdk" / package).rglob("*.py")]:
            named |= set(VARIABLE.findall(path.read_text("utf-8")))
    documented = " ".join(doc.read_text("utf-8") for doc in DOCS)
    missing = sorted(v for v in named if not re.search(rf"{v}\b", documented))
    assert len(named) > 40
    assert missing == [], f"variables no doc mentions (docs/, sdk/README.md): {missing}"


class _Example(BaseSettings):
    """A service's knobs."""

    model_config = SettingsConfigDict(env_prefix="DLROVER_EVENTS_EXAMPLE_")

    port: int = Field(default=8470, ge=0, le=65535, description="0: any free port")
    token: str | None = Field(default=None, description="who | what")


def test_a_settings_table_names_each_variable_with_its_type_default_and_bounds() -> None:
    table = reference.settings_markdown([_Example])
    assert "| `DLROVER_EVENTS_EXAMPLE_PORT` | integer | `8470` | >= 0, <= 65535 | 0: any" in table
    assert "| `DLROVER_EVENTS_EXAMPLE_TOKEN` | string or null | unset |  | who \\| what |" in table


def test_a_field_added_without_its_line_makes_the_document_stale() -> None:
    doc = (REPO / "docs" / "settings.md").read_text("utf-8")

    class Grown(Settings):
        """What every process reads."""

        new_knob: int = Field(default=1, description="a setting added later")

    grown = reference.with_part(
        doc, "settings list", reference.settings_markdown([Grown, *reference.settings_classes()])
    )
    assert grown != doc
    assert "DLROVER_EVENTS_NEW_KNOB" in grown


def test_with_part_replaces_only_between_its_markers() -> None:
    doc = f"head\n{reference.begin('x')}\nold\n{reference.end('x')}\ntail\n"
    assert reference.with_part(doc, "x", "new\n") == (
        f"head\n{reference.begin('x')}\nnew\n{reference.end('x')}\ntail\n"
    )
    with pytest.raises(ValueError, match="markers"):
        reference.with_part("no markers\n", "x", "new\n")


def test_the_commands_table_lists_every_command_of_the_cli() -> None:
    table = reference.commands_markdown(_cli_root())
    for command in ("`up`", "`env create`", "`docs write`", "`settings list`", "`bench brain`"):
        assert f"| {command} |" in table
