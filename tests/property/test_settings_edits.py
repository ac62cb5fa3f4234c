"""`env settings --set KEY=VALUE` and `--unset KEY`: the parser and the edits, for any input.

A value written as YAML comes back as the value; any text is an edit or a one-line
EnvSettingsError, never another exception; edits are pure and land where their path says.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover_events.envs.env_settings import (
    Edit,
    EnvSettingsError,
    apply_edits,
    parse_set,
    parse_unset,
)

KEY = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-",
    min_size=1,
    max_size=12,
)
PATH = st.lists(KEY, min_size=1, max_size=5).map(tuple)
TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20
)
SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
)
VALUE = st.recursive(
    SCALAR,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(TEXT, children, max_size=4)
    ),
    max_leaves=12,
)


def _yaml(value: Any) -> str:
    """The value as a user may write it after `=`: one line of flow YAML."""
    return (
        yaml.safe_dump(value, default_flow_style=True, width=math.inf)
        .removesuffix("\n...\n")
        .rstrip("\n")
    )


@given(PATH, VALUE)
def test_a_value_written_as_yaml_is_the_value_set(path: tuple[str, ...], value: Any) -> None:
    edit = parse_set(f"{'.'.join(path)}={_yaml(value)}")
    assert edit == Edit(path, value)


@given(st.text(max_size=200))
@settings(max_examples=500)
def test_any_text_is_an_edit_or_one_line_saying_why(text: str) -> None:
    for parse in (parse_set, parse_unset):
        try:
            edit = parse(text)
        except EnvSettingsError as err:
            assert "\n" not in str(err)
        else:
            assert edit.path and all(edit.path)


@given(st.text(alphabet="[]{}:,-&*!| \n\"'ab=.", max_size=300))
@settings(max_examples=500)
def test_yaml_syntax_soup_is_an_edit_or_one_line_saying_why(soup: str) -> None:
    try:
        parse_set(f"k={soup}")
    except EnvSettingsError as err:
        assert "\n" not in str(err)


@given(st.dictionaries(KEY, VALUE, max_size=4), PATH, VALUE)
def test_set_lands_at_its_path_and_leaves_the_document_alone(
    doc: dict[str, Any], path: tuple[str, ...], value: Any
) -> None:
    before = copy.deepcopy(doc)
    try:
        out = apply_edits(doc, [Edit(path, value)])
    except EnvSettingsError as err:  # a value on the way that is not a mapping: said so
        assert "not a mapping" in str(err)
        return
    assert doc == before
    at: Any = out
    for key in path:
        at = at[key]
    assert at == value


def _fresh(doc: dict[str, Any], path: tuple[str, ...]) -> bool:
    """Whether setting `path` adds a key to `doc` (every mapping on the way exists or is
    made), rather than replacing what is there; and no mapping on the way is empty (an
    unset removes the mappings it leaves empty, which means the same: all defaults)."""
    at: Any = doc
    for depth, key in enumerate(path):
        if not isinstance(at, dict) or (depth and not at):
            return False
        if key not in at:
            return True
        at = at[key]
    return False


@given(st.dictionaries(KEY, VALUE, max_size=4), PATH, VALUE)
def test_unset_takes_back_a_new_setting(
    doc: dict[str, Any], path: tuple[str, ...], value: Any
) -> None:
    if not _fresh(doc, path):
        return
    out = apply_edits(doc, [Edit(path, value), Edit(path, unset=True)])
    assert out == doc


def test_unset_removes_the_mappings_it_leaves_empty() -> None:
    doc = {"brain": {"limits": {"max_cpu": 8}}, "operator": {"speed": 2}}
    assert apply_edits(doc, [parse_unset("brain.limits.max_cpu")]) == {"operator": {"speed": 2}}


def test_unset_of_what_is_not_set_says_so() -> None:
    for doc in ({}, {"brain": {"limits": {}}}, {"brain": False}):
        try:
            apply_edits(doc, [parse_unset("brain.limits.max_cpu")])
        except EnvSettingsError as err:
            assert "brain.limits.max_cpu" in str(err)
        else:
            raise AssertionError(f"unset of nothing in {doc} passed")


def test_values_that_are_not_json_are_refused() -> None:
    for text, why in (
        ("a=&x [*x]", "aliases"),
        ("a=" + "[" * 5000, "nests deeper"),
        ("a=" + "[" * 40 + "]" * 40, "nests deeper than 32"),
        ("a=!!binary aGVsbG8=", "bytes"),
        ("a={1: x}", "not a string"),
        ("a=.nan", "not finite"),
        ("a=!!python/object:os.system x", "constructor"),
        ("a=", "give a value"),
        ("a", "key.path=value"),
        ("a..b=1", "dotted path"),
    ):
        try:
            parse_set(text)
        except EnvSettingsError as err:
            assert why in str(err), (text, err)
        else:
            raise AssertionError(f"{text!r} was taken")


def test_a_date_stays_the_string_written() -> None:
    assert parse_set("brain.x=2026-03-01").value == "2026-03-01"
