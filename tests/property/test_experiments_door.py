"""Whatever a client POSTs to /v1/experiments, the door validates it or answers a 4xx that
names the field (handlers/experiments/http.py `submitted_document`, the body's whole path
before publishing): never an exception of another kind, which would be a 500."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.experiments.http import Refused, submitted_document
from schemas.experiments import ExperimentDocument
from tests.unit.experiments.documents import document

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)


def _places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``value`` (dict keys and list indices)."""
    found = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _places(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _places(v, (*path, i))
    return found


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    here = doc
    for part in path[:-1]:
        here = here[part]
    here[path[-1]] = value
    return doc


def _drop(doc: Any, path: tuple[Any, ...]) -> Any:
    here = doc
    for part in path[:-1]:
        here = here[part]
    del here[path[-1]]
    return doc


@st.composite
def mutated(draw: st.DrawFn) -> Any:
    """A valid document with one place changed: a value replaced, a key dropped, or a key
    added."""
    doc = document()
    places = _places(doc)
    path = draw(st.sampled_from(places))
    how = draw(st.sampled_from(["replace", "drop", "add"]))
    here = doc
    for part in path:
        here = here[part]
    if how == "drop" and path:
        return _drop(doc, path)
    if how == "add" and isinstance(here, dict):
        here[draw(st.text(min_size=1, max_size=12))] = draw(json_values)
        return doc
    return _set(doc, path, draw(json_values))


_PART = re.compile(r'(?:^|\.)([A-Za-z_][A-Za-z0-9_-]*)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


def _parts(field: str) -> list[int | str]:
    """A field's path back into its parts (dlrover_events.experiments.document.spell);
    AssertionError if it is not written that way."""
    parts: list[int | str] = []
    at = 0
    while at < len(field):
        m = _PART.match(field, at)
        assert m is not None and m.end() > at, (field, at)
        name, index, quoted = m.groups()
        parts.append(name if name is not None else int(index) if index else json.loads(quoted))
        at = m.end()
    return parts


def _named_place_exists(data: Any, field: str) -> bool:
    """Every part of the field is a place in ``data``, but the last may be a key that a
    mapping there lacks (a missing field)."""
    here = data
    parts = _parts(field)
    for i, part in enumerate(parts):
        in_dict = isinstance(here, dict) and part in here
        in_list = isinstance(here, list) and isinstance(part, int) and part < len(here)
        if not (in_dict or in_list):
            return i == len(parts) - 1 and isinstance(here, dict)
        here = here[part]
    return True


def _answer(data: Any) -> None:
    raw = json.dumps(data).encode()
    try:
        doc = submitted_document(raw)
    except Refused as refused:
        assert refused.status == 422, (refused.status, str(refused))
        assert refused.field is not None and str(refused) and "\n" not in str(refused)
        if isinstance(data, dict):
            assert refused.field, str(refused)
            assert _named_place_exists(data, refused.field), (refused.field, data)
    else:
        assert isinstance(doc, ExperimentDocument)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_is_an_experiment_or_a_422_naming_the_field(data: Any) -> None:
    _answer(data)


@settings(max_examples=400, deadline=None)
@given(mutated())
def test_a_document_changed_in_one_place_is_valid_or_names_the_field(data: Any) -> None:
    _answer(copy.deepcopy(data))


@given(st.binary(max_size=200))
def test_any_bytes_are_json_or_a_400(raw: bytes) -> None:
    try:
        submitted_document(raw)
    except Refused as refused:
        assert refused.status in (400, 422) and str(refused)
