"""`dlrover-events bench gateway`: load N documents, drive one gateway over loopback.

The gateway runs in a child process and the clients in others, so the numbers are the
gateway's, not the load generator's. The last line printed is one JSON object (requests_per_s,
p50_ms, p99_ms, errors, and how long a change took to reach a waiting long-poll).
Needs Kafka and Postgres as `up` finds them; with no broker reachable it starts tansu.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import random
import statistics
import tempfile
import time
import uuid
from typing import Any

import aiohttp
import orjson
import typer

from dlrover_events.bus.producer import Producer
from dlrover_events.cli.params import env_name
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.envs.tokens import Scope, Tokens
from dlrover_events.runtime.embedded import Broker, free_port, port_open, resolve_postgres
from dlrover_events.settings import Settings, load_settings
from dlrover_events.store import create_pool, env_schema
from handlers.gateway.runtime import GatewayServer, GatewaySettings, prepare_env
from handlers.gateway.store import ConfigStore
from schemas.config import ConfigDocument
from schemas.control import EnvMode

GROUPS = 20
CLUSTERS = 8


def make_documents(n: int, seed: int = 7) -> list[ConfigDocument]:
    """A plausible mix: one default for everyone, per-user documents, some narrowed to a
    group or cluster, some excluding a cluster, a few with priorities."""
    rnd = random.Random(seed)
    users = max(1, n // 4)
    docs = [ConfigDocument(name="default", configure={"lr": 0.1, "workers": 2, "opt": "sgd"})]
    for i in range(n - 1):
        include: dict[str, Any] = {"user": f"user{i % users}"}
        if i % 3 == 1:
            include["group"] = f"g{rnd.randrange(GROUPS)}"
        if i % 5 == 2:
            include["cluster"] = [f"c{rnd.randrange(CLUSTERS)}", f"c{rnd.randrange(CLUSTERS)}"]
        exclude = {"cluster": f"c{rnd.randrange(CLUSTERS)}"} if i % 7 == 3 else {}
        docs.append(
            ConfigDocument(
                name=f"doc-{i:06d}",
                include=include,
                exclude=exclude,
                configure={"lr": round(rnd.random(), 4), f"k{i % 50}": i, "opt": {"beta": i % 9}},
                priority=rnd.randrange(3) if i % 11 == 0 else 0,
            )
        )
    return docs


def job_queries(n_jobs: int, n_docs: int) -> list[str]:
    users = max(1, n_docs // 4)
    return [
        f"/v1/config?user=user{j % users}&group=g{j % GROUPS}&cluster=c{j % CLUSTERS}&job=job-{j}"
        for j in range(n_jobs)
    ]


def write_wrk_script(queries: list[str]) -> str:
    """A wrk Lua script cycling through the same job queries as the bench's clients."""
    lines = ",\n".join(f'  "{q}"' for q in queries)
    body = (
        f"local paths = {{\n{lines}\n}}\nlocal i = 0\n"
        "request = function()\n  i = i % #paths + 1\n"
        '  return wrk.format("GET", paths[i])\nend\n'
    )
    fd, path = tempfile.mkstemp(prefix="gateway-wrk-", suffix=".lua")
    with os.fdopen(fd, "w") as f:
        f.write(body)
    return path


def _serve_child(bootstrap: str, env: str, dsn: str, port: int) -> None:
    async def main() -> None:
        settings = Settings(bootstrap_servers=bootstrap, pg_dsn=dsn)
        conf = GatewaySettings(host="127.0.0.1", port=port)
        async with GatewayServer(settings, env, dsn, conf):
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


def _drive_child(
    url: str, token: str, queries: list[str], seconds: float, concurrency: int, offset: int
) -> tuple[list[float], int]:
    return asyncio.run(_drive(url, token, queries, seconds, concurrency, offset))


async def _drive(
    url: str, token: str, queries: list[str], seconds: float, concurrency: int, offset: int
) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = 0
    headers = {"Authorization": f"Bearer {token}"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector, headers=headers) as http:
        deadline = time.perf_counter() + seconds

        async def worker(w: int) -> None:
            nonlocal errors
            i = offset + w
            while True:
                t0 = time.perf_counter()
                if t0 >= deadline:
                    return
                try:
                    async with http.get(queries[i % len(queries)]) as resp:
                        await resp.read()
                        ok = resp.status == 200
                except (aiohttp.ClientError, OSError):
                    ok = False
                latencies.append(time.perf_counter() - t0)
                errors += not ok
                i += concurrency

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return latencies, errors


async def _wait_ready(url: str, want: int, timeout_s: float = 180) -> float:
    started = time.perf_counter()
    async with aiohttp.ClientSession() as http:
        while time.perf_counter() - started < timeout_s:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(url + "/readyz") as resp:
                    body = await resp.json()
                    if resp.status == 200 and body["documents"] >= want:
                        return time.perf_counter() - started
            await asyncio.sleep(0.1)
    raise TimeoutError(f"the gateway did not load {want} documents in {timeout_s:.0f}s")


