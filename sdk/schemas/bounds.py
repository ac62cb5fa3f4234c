"""Bounds on every count, size and number that comes from input, enforced at the contract.

A value a producer may send must be one every consumer can hold, compute with and store:
an event that breaks a bound goes to the dead-letter queue with the bound in its reason,
instead of stopping a consumer later and for good (a memory of 10^30 bytes the brain
could not encode into a plan, a replica count it built one object per replica for, a
NUL that Postgres text and jsonb cannot store, an infinity written to a checkpoint as
null). The numbers are generous for any real cluster; what matters is that they exist.

This module imports nothing of the project: the contract is `schemas` alone.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, Field

#: Replicas of one role (a job's spec, a plan's count, the job's min and max).
MAX_REPLICAS = 10_000
#: Nodes in one runtime sample, nodes and parts named in one plan.
MAX_NODES = 10_000
#: A node's index within its role.
MAX_NODE_ID = 2**31 - 1
#: Roles of one job.
MAX_ROLES = 64
#: Bytes of memory (host or GPU, per node or per GPU): 2^48 (256 TiB). Exact as a
#: double (every JSON reader holds it), and replicas x bytes stays within int64.
MAX_BYTES = 2**48
#: CPU cores of one node.
MAX_CPU = 1_000_000.0
#: GPUs of one node.
MAX_GPUS = 1_024
#: Steps and samples per second, seconds per step: finite, and far from overflowing
#: when multiplied by a replica count.
MAX_RATE = 1e12
#: Any other integer: what int64 columns and every JSON encoder (orjson) hold.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Entries in a job's labels.
MAX_LABELS = 256
#: Characters of a label's key and of its value.
MAX_LABEL_CHARS = 1_024
#: Values (scalars, lists, objects, keys) in one free-form document (a job's config, a
#: plan's training knobs, an env's settings), and how deep it may nest.
MAX_DOCUMENT_VALUES = 10_000
MAX_DOCUMENT_DEPTH = 32
#: Bytes of one event on the bus.
MAX_EVENT_BYTES = 1024 * 1024
#: Bytes of one config document as JSON: its change event (the document and an
#: envelope) must stay within an event's bound.
MAX_CONFIG_DOCUMENT_BYTES = 512 * 1024

NUL_REASON = "must not contain NUL (\\u0000): Postgres text and jsonb cannot store it"


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError(NUL_REASON)
    return value


#: A string any consumer can store.
Text = Annotated[str, AfterValidator(_no_nul)]
#: Counts and sizes.
Replicas = Annotated[int, Field(ge=0, le=MAX_REPLICAS)]
Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]
Cpu = Annotated[float, Field(ge=0, le=MAX_CPU, allow_inf_nan=False)]
Gpus = Annotated[int, Field(ge=0, le=MAX_GPUS)]
NodeId = Annotated[int, Field(ge=0, le=MAX_NODE_ID)]
Rate = Annotated[float, Field(ge=0, le=MAX_RATE, allow_inf_nan=False)]
Steps = Annotated[int, Field(ge=0, le=INT64_MAX)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]


def json_problem(
    value: Any,
    *,
    max_depth: int = MAX_DOCUMENT_DEPTH,
    max_values: int = MAX_DOCUMENT_VALUES,
) -> str | None:
    """What makes a parsed JSON value one that a consumer cannot encode or store, or
    None: more than ``max_values`` values, nesting deeper than ``max_depth``, a NUL in a
    string or key, a number that is not finite, an integer beyond int64.

    Iterative, so a value nested a thousand deep (orjson parses up to 1,024 levels but
    encodes only 254, and Python recursion stops at about 1,000) gets this answer, not
    a RecursionError."""
    seen = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > max_values:
            return f"holds more than {max_values} values"
        if isinstance(item, str):
            if "\x00" in item:
                return NUL_REASON
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not INT64_MIN <= item <= INT64_MAX:
                return f"integer {item} is beyond int64 [{INT64_MIN}, {INT64_MAX}]"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"number {item} is not finite"
        elif isinstance(item, dict | list):
            if depth > max_depth:
                return f"nests deeper than {max_depth}"
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str) and "\x00" in key:
                        return NUL_REASON
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
    return None


def _check_document(doc: dict[str, Any]) -> dict[str, Any]:
    """A free-form JSON object every consumer can encode and store: strings without NUL,
    finite numbers, integers within int64, bounded in size and depth."""
    problem = json_problem(doc)
    if problem is not None:
        raise ValueError(problem)
    return doc


#: A free-form JSON object (a job's config, training knobs, settings), bounded.
Document = Annotated[dict[str, Any], AfterValidator(_check_document)]
#: A job's labels.
Labels = Annotated[
    dict[
        Annotated[Text, Field(max_length=MAX_LABEL_CHARS)],
        Annotated[Text, Field(max_length=MAX_LABEL_CHARS)],
    ],
    Field(max_length=MAX_LABELS),
]

#: A batch size in a job's batch limits (initial, maximum, local min/max), in samples:
#: 2^40. A local batch times a replica count (at most 10,000 < 2^14) stays below 2^54,
#: exact as a double, so every JSON reader and the brain's float arithmetic hold it.
MAX_BATCH_SIZE = 2**40
#: Gradient statistics (a squared norm, a variance's trace): finite and at most 1e100.
#: Squares of float32 gradients summed over any real model stay far below it, and a
#: product of two of them times a batch size stays finite as a double.
MAX_GRAD_STAT = 1e100

#: A batch size within the contract's bound.
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]


def _grad_stat_bounded(value: float) -> float:
    # pydantic's own `le` would write the bound as a 101-digit integer in the reason
    if value > MAX_GRAD_STAT:
        raise ValueError(f"must be at most {MAX_GRAD_STAT:g} (a gradient statistic)")
    return value


#: A gradient statistic within the contract's bound (the schema shows it as `maximum`).
GradStat = Annotated[
    float,
    Field(ge=0, allow_inf_nan=False, json_schema_extra={"maximum": MAX_GRAD_STAT}),
    AfterValidator(_grad_stat_bounded),
]
