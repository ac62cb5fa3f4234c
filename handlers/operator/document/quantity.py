"""Resource quantities ("500m", "16Gi": the grammar of Kubernetes, which a TrainingJob's
resources are written in on every platform) <-> the port's numbers (``Resources``:
millicores, bytes, GPUs).

Plans carry floats and byte counts; a TrainingJob, a pod and a PyTorchJob's template carry
quantities. Comparing a pod's resources with what a plan asked for must not depend on how
either was spelled, so they are read into one normal form at the edge, and only written
back as quantities where a document or the API server wants them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from handlers.operator.platform.bodies import Resources

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


def resources_from_spec(spec: Mapping[str, Any] | None) -> Resources:
    """From a TrainingJob role's form: ``{cpu, memory, nvidia.com/gpu, gpuType}``."""
    spec = spec or {}
    cpu, memory, gpu = spec.get("cpu"), spec.get("memory"), spec.get(GPU)
    gpu_type = spec.get(GPU_TYPE)
    if gpu_type is not None and not isinstance(gpu_type, str):
        raise QuantityError(f"{GPU_TYPE} must be a string, not {gpu_type!r}")
    return Resources(
        cpu_milli=None if cpu is None else int(parse_quantity(cpu) * 1000),
        memory=None if memory is None else int(parse_quantity(memory)),
        gpu=None if gpu is None else int(parse_quantity(gpu)),
        gpu_type=gpu_type or None,
    )


def resources_from_container(container: Mapping[str, Any]) -> Resources:
    """A container's limits (requests where no limit is set): what the OOM killer uses."""
    res = container.get("resources") or {}
    merged = {**(res.get("requests") or {}), **(res.get("limits") or {})}
    return resources_from_spec(merged)


def resources_to_spec(resources: Resources) -> dict[str, Any]:
    """A TrainingJob role's form (whole cores as integers, bytes as integers)."""
    out: dict[str, Any] = {}
    if resources.cpu_milli is not None:
        out["cpu"] = format_cpu(resources.cpu_milli / 1000)
    if resources.memory is not None:
        out["memory"] = resources.memory
    if resources.gpu is not None:
        out[GPU] = resources.gpu
    if resources.gpu_type is not None:
        out[GPU_TYPE] = resources.gpu_type
    return out


def resources_to_quantities(resources: Resources) -> dict[str, str]:
    """requests/limits of a container: strings, as the core API wants them (the GPU type
    is no container resource)."""
    return {k: str(v) for k, v in resources_to_spec(resources).items() if k != GPU_TYPE}


__all__ = [
    "GPU",
    "GPU_TYPE",
    "QuantityError",
    "format_cpu",
    "parse_quantity",
    "resources_from_container",
    "resources_from_spec",
    "resources_to_quantities",
    "resources_to_spec",
]
