"""The gateway's request rules over any input: If-Match takes exactly one quoted strong
entity tag and says what to send otherwise; a document name from a URL is what the model
takes; a body's bounds are checked without recursion, at any depth."""

from __future__ import annotations

import json
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
    parse_body,
    parse_if_match,
)
from schemas.bounds import INT64_MAX, INT64_MIN
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


#: integers of any size, the bounds of int64 and of orjson's own reading among them
any_integers = (
    st.integers()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.sampled_from([INT64_MAX, INT64_MAX + 1, INT64_MIN, INT64_MIN - 1, 2**64, 10**23])
)
exact_values = st.recursive(
    st.none()
    | st.booleans()
    | any_integers
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=30,
)


@given(exact_values)
def test_a_body_is_read_with_every_number_as_written(value: object) -> None:
    """An integer stays the integer it was (orjson alone made 10^23 the float 1e+23),
    a float the float it was."""
    raw = json.dumps(value).encode()
    read = parse_body(raw)
    assert read == value
    assert _shape(read) == _shape(value)


def _shape(value: object) -> object:
    """The value with each number replaced by its type (1 == 1.0, but not as JSON)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value)


@given(any_integers.filter(lambda n: not INT64_MIN <= n <= INT64_MAX))
def test_an_integer_beyond_int64_is_refused_whatever_its_size(number: int) -> None:
    problem = body_problem(parse_body(b'{"Configure": {"k": %d}}' % number))
    assert problem is not None and "beyond int64" in problem


@given(st.sampled_from([b"1e23", b"1.0e23", b"-1E+30", b"123456789012345678901.5"]))
def test_a_large_float_stays_a_float(number: bytes) -> None:
    read = parse_body(b'{"k": %s}' % number)
    assert read == {"k": float(number)} and body_problem(read) is None


@given(st.binary(max_size=40) | st.text(max_size=40).map(str.encode))
def test_any_bytes_are_a_value_or_a_400(raw: bytes) -> None:
    try:
        parse_body(raw)
    except Refused as err:
        assert err.status == 400 and err.code == "bad_json" and "not valid JSON" in err.message
