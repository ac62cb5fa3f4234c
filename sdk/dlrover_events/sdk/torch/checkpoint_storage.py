"""Where checkpoints lie: a local directory or any URL fsspec opens (``s3://`` through s3fs).

The checkpoint's decisions are in ``dlrover_events.sdk.checkpoint_manifest``; this is the
I/O under them: listing a job's checkpoints, a step's parts and their sizes, the manifest
written atomically (a temporary file renamed on a filesystem, one PUT on object storage),
and torch.distributed.checkpoint's writer and reader for a step's directory.

A local root is written with plain files and fsync; a URL with fsspec, whose options
come from the caller (``storage_options``) or fsspec's own environment variables
(``FSSPEC_S3_ENDPOINT_URL``, AWS's credentials), as for any fsspec client.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from functools import cache
from pathlib import Path
from typing import Any

from dlrover_events.sdk.checkpoint_manifest import MANIFEST


@cache
def _staged_writer(remote: bool) -> type[Any]:
    """DCP's writer of a directory (or of a URL: fsspec's), given a state the checkpoint
    already copied to host memory (``async_save`` would copy it again: a writer is its
    stager). Made at first use: DCP's import is seconds (see checkpoint._dcp)."""
    from torch.distributed.checkpoint import FileSystemWriter

    base: type[FileSystemWriter] = FileSystemWriter
    if remote:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        base = FsspecWriter

    class StagedWriter(base):  # type: ignore[valid-type,misc]
        def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
            return state_dict

    return StagedWriter


def is_url(root: str) -> bool:
    return "://" in root and not root.startswith("file://")


class Storage:
    """A job's checkpoint root: ``<root>/step-<n>/`` directories."""

    def __init__(self, root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None):
        text = os.fspath(root)
        self.remote = is_url(text)
        self.options = dict(storage_options or {})
        if self.remote:
            from fsspec.core import url_to_fs  # the `checkpoint` extra: fsspec (s3fs for s3)

            self.url = text.rstrip("/")
            self.fs, self._root = url_to_fs(self.url, **self.options)
        else:
            self.path = Path(text.removeprefix("file://")).absolute()
            self.url = str(self.path)

    def join(self, *names: str) -> str:
        return "/".join([self.url, *names])

    def _remote_path(self, *names: str) -> str:
        return "/".join([self._root.rstrip("/"), *names])

    # -- what is there ---------------------------------------------------------------------

    def is_legacy_file(self) -> bool:
        """A local root that is one file: the layout of format 1 (torch.save by rank 0)."""
        return not self.remote and self.path.is_file()

    def names(self) -> list[str]:
        """The entries under the root (none when it does not exist)."""
        if not self.remote:
            if not self.path.is_dir():
                return []
            return sorted(p.name for p in self.path.iterdir())
        try:
            self.fs.invalidate_cache(self._root)
            found = self.fs.ls(self._root, detail=False)
        except FileNotFoundError:
            return []
        return sorted(str(p).rstrip("/").rsplit("/", 1)[-1] for p in found)

    def sizes(self, name: str) -> dict[str, int]:
        """The files of a step's directory and their sizes (the manifest's too)."""
        if not self.remote:
            folder = self.path / name
            if not folder.is_dir():
                return {}
            return {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}
        where = self._remote_path(name)
        try:
            self.fs.invalidate_cache(where)
            found = self.fs.ls(where, detail=True)
        except FileNotFoundError:
            return {}
        return {
            str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
            for e in found
            if e.get("type") == "file"
        }

    def read(self, name: str, filename: str) -> bytes | None:
        if not self.remote:
            try:
                return (self.path / name / filename).read_bytes()
            except FileNotFoundError:
                return None
        try:
            data: bytes = self.fs.cat_file(self._remote_path(name, filename))
            return data
        except FileNotFoundError:
            return None

    # -- writing -------------------------------------------------------------------------------

    def write_manifest(self, name: str, data: bytes) -> None:
        """The commit: the manifest whole or not at all (renamed into place after an
        fsync; on object storage one PUT, which is never seen half-written)."""
        if self.remote:
            self.fs.pipe_file(self._remote_path(name, MANIFEST), data)
            return
        folder = self.path / name
        tmp = folder / f".{MANIFEST}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / MANIFEST)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a crash of the machine
        finally:
            os.close(fd)

    def remove(self, name: str) -> None:
        if not self.remote:
            shutil.rmtree(self.path / name, ignore_errors=True)
            return
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._remote_path(name), recursive=True)

    def writer(self, name: str) -> Any:
        """DCP's StorageWriter of a step's directory."""
        if not self.remote:
            return _staged_writer(False)(self.path / name, sync_files=True)
        # object storage has nothing to fsync: a part is there once its upload returned
        return _staged_writer(True)(self.join(name), sync_files=False, **self.options)

    def reader(self, name: str) -> Any:
        """DCP's StorageReader of a step's directory."""
        if not self.remote:
            from torch.distributed.checkpoint import FileSystemReader

            return FileSystemReader(self.path / name)
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(self.join(name), **self.options)


__all__ = ["Storage", "is_url"]
