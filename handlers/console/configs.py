"""The env's config documents as the console shows them: read from the env's Postgres, the
system of record the gateway writes (handlers/gateway/store.py), never changed here.

The list leaves the documents' ``Configure`` out (a document may be 512 KiB) and is
bounded; one document is read whole when a page opens it.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from dlrover_events.domain.units import human_bytes

#: Documents listed at most (the page says how many there are).
MAX_LISTED = 500


async def list_documents(pool: asyncpg.Pool, limit: int = MAX_LISTED) -> dict[str, Any]:
    rows = await pool.fetch(
        "SELECT name, version, updated_at, document->'Include' AS include,"
        " document->'Exclude' AS exclude, document->'priority' AS priority,"
        " octet_length(document->>'Configure') AS configure_bytes,"
        " count(*) OVER () AS total"
        " FROM configs WHERE NOT deleted ORDER BY name LIMIT $1",
        limit,
    )
    return {
        "total": rows[0]["total"] if rows else 0,
        "documents": [
            {
                "name": r["name"],
                "version": r["version"],
                "updated_at": r["updated_at"].isoformat(),
                "include": r["include"] or {},
                "exclude": r["exclude"] or {},
                "priority": r["priority"] or 0,
                "configure_bytes": r["configure_bytes"] or 0,
                "configure_size": human_bytes(r["configure_bytes"] or 0),
            }
            for r in rows
        ],
    }


async def get_document(pool: asyncpg.Pool, name: str) -> dict[str, Any] | None:
    row = await pool.fetchrow(
        "SELECT version, updated_at, document FROM configs WHERE name = $1 AND NOT deleted",
        name,
    )
    if row is None:
        return None
    return {"version": row["version"], "document": row["document"]}


__all__ = ["MAX_LISTED", "get_document", "list_documents"]
