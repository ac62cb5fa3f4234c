"""The gateway's rules for what a request may say, as pure functions (no aiohttp), so
each is tested over any input: the If-Match precondition, a document name in a URL, and
the shape of a JSON body.

Each returns the value or raises ``Refused`` with the status and a message that says
what to send instead; the handlers turn that into the JSON error.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

import orjson

from schemas.bounds import MAX_DOCUMENT_DEPTH, MAX_DOCUMENT_VALUES, json_problem

#: Versions are int32, as the OpenAPI document says.
INT32 = 2**31 - 1
#: A strong entity tag holding a version: "1" to "999999999" (RFC 9110 8.8.3).
IF_MATCH = r'^"[1-9][0-9]{0,8}"$'
_IF_MATCH = re.compile(IF_MATCH)
_WEAK = re.compile(r'^W/"[^"]*"$')
#: What ConfigDocument.name takes.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
MAX_NAME = 200
_NAME = re.compile(NAME_PATTERN)
#: A document body nests one level above its Configure part.
MAX_BODY_DEPTH = MAX_DOCUMENT_DEPTH + 1


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def parse_if_match(header: str) -> int:
    """The version an If-Match header names: exactly one strong entity tag, quoted.

    A bare ``1`` is not an entity tag (RFC 9110 8.8.3); accepting it let a client that
    sent an unquoted number believe it had a precondition. A weak tag (``W/"1"``) never
    matches under If-Match's strong comparison (RFC 9110 13.1.1), so it fails the
    precondition (412) rather than the syntax."""
    tag = header.strip(" \t")
    shown = repr(header[:40])
    if _IF_MATCH.fullmatch(tag):
        return int(tag[1:-1])
    if _WEAK.fullmatch(tag):
        raise Refused(
            412,
            "precondition_failed",
            f"If-Match {shown} is a weak entity tag, which never matches (RFC 9110"
            ' 13.1.1): send the document\'s ETag as it is, a strong tag like "3"',
        )
    if tag.isdigit() and tag.isascii():
        raise Refused(
            400,
            "bad_version",
            f'If-Match must be a quoted entity tag (RFC 9110 8.8.3): If-Match: "{tag[:12]}",'
            f" not {shown}",
        )
    if tag == "*":
        raise Refused(
            400,
            "bad_version",
            'If-Match: * is not taken here: name the version you change, If-Match: "<version>"',
        )
    if "," in tag:
        raise Refused(
            400, "bad_version", f'If-Match must name one version, "<version>"; not {shown}'
        )
    raise Refused(
        400,
        "bad_version",
        f'If-Match must be "<version>", the document\'s ETag: a quoted integer from 1 to'
        f" 999999999; not {shown}",
    )


def check_name(name: str) -> str:
    """A document name from a URL, before it goes anywhere near Postgres (which refuses
    a NUL with an error, not an answer)."""
    if not 1 <= len(name) <= MAX_NAME or not _NAME.fullmatch(name):
        raise Refused(
            400,
            "bad_name",
            f"document names are 1 to {MAX_NAME} characters of letters, digits, '.', '_'"
            f" and '-', starting with a letter or digit; not {name[:40]!r}",
        )
    return name


#: A run of digits as long as an integer beyond int64 needs (19, with its sign).
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def parse_body(raw: bytes) -> Any:
    """A request body as JSON, with every integer as written (400 ``bad_json`` if it is not
    JSON).

    orjson reads an integer beyond 64 bits as a float: 10^23 became 1e+23, passed the
    int64 bound as a number and was stored, although the bound refuses it. Such an
    integer has 19 digits or more, so a body with a run of digits that long (rare: ids
    in strings, long decimals) is read again by the standard library, which keeps every
    integer exact; the bound then refuses it (422). orjson reads first: it alone says
    what is not JSON (NaN, 1e400, ...), and it is faster for every other body."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise Refused(400, "bad_json", f"the body is not valid JSON: {err}") from None
    if _LONG_DIGITS.search(raw):
        # nested past Python's recursion: refused for its depth anyway
        with contextlib.suppress(RecursionError):
            obj = json.loads(raw)
    return obj


def body_problem(obj: Any, *, max_depth: int = MAX_BODY_DEPTH) -> str | None:
    """What keeps a parsed JSON body out of the bounds every stored document keeps, or
    None: at most MAX_DOCUMENT_VALUES values, nested at most ``max_depth``, no NUL,
    finite numbers, integers within int64. orjson parses 1,024 levels but encodes only
    254, so a deep body was a 500 when it was encoded again."""
    return json_problem(obj, max_depth=max_depth, max_values=MAX_DOCUMENT_VALUES)
