"""Bearer tokens per env, with scopes: ``read`` (jobs fetch configs and plans) and ``admin``
(documents are changed; admin includes read).

A token reads ``dle.<env>.<id>.<secret>``. The env in clear lets a gateway tell "a token
of another env" (403) from "no such token" (401) without a lookup; only the SHA-256 of
the whole token is stored, which is enough for a 256-bit random secret (no password
stretching needed) and keeps a leaked table useless. Verified tokens are remembered for a
few seconds, so a read costs a hash and a dict lookup, and a revocation still takes
effect within that time.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import asyncpg

from dlrover_events.bus.topics import check_env_name


class Scope(StrEnum):
    READ = "read"
    ADMIN = "admin"


#: A token of one job: what a platform gives the pods of a role that may scale the job's
#: other roles (``scales``), which grants that job's scale requests and nothing else
#: (``job:<uid>``; the uid, not the name, so a job submitted again under the same name is
#: another job).
JOB_SCOPE_PREFIX = "job:"


def job_scope(job_uid: str) -> str:
    """The scope of one job's token."""
    if not job_uid:
        raise ValueError("a job scope needs the job's uid")
    return f"{JOB_SCOPE_PREFIX}{job_uid}"


def _scope_value(scope: Scope | str) -> str:
    """A scope as stored: one of ``Scope``, or a job's."""
    if isinstance(scope, str) and scope.startswith(JOB_SCOPE_PREFIX) and len(scope) > 4:
        return scope
    return Scope(scope).value


PREFIX = "dle"
_TOKEN = re.compile(r"^dle\.([a-z][a-z0-9-]{0,30})\.([0-9a-f]{8,32})\.([A-Za-z0-9_-]{16,128})$")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token(env: str) -> tuple[str, str]:
    """A fresh ``(token_id, token)`` for ``env``; the token is shown once, never stored."""
    token_id = secrets.token_hex(6)
    return token_id, f"{PREFIX}.{check_env_name(env)}.{token_id}.{secrets.token_urlsafe(32)}"


def token_env(token: str) -> str | None:
    m = _TOKEN.match(token)
    return m.group(1) if m else None


def token_id_of(token: str) -> str | None:
    """The id a well-formed token carries in clear (what `gateway-token list` shows)."""
    m = _TOKEN.match(token)
    return m.group(2) if m else None


def grants(scopes: Collection[str], needed: Scope | str) -> bool:
    """Admin grants everything; a job's scope only that job's."""
    return _scope_value(needed) in scopes or Scope.ADMIN.value in scopes


@dataclass(frozen=True, slots=True)
class Verdict:
    """Who is calling, or why not: ``status`` 200, 401 or 403 (503: cannot tell now)."""

    status: int
    message: str = ""
    token_id: str | None = None
    #: the token's scopes (empty unless it was verified)
    scopes: frozenset[str] = frozenset()

    @property
    def admin(self) -> bool:
        return Scope.ADMIN.value in self.scopes


@dataclass(frozen=True, slots=True)
class TokenInfo:
    token_id: str
    name: str
    scopes: list[str]
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True)
class _Known:
    token_id: str
    scopes: frozenset[str]


class Tokens:
    """The env's ``gateway_tokens`` table: mint, list, revoke, verify (with a short cache)."""

    def __init__(self, pool: asyncpg.Pool, env: str, *, ttl_s: float = 5.0) -> None:
        self.pool = pool
        self.env = env
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, _Known | None]] = {}

    async def mint(self, name: str, scopes: Collection[Scope | str]) -> tuple[str, str]:
        """Store a new token's hash; returns ``(token_id, token)``."""
        if not scopes:
            raise ValueError("a token needs at least one scope")
        token_id, token = new_token(self.env)
        await self.add(token_id, token, name, scopes)
        return token_id, token

    async def add(
        self, token_id: str, token: str, name: str, scopes: Collection[Scope | str]
    ) -> None:
        await self.pool.execute(
            "INSERT INTO gateway_tokens (token_id, name, token_hash, scopes)"
            " VALUES ($1, $2, $3, $4) ON CONFLICT (token_hash) DO UPDATE"
            " SET scopes = EXCLUDED.scopes, revoked_at = NULL",
            token_id,
            name,
            hash_token(token),
            sorted(_scope_value(s) for s in scopes),
        )

    async def state(self, token: str) -> str:
        """``active``, ``revoked`` or ``unknown`` (not stored here): whether a token kept
        elsewhere (a Secret, a file) still works, or was revoked on purpose."""
        row = await self.pool.fetchrow(
            "SELECT revoked_at FROM gateway_tokens WHERE token_hash = $1", hash_token(token)
        )
        if row is None:
            return "unknown"
        return "active" if row["revoked_at"] is None else "revoked"

    async def revoke(self, token_id: str) -> bool:
        status = await self.pool.execute(
            "UPDATE gateway_tokens SET revoked_at = now() WHERE token_id = $1"
            " AND revoked_at IS NULL",
            token_id,
        )
        return bool(status.endswith(" 1"))

    async def list(self) -> list[TokenInfo]:
        rows = await self.pool.fetch(
            "SELECT token_id, name, scopes, created_at, revoked_at FROM gateway_tokens"
            " ORDER BY created_at"
        )
        return [TokenInfo(**dict(r)) for r in rows]

    async def verify(self, authorization: str | None, needed: Scope | str) -> Verdict:
        """Who is calling, and whether its token grants ``needed`` (a ``Scope``, or a job's
        scope: ``job_scope``)."""
        if not authorization:
            return Verdict(401, "missing bearer token (Authorization: Bearer <token>)")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Verdict(401, "the Authorization header must be 'Bearer <token>'")
        env = token_env(token)
        if env is not None and env != self.env:
            return Verdict(403, f"this token is for env {env!r}, not {self.env!r}")
        known = await self._lookup(hash_token(token))
        if known is None:
            return Verdict(401, "unknown or revoked token")
        if not grants(known.scopes, needed):
            wanted = _scope_value(needed)
            if any(s.startswith(JOB_SCOPE_PREFIX) for s in known.scopes):
                what = (
                    "is another job's"
                    if wanted.startswith(JOB_SCOPE_PREFIX)
                    else f"is a job's token; this needs the {wanted!r} scope"
                )
                return Verdict(403, f"token {known.token_id} {what}", known.token_id)
            return Verdict(
                403,
                f"token {known.token_id} lacks the {wanted!r} scope "
                f"(it has: {', '.join(sorted(known.scopes))})",
                known.token_id,
            )
        return Verdict(200, "", known.token_id, known.scopes)

    async def _lookup(self, digest: str) -> _Known | None:
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            row = await self.pool.fetchrow(
                "SELECT token_id, scopes FROM gateway_tokens"
                " WHERE token_hash = $1 AND revoked_at IS NULL",
                digest,
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            if cached is not None:  # Postgres is away: a token we knew keeps working
                return cached[1]
            raise
        known = _Known(row["token_id"], frozenset(row["scopes"])) if row is not None else None
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[digest] = (now + self.ttl_s, known)
        return known
