"""A checkpoint's files removed where its URL says they are, through fsspec: a directory
(``file://`` or a plain path), a shared filesystem, object storage (``s3://`` with s3fs).

A checkpoint is a folder (torch.distributed.checkpoint writes one file per rank and a
manifest) or, from older jobs, one file; either is removed whole. A URL whose files are
already gone counts as removed, so a deletion done again after a crash succeeds.
``options`` are fsspec's storage options by protocol (``{"s3": {"endpoint_url": ...}}``),
the env's way to reach its storage without credentials in the URL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import fsspec


class StorageError(Exception):
    """The storage refused or could not be reached: the deletion is tried again later."""


def _remove(url: str, options: Mapping[str, Mapping[str, Any]]) -> bool:
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    try:
        fs, path = fsspec.core.url_to_fs(url, **dict(options.get(protocol, {})))
        if not fs.exists(path):
            return False
        fs.rm(path, recursive=True)
        if hasattr(fs, "invalidate_cache"):
            fs.invalidate_cache(path)
        return True
    except Exception as err:  # s3fs, botocore, gcsfs: each its own errors
        raise StorageError(f"{url}: {type(err).__name__}: {err}") from err


async def remove(url: str, options: Mapping[str, Mapping[str, Any]]) -> bool:
    """Remove a checkpoint's files (off the event loop); True if there were any."""
    return await asyncio.to_thread(_remove, url, options)


__all__ = ["StorageError", "remove"]
