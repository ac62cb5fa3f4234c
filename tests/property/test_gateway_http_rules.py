"""The gateway's request rules over any input: If-Match takes exactly one quoted strong
entity tag and says what to send otherwise; a document name from a URL is what the model
takes; a body's bounds are checked without recursion, at any depth."""

from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from handlers.gateway.http_rules import (
    MAX_BODY_DEPTH,
    NAME_PATTERN,
    Refused,
    body_problem,
    check_name,
    parse_if_match,
)
from schemas.config import ConfigDocument

versions = st.integers(min_value=1, max_value=999_999_999)
ows = st.sampled_from(["", " ", "\t", "  "])


@given(versions, ows, ows)
def test_a_quoted_version_is_taken(version: int, before: str, after: str) -> None:
    assert parse_if_match(f'{before}"{version}"{after}') == version


@given(versions)
def test_a_bare_number_is_a_400_that_shows_the_quoted_form(version: int) -> None:
    with pytest.raises(Refused) as err:
        parse_if_match(str(version))
    assert err.value.status == 400 and f'"{version}"' in err.value.message


@given(versions)
def test_a_weak_tag_fails_the_precondition(version: int) -> None:
    with pytest.raises(Refused) as err:
        parse_if_match(f'W/"{version}"')
    assert err.value.status == 412 and "weak" in err.value.message


@given(st.text(max_size=60))
def test_any_header_is_a_version_or_a_4xx_with_a_message(header: str) -> None:
    try:
        version = parse_if_match(header)
    except Refused as err:
        assert err.status in (400, 412) and err.message and "If-Match" in err.message
    else:
        assert re.fullmatch(r'[ \t]*"[1-9][0-9]{0,8}"[ \t]*', header)
        assert 1 <= version <= 999_999_999


@given(st.text(max_size=260))
def test_a_name_is_taken_exactly_when_the_model_takes_it(name: str) -> None:
    try:
        check_name(name)
        taken = True
    except Refused as err:
        assert err.status == 400 and "1 to 200" in err.message
        taken = False
    model = True
    try:
        ConfigDocument(name=name)
    except ValueError:
        model = False
    assert taken == model, name
    if taken:
        assert "\x00" not in name and re.fullmatch(NAME_PATTERN.strip("^$"), name)


@given(st.integers(min_value=1, max_value=1_024))
def test_a_body_of_any_depth_gets_an_answer(depth: int) -> None:
    body = orjson.loads(b"[" * (depth - 1) + b"1" + b"]" * (depth - 1))
    problem = body_problem(body)
    if depth - 1 > MAX_BODY_DEPTH:
        assert problem == f"nests deeper than {MAX_BODY_DEPTH}"
    else:
        assert problem is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=30,
)


@given(json_values)
def test_a_body_without_a_problem_encodes_and_stores(value: object) -> None:
    """No problem means orjson can write it again and Postgres jsonb can hold it."""
    if body_problem(value) is None:
        assert orjson.loads(orjson.dumps(value)) == value
        assert "\\u0000" not in orjson.dumps(value).decode()
