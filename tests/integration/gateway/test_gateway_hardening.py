"""What a hostile or careless client gets from a real gateway: a 4xx with a message that
states the bound, never a 500, and no connection or waiter held past a bound.

Each case here was a 500 or a hole before: a NUL in a document name went straight to
Postgres, JSON nested 254+ levels hit orjson's encoder limit, a bare ``If-Match: 1`` was
taken, slow clients held connections without end, long-polls had no ceiling."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from dlrover_events.envs.tokens import Scope
from dlrover_events.settings import Settings
from handlers.gateway.runtime import GatewayServer, GatewaySettings
from schemas.bounds import MAX_CONFIG_DOCUMENT_BYTES, MAX_DOCUMENT_VALUES
from tests.conftest import EnvFactory
from tests.integration.gateway.conftest import Running, mint

pytestmark = pytest.mark.integration

#: Short bounds, so each test meets them in well under a second.
SLOW_S = 0.5
#: How long a test waits for the gateway to act on a bound before failing.
WAIT_S = 15.0


@pytest.fixture
async def tight(settings: Settings, pg_dsn: str, make_env: EnvFactory) -> AsyncIterator[Running]:
    env = (await make_env(partitions=1)).name
    admin = await mint(pg_dsn, env, Scope.ADMIN)
    read = await mint(pg_dsn, env, Scope.READ)
    conf = GatewaySettings(
        host="127.0.0.1",
        port=0,
        pool_max=2,
        header_timeout_s=SLOW_S,
        body_timeout_s=SLOW_S,
        config_waiters=2,
    )
    async with GatewayServer(settings, env, pg_dsn, conf) as server:
        await server.wait_ready(30)
        # The server keeps an idle connection only SLOW_S (its header timeout), so a pooled
        # one may close just as the next request goes out: a clean-clone CI run read a
        # reset there. One connection per request keeps these tests about their bounds.
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            yield Running(server, env, server.url, admin, read, http)


async def call(
    gw: Running, method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any
) -> tuple[int, Any]:
    async with gw.http.request(
        method, gw.url + path, headers={**gw.as_admin, **(headers or {})}, **kw
    ) as resp:
        body = await resp.json() if resp.content_type == "application/json" else await resp.text()
        return resp.status, body


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


async def test_a_nul_in_a_document_name_is_a_400_not_a_500(tight: Running) -> None:
    for method, path, headers in [
        ("GET", "/v1/documents/a%00b", {}),
        ("PUT", "/v1/documents/a%00b", {"If-Match": '"1"'}),
        ("DELETE", "/v1/documents/a%00b", {"If-Match": '"1"'}),
        ("GET", "/v1/history/a%00b", {}),
        ("GET", "/v1/documents/" + "n" * 201, {}),
    ]:
        kw = {"json": {"Configure": {}}} if method == "PUT" else {}
        status, body = await call(tight, method, path, headers=headers, **kw)
        assert status == 400, (method, path, body)
        assert body["error"]["code"] == "bad_name" and "1 to 200" in body["error"]["message"]


async def test_deep_or_huge_json_is_a_4xx_that_states_the_bound(tight: Running) -> None:
    for depth in (40, 300, 1000):
        status, body = await call(
            tight,
            "POST",
            "/v1/documents",
            data='{"name": "deep", "Configure": {"k": ' + nested(depth) + "}}",
            headers={"Content-Type": "application/json"},
        )
        assert status == 422, (depth, body)
        assert "nests deeper than 33" in body["error"]["message"]
    status, body = await call(
        tight,
        "POST",
        "/v1/jobs/some-job/optimize",
        data='{"stage": "x", "config": {"k": ' + nested(1000) + "}}",
        headers={"Content-Type": "application/json"},
    )
    assert status == 422 and "nests deeper" in body["error"]["message"], body
    many = {"name": "many", "Configure": {f"k{i}": i for i in range(MAX_DOCUMENT_VALUES)}}
    status, body = await call(tight, "POST", "/v1/documents", json=many)
    assert status == 422 and f"more than {MAX_DOCUMENT_VALUES} values" in str(body), body
    big = {"name": "big", "Configure": {"k": "x" * MAX_CONFIG_DOCUMENT_BYTES}}
    status, body = await call(tight, "POST", "/v1/documents", json=big)
    assert status == 413 and str(MAX_CONFIG_DOCUMENT_BYTES) in body["error"]["message"], body


async def test_an_integer_beyond_int64_is_a_422_not_a_stored_float(tight: Running) -> None:
    """orjson read 10^23 as the float 1e+23, and the document was stored so."""
    json = {"Content-Type": "application/json"}
    for number in ("100000000000000000000000", "-9223372036854775809", "18446744073709551616"):
        status, body = await call(
            tight,
            "POST",
            "/v1/documents",
            data='{"name": "big", "Configure": {"k": ' + number + "}}",
            headers=json,
        )
        assert status == 422, (number, body)
        assert f"integer {number} is beyond int64" in body["error"]["message"], body
        status, body = await call(
            tight,
            "POST",
            "/v1/jobs/some-job/optimize",
            data='{"stage": "x", "config": {"k": ' + number + "}}",
            headers=json,
        )
        assert status == 422 and "beyond int64" in body["error"]["message"], body
    # a float literal of that size is a float, and taken as one
    status, body = await call(
        tight,
        "POST",
        "/v1/documents",
        data='{"name": "float", "Configure": {"k": 1e23}}',
        headers=json,
    )
    assert status == 201 and body["Configure"] == {"k": 1e23}, body


async def test_if_match_must_be_one_quoted_strong_tag(tight: Running) -> None:
    status, body = await call(tight, "POST", "/v1/documents", json={"name": "d"})
    assert status == 201, body
    for header, want, says in [
        ("1", 400, '"1"'),
        ('W/"1"', 412, "weak"),
        ("*", 400, "*"),
        ('"1", "2"', 400, "one version"),
    ]:
        status, body = await call(tight, "DELETE", "/v1/documents/d", headers={"If-Match": header})
        assert status == want, (header, body)
        assert says in body["error"]["message"], (header, body)
    status, body = await call(tight, "DELETE", "/v1/documents/d", headers={"If-Match": '"1"'})
    assert status == 200, body


async def _closed_within(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    """What the server sent before closing; fails if it keeps the connection open."""
    try:
        async with asyncio.timeout(timeout_s):
            return await reader.read()
    except TimeoutError:
        pytest.fail(f"the gateway still held the connection after {timeout_s} s")


async def test_slow_headers_and_bodies_do_not_hold_connections(tight: Running) -> None:
    port = tight.server.port
    # headers that never end: the connection is closed at the header timeout
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    await writer.drain()
    for _ in range(3):  # trickling bytes does not keep it open
        await asyncio.sleep(SLOW_S / 3)
        writer.write(b"a")
        await writer.drain()
    await _closed_within(reader, WAIT_S)
    writer.close()

    # a connection that sends nothing at all, and one idle after its answer
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await _closed_within(reader, WAIT_S)
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = await _closed_within(reader, WAIT_S)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
    writer.close()

    # a body that never arrives whole: 408 with the bound, and the connection closed
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/documents HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {tight.admin}\r\nContent-Length: 100\r\n\r\n".encode()
        + b'{"name": '
    )
    await writer.drain()
    answer = await _closed_within(reader, WAIT_S)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert f"within {SLOW_S:g} s".encode() in answer
    writer.close()


async def test_long_polls_past_the_bound_are_refused_with_503(tight: Running) -> None:
    query = "/v1/config?user=u1"
    async with tight.http.get(tight.url + query, headers=tight.as_reader) as resp:
        etag = resp.headers["ETag"]
    waiting = {**tight.as_reader, "If-None-Match": etag}

    async def poll() -> int:
        async with tight.http.get(tight.url + query + "&wait=30", headers=waiting) as resp:
            return resp.status

    polls = [asyncio.create_task(poll()) for _ in range(2)]
    gateway = tight.server.gateway
    assert gateway is not None
    for _ in range(int(WAIT_S / 0.02)):
        if gateway.config_waiting == 2:
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail(f"2 long-polls were not waiting after {WAIT_S} s")
    async with tight.http.get(tight.url + query + "&wait=30", headers=waiting) as resp:
        body = await resp.json()
        assert resp.status == 503, body
        assert resp.headers["Retry-After"] == "1"
    assert body["error"]["code"] == "too_many_waiters"
    assert "(2, DLROVER_EVENTS_GATEWAY_CONFIG_WAITERS)" in body["error"]["message"]
    # without wait, the same request is answered at once
    async with tight.http.get(tight.url + query, headers=waiting) as resp:
        assert resp.status == 304
    # a change wakes the waiters, and the bound frees up
    status, body = await call(tight, "POST", "/v1/documents", json={"name": "wake"})
    assert status == 201, body
    assert await asyncio.wait_for(asyncio.gather(*polls), WAIT_S) == [200, 200]
    assert gateway.config_waiting == 0
