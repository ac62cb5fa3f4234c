"""Kubernetes resource quantities <-> the numbers ScalePlans speak (cores, bytes, GPUs).

Plans carry floats and byte counts; pods and the TrainingJob schema carry quantities
("500m", "16Gi"). Comparing a pod's resources with what a plan asked for must not depend
on how either was spelled, so everything is compared in one normal form: ``Resources``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from schemas.plans import NodeResource

GPU = "nvidia.com/gpu"
#: The resources key of a GPU type (a role's ``resources.gpuType``): not a quantity and not
#: a container resource; a pod gets it as a node selector (see trainingjob.pod_manifest).
GPU_TYPE = "gpuType"

_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?([a-zA-Z]*)$")


class QuantityError(ValueError):
    pass


def parse_quantity(value: Any) -> Decimal:
    """A quantity as a number of base units (cores, bytes, devices)."""
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        return Decimal(str(value))
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if match is None or match.group(3) not in _SUFFIX:
        raise QuantityError(f"not a quantity: {value!r}")
    number, exponent, suffix = match.groups()
    try:
        amount = Decimal(number + (exponent or ""))
    except InvalidOperation:
        raise QuantityError(f"not a quantity: {value!r}") from None
    return amount * _SUFFIX[suffix]


def format_cpu(cores: float) -> int | str:
    """Whole cores as an integer, anything finer in millicores (what kubectl shows)."""
    milli = round(Decimal(str(cores)) * 1000)
    return milli // 1000 if milli % 1000 == 0 else f"{milli}m"


@dataclass(frozen=True, slots=True)
class Resources:
    """One pod's resources in normal form; None = not set."""

    cpu_milli: int | None = None
    memory: int | None = None
    gpu: int | None = None
    gpu_type: str | None = None

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> Resources:
        """From the TrainingJob schema's form: ``{cpu, memory, nvidia.com/gpu, gpuType}``."""
        spec = spec or {}
        cpu, memory, gpu = spec.get("cpu"), spec.get("memory"), spec.get(GPU)
        gpu_type = spec.get(GPU_TYPE)
        if gpu_type is not None and not isinstance(gpu_type, str):
            raise QuantityError(f"{GPU_TYPE} must be a string, not {gpu_type!r}")
        return cls(
            cpu_milli=None if cpu is None else int(parse_quantity(cpu) * 1000),
            memory=None if memory is None else int(parse_quantity(memory)),
            gpu=None if gpu is None else int(parse_quantity(gpu)),
            gpu_type=gpu_type or None,
        )

    @classmethod
    def from_container(cls, container: dict[str, Any]) -> Resources:
        """A container's limits (requests where no limit is set): what the OOM killer uses."""
        res = container.get("resources") or {}
        merged = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        return cls.from_spec(merged)

    def to_spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.cpu_milli is not None:
            out["cpu"] = format_cpu(self.cpu_milli / 1000)
        if self.memory is not None:
            out["memory"] = self.memory
        if self.gpu is not None:
            out[GPU] = self.gpu
        if self.gpu_type is not None:
            out[GPU_TYPE] = self.gpu_type
        return out

    def to_quantities(self) -> dict[str, str]:
        """requests/limits of a container: strings, as the core API wants them (the GPU
        type is no container resource)."""
        return {k: str(v) for k, v in self.to_spec().items() if k != GPU_TYPE}

    def updated(self, change: NodeResource, *, gpu_type: bool = True) -> Resources:
        """``change`` on top; a plan's 0 (or "") means unchanged. ``gpu_type`` False: the
        platform cannot select a GPU type, so the plan's is not taken into the job."""
        return Resources(
            cpu_milli=round(change.cpu * 1000) if change.cpu else self.cpu_milli,
            memory=change.memory or self.memory,
            gpu=change.gpu_num or self.gpu,
            gpu_type=(change.gpu_type if gpu_type else "") or self.gpu_type,
        )

    def covers(self, wanted: Resources) -> bool:
        """Whether a pod with these resources is what ``wanted`` asks for (unset = any)."""
        return all(
            w is None or w == mine
            for w, mine in (
                (wanted.cpu_milli, self.cpu_milli),
                (wanted.memory, self.memory),
                (wanted.gpu, self.gpu),
                (wanted.gpu_type, self.gpu_type),
            )
        )


__all__ = ["GPU", "GPU_TYPE", "QuantityError", "Resources", "format_cpu", "parse_quantity"]