async def _propagation(url: str, read: str, admin: str, trials: int) -> list[float]:
    """ms from sending an update to a waiting long-poll returning with it."""
    out = []
    async with aiohttp.ClientSession(url) as http:
        for t in range(trials):
            q = {"user": "probe", "job": f"probe-{t}"}
            doc = {"name": "probe", "Include": {"user": "probe"}, "Configure": {"trial": t}}
            auth = {"Authorization": f"Bearer {admin}"}
            async with http.get("/v1/documents/probe", headers=auth) as r:
                version = (await r.json())["version"] if r.status == 200 else None
            async with http.get(
                "/v1/config", params=q, headers={"Authorization": f"Bearer {read}"}
            ) as r:
                etag = r.headers["ETag"]

            async def poll(etag: str = etag, q: dict[str, str] = q) -> float:
                hdrs = {"Authorization": f"Bearer {read}", "If-None-Match": etag}
                async with http.get("/v1/config", params={**q, "wait": "30"}, headers=hdrs) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"long-poll ended with {r.status}")
                return time.perf_counter()

            waiting = asyncio.create_task(poll())
            await asyncio.sleep(0.2)
            sent = time.perf_counter()
            if version is None:
                r = await http.post("/v1/documents", json=doc, headers=auth)
            else:
                r = await http.put(
                    "/v1/documents/probe", json=doc, headers={**auth, "If-Match": f'"{version}"'}
                )
            r.release()
            out.append(1000 * (await waiting - sent))
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _prepare(settings: Settings, dsn: str, env: str, n: int) -> tuple[str, str, float]:
    await EnvRegistry(settings, dsn).create(env, EnvMode.VIRTUAL, partitions=1, exist_ok=True)
    pool = await create_pool(dsn, env_schema(env), max_size=2)
    try:
        await prepare_env(dsn, env)
        tokens = Tokens(pool, env)
        _, read = await tokens.mint("bench read", [Scope.READ])
        _, admin = await tokens.mint("bench admin", [Scope.ADMIN])
        started = time.perf_counter()
        async with Producer(settings, linger_ms=5) as producer:
            store = ConfigStore(pool, env, producer)
            docs = make_documents(n)
            for i in range(0, len(docs), 2000):
                await store.bulk_upsert(docs[i : i + 2000])
        return read, admin, time.perf_counter() - started
    finally:
        await pool.close()


def bench_gateway(
    configs: int = typer.Option(10_000, "--configs", min=1, help="documents to load"),
    seconds: float = typer.Option(10.0, "--seconds", min=0.5, help="how long to drive"),
    concurrency: int = typer.Option(64, "--concurrency", "-c", min=1, help="connections"),
    clients: int = typer.Option(
        0, "--clients", help="client processes (0: half the CPUs, at least 1)"
    ),
    jobs: int = typer.Option(
        2_000, "--jobs", min=1, help="distinct jobs asking (more: fewer cached answers)"
    ),
    env: str = typer.Option(
        None, "--env", parser=env_name, help="env to load (default: a fresh one, dropped)"
    ),
    hold: bool = typer.Option(
        False, "--hold", help="keep the gateway up afterwards (for wrk) until Ctrl-C"
    ),
) -> None:
    """Load N documents, drive the gateway with concurrent clients, print one JSON line."""
    settings = load_settings()
    broker: Broker | None = None
    if "bootstrap_servers" not in settings.model_fields_set:
        host, _, bport = settings.bootstrap_servers.rpartition(":")
        if not port_open(host, int(bport)):
            broker = Broker("127.0.0.1", free_port(), settings.data_dir / "logs")
            broker.start()
            settings = settings.with_overrides(bootstrap_servers=broker.bootstrap_servers)
    own_env = env is None
    env_name = env or f"bench-{uuid.uuid4().hex[:8]}"
    child: Any = None
    dsn: str | None = None
    try:
        dsn = asyncio.run(resolve_postgres(settings)).dsn
        read, admin, load_s = asyncio.run(_prepare(settings, dsn, env_name, configs))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        ctx = mp.get_context("spawn")
        child = ctx.Process(
            target=_serve_child, args=(settings.bootstrap_servers, env_name, dsn, port), daemon=True
        )
        child.start()
        ready_s = asyncio.run(_wait_ready(url, configs))
        queries = job_queries(jobs, configs)
        procs = clients or max(1, (os.cpu_count() or 2) // 2)
        per = max(1, concurrency // procs)
        started = time.perf_counter()
        with ctx.Pool(procs) as pool:
            results = pool.starmap(
                _drive_child,
                [(url, read, queries, seconds, per, p * per) for p in range(procs)],
            )
        elapsed = time.perf_counter() - started
        latencies = [x for lat, _ in results for x in lat]
        errors = sum(e for _, e in results)
        visible = asyncio.run(_propagation(url, read, admin, 5))
        result = {
            "configs": configs,
            "jobs": jobs,
            "seconds": seconds,
            "concurrency": per * procs,
            "client_processes": procs,
            "requests": len(latencies),
            "requests_per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": round(1000 * _pct(latencies, 0.50), 3),
            "p99_ms": round(1000 * _pct(latencies, 0.99), 3),
            "errors": errors,
            "change_visible_ms_p50": round(statistics.median(visible), 1),
            "change_visible_ms_max": round(max(visible), 1),
            "load_s": round(load_s, 2),
            "index_ready_s": round(ready_s, 2),
        }
        if hold:
            script = write_wrk_script(queries)
            typer.echo(f"gateway of env {env_name} on {url}; read token: {read}")
            typer.echo(
                f"wrk -t2 -c64 -d10s --latency -s {script} -H 'Authorization: Bearer {read}' {url}"
            )
            typer.echo(orjson.dumps(result).decode())
            with contextlib.suppress(KeyboardInterrupt):
                child.join()
        typer.echo(orjson.dumps(result).decode())
    finally:
        if child is not None and child.is_alive():
            child.terminate()
            child.join(10)
        if own_env and dsn is not None:
            with contextlib.suppress(Exception):
                asyncio.run(EnvRegistry(settings, dsn).delete(env_name, force=True))
        if broker is not None:
            broker.stop()
