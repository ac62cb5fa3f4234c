"""Model and optimizer state from one member of an in-place group to the others
(``dlrover_events.sdk.torch.inplace``): a newcomer, or every survivor after a lost peer,
takes the state by broadcast through the new process group instead of from a checkpoint
file. The structure travels pickled once, the tensors flat, one broadcast per dtype: a
state of thousands of tensors costs a few collectives, not thousands."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist


class StateSync:
    """A nested state (dicts, lists, tuples of tensors and plain values) from one rank to
    every rank of the group: its shape pickled once (``broadcast_object_list``), its
    tensors in one flat ``broadcast`` per dtype on the group's device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def broadcast(self, state: Any, src: int) -> Any:
        me = dist.get_rank()
        tensors: list[torch.Tensor] = []
        shape = _strip(state, tensors) if me == src else None
        box: list[Any] = [shape]
        dist.broadcast_object_list(box, src, device=self.device)
        shape = box[0]
        specs: list[tuple[int, torch.Size, torch.dtype, str]] = []
        _specs(shape, specs)
        out: dict[int, torch.Tensor] = {}
        by_dtype: dict[torch.dtype, list[tuple[int, torch.Size, torch.dtype, str]]] = {}
        for spec in specs:
            by_dtype.setdefault(spec[2], []).append(spec)
        for dtype, group in by_dtype.items():
            total = sum(int(torch.Size(s[1]).numel()) for s in group)
            if me == src:
                flat = torch.cat(
                    [tensors[s[0]].detach().reshape(-1).to(self.device) for s in group]
                )
            else:
                flat = torch.empty(total, dtype=dtype, device=self.device)
            dist.broadcast(flat, src)
            offset = 0
            for index, size, _, device_type in group:
                n = int(torch.Size(size).numel())
                t = flat[offset : offset + n].view(size).clone()
                out[index] = t.cpu() if device_type == "cpu" else t
                offset += n
        return _fill(shape, out)


class _TensorSpec:
    __slots__ = ("device_type", "dtype", "index", "size")

    def __init__(self, index: int, t: torch.Tensor) -> None:
        self.index = index
        self.size = tuple(t.shape)
        self.dtype = t.dtype
        self.device_type = t.device.type


def _strip(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorSpec(len(tensors) - 1, obj)
    if isinstance(obj, Mapping):
        return {k: _strip(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_strip(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_strip(v, tensors) for v in obj)
    return obj


def _specs(obj: Any, out: list[tuple[int, torch.Size, torch.dtype, str]]) -> None:
    if isinstance(obj, _TensorSpec):
        out.append((obj.index, torch.Size(obj.size), obj.dtype, obj.device_type))
    elif isinstance(obj, Mapping):
        for v in obj.values():
            _specs(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _specs(v, out)


def _fill(obj: Any, tensors: Mapping[int, torch.Tensor]) -> Any:
    if isinstance(obj, _TensorSpec):
        return tensors[obj.index]
    if isinstance(obj, Mapping):
        return {k: _fill(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_fill(v, tensors) for v in obj)
    return obj


__all__ = ["StateSync"]
