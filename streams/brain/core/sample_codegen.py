"""The runtime sample's msgspec structs, written from its one declaration.

`schemas.jobs.RuntimeSample` declares the runtime sample: its fields, bounds and checks.
The brain reads samples, nearly all of its input, into msgspec structs instead (see
`streams.brain.core.samples`), and those structs must take exactly what the contract
takes. So they are not declared a second time by hand: `render()` writes them from the
pydantic models into `streams/brain/core/sample_structs.py`, and a test fails while that
file differs from what the models give. After changing the contract:

    .venv/bin/python -m streams.brain.core.sample_codegen > streams/brain/core/sample_structs.py

The translation knows these forms, and refuses anything else with the field's name (a
field the fast read could not hold exactly fails at once, instead of reading otherwise):
int, float, str, bool, None, Literal, `X | None`, a nested model (its struct), `list[X]`
(a tuple), `dict[K, V]`; the bounds ge, gt, le, lt, min_length, max_length, pattern; a
`uuid.UUID` as its canonical text (what `str(UUID)` gives: the same id either way); an
aware datetime as text (parsed after the read by pydantic's own parser); and the
validators in `FIELD_VALIDATORS` and `MODEL_VALIDATORS`, each with what stands for it.
A default the model makes per instance (a new uuid, the time now) is required here: the
fast read leaves such events to pydantic rather than invent a value.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args, get_origin

import annotated_types as at
from pydantic import AfterValidator, AwareDatetime, BaseModel
from pydantic.fields import FieldInfo
from pydantic.types import AllowInfNan

from schemas.bounds import MAX_GRAD_STAT
from schemas.jobs import JobEvent, JobMeta, NodeUsage, RuntimeSample

#: what `str(uuid.UUID(...))` gives: such an id reads the same as text and as a UUID
CANONICAL_UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z"


class CodegenError(ValueError):
    """The contract has something the structs cannot state exactly."""


@dataclass(frozen=True)
class Name:
    """A name the generated module defines or imports, rendered as itself."""

    text: str

    def __repr__(self) -> str:
        return self.text


#: Field validators of the contract (by module and qualified name), and the bounds that
#: stand for each in a struct. `_no_nul` needs none: `read_sample` refuses every NUL (and
#: escaped NUL) before decoding, in any string.
FIELD_VALIDATORS: Mapping[str, Mapping[str, object]] = {
    "schemas.bounds._no_nul": {},
    "schemas.envelope._check_env": {"pattern": Name("ENV_NAME_PATTERN")},
    "schemas.bounds._grad_stat_bounded": {"le": MAX_GRAD_STAT},
}

#: Model validators ("after") of the contract, and the check a struct makes for each in
#: its `__post_init__` (msgspec makes a ValueError there a validation error).
MODEL_VALIDATORS: Mapping[str, tuple[str, ...]] = {
    "schemas.jobs.JobEvent._key_is_job": (
        "if self.key is not None and self.key != self.job.uuid:",
        '    raise ValueError("key must be the job\'s uuid")',
    ),
    "schemas.jobs.RuntimeSample._grad_stats_paired": (
        "if (self.grad_sqr is None) != (self.grad_var is None):",
        '    raise ValueError("grad_sqr and grad_var come together")',
    ),
}

#: Bounds in the order a Meta states them.
_BOUNDS = ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern")
#: Fields required here whatever the model's default: the discriminator, which the
#: contract's union of events needs to pick the model at all.
_ALWAYS_REQUIRED = frozenset({"type"})
_LINE = 99


@dataclass(frozen=True)
class StructSpec:
    """One struct to write: which model's fields, which of them, and how."""

    name: str
    model: type[BaseModel]
    doc: str
    fields: Callable[[type[BaseModel]], list[str]]
    base: str = "Struct"
    forbid_unknown: bool = True
    checks: bool = False


def _all(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def _own(model: type[BaseModel]) -> list[str]:
    return [n for n in model.model_fields if n not in JobEvent.model_fields]


def _envelope(model: type[BaseModel]) -> list[str]:
    return [n for n in model.model_fields if n in JobEvent.model_fields]


def structs(sample: type[RuntimeSample]) -> tuple[StructSpec, ...]:
    """The structs written for the runtime sample model `sample`, in order."""
    return (
        StructSpec("NodeUse", NodeUsage, "One node's use in a runtime sample: `NodeUsage`.", _all),
        StructSpec("JobRef", JobMeta, "The job a runtime sample is of: `JobMeta`.", _all),
        StructSpec(
            "SampleValues",
            sample,
            "A runtime sample's own fields: `RuntimeSample` less the envelope and the job.",
            _own,
            forbid_unknown=False,
        ),
        StructSpec(
            "SampleReport",
            sample,
            "A whole `job.runtime_sample` event as read off the bus: `RuntimeSample`.",
            _envelope,
            base="SampleValues",
            checks=True,
        ),
    )


@dataclass
class _Module:
    """What rendering collects besides the classes: aliases of element types."""

    structs: dict[type[BaseModel], str]
    aliases: list[str] = field(default_factory=list)


def _source(value: object) -> str:
    """`value` as source, in the house's style: strings in double quotes (raw where
    that keeps them readable)."""
    if isinstance(value, float):
        return repr(value).replace("e+", "e")  # 1e100, as the formatter writes it
    if not isinstance(value, str):
        return repr(value)
    if "\\" in value and '"' not in value and not value.endswith("\\"):
        return f'r"{value}"'
    text = repr(value)
    if text.startswith("'") and '"' not in value:
        return f'"{text[1:-1]}"'
    return text


def _qualified(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def _flatten(metadata: list[Any], where: str) -> dict[str, object]:
    """The bounds that `metadata` (annotated_types, pydantic's FieldInfo and validators)
    states, or a CodegenError for anything else."""
    bounds: dict[str, object] = {}
    for item in metadata:
        if isinstance(item, FieldInfo):
            bounds.update(_flatten(list(item.metadata), where))
        elif isinstance(item, at.Ge | at.Gt | at.Le | at.Lt | at.MinLen | at.MaxLen):
            bounds.update((f.name, getattr(item, f.name)) for f in dataclasses.fields(item))
        elif isinstance(item, AfterValidator):
            name = _qualified(item.func)
            if name not in FIELD_VALIDATORS:
                raise CodegenError(f"{where}: validator {name} has no struct form")
            bounds.update(FIELD_VALIDATORS[name])
        elif isinstance(item, AllowInfNan) and not item.allow_inf_nan:
            pass  # a struct's float is bounded (below): it never holds an infinity
        elif type(item).__name__ == "_PydanticGeneralMetadata" and set(vars(item)) == {"pattern"}:
            bounds["pattern"] = vars(item)["pattern"]
        else:
            raise CodegenError(f"{where}: {item!r} has no struct form")
    return bounds


def _annotated(base: str, bounds: Mapping[str, object]) -> str:
    if not bounds:
        return base
    unknown = set(bounds) - set(_BOUNDS)
    if unknown:
        raise CodegenError(f"bounds {sorted(unknown)} have no struct form")
    args = ", ".join(f"{k}={_source(bounds[k])}" for k in _BOUNDS if k in bounds)
    return f"Annotated[{base}, Meta({args})]"


def _element(tp: Any, where: str, alias: str, module: _Module) -> str:
    """A container's element type: a bounded one under an alias of its own (its line
    stays short), a plain one as itself."""
    text = _type(tp, [], where, module)
    if not text.startswith("Annotated["):
        return text
    module.aliases.append(f"{alias} = {text}")
    return alias


def _type(tp: Any, metadata: list[Any], where: str, module: _Module) -> str:
    """`tp` with the bounds of `metadata`, as a struct field's annotation."""
    origin = get_origin(tp)
    if origin is Annotated:
        base, *more = get_args(tp)
        return _type(base, [*more, *metadata], where, module)
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1 or len(args) != 2:
            raise CodegenError(f"{where}: only `X | None` unions have a struct form")
        return f"{_type(rest[0], metadata, where, module)} | None"
    bounds = _flatten(metadata, where)
    if origin is Literal:
        if bounds:
            raise CodegenError(f"{where}: a bounded Literal has no struct form")
        return f"Literal[{', '.join(_source(v) for v in get_args(tp))}]"
    if origin is list:
        (item,) = get_args(tp)
        inner = _element(item, where, f"_{where.replace('.', '_')}_item", module)
        return _annotated(f"tuple[{inner}, ...]", bounds)
    if origin is dict:
        key, value = get_args(tp)
        alias = f"_{where.replace('.', '_')}"
        keys = _element(key, where, f"{alias}_key", module)
        values = _element(value, where, f"{alias}_value", module)
        return _annotated(f"dict[{keys}, {values}]", bounds)
    if origin is not None:
        raise CodegenError(f"{where}: {tp!r} has no struct form")
    if tp is uuid.UUID:
        if bounds:
            raise CodegenError(f"{where}: a bounded UUID has no struct form")
        return _annotated("str", {"pattern": Name("CANONICAL_UUID")})
    if tp is AwareDatetime:
        if bounds:
            raise CodegenError(f"{where}: a bounded datetime has no struct form")
        return "str"  # parsed by pydantic's own parser after the read
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if tp not in module.structs or bounds:
            raise CodegenError(f"{where}: model {tp.__name__} has no struct here")
        return module.structs[tp]
    if tp is float and not ({"le", "lt"} & set(bounds) and {"ge", "gt"} & set(bounds)):
        # pydantic refuses infinities; msgspec reads 1e400 as one unless bounded
        raise CodegenError(f"{where}: a float needs both bounds to have a struct form")
    if tp in (int, float, str, bool):
        return _annotated(tp.__name__, bounds)
    raise CodegenError(f"{where}: {tp!r} has no struct form")


def _default(info: FieldInfo, name: str) -> str | None:
    """The default's source, or None for a required field."""
    if info.is_required() or name in _ALWAYS_REQUIRED:
        return None
    if info.default_factory is not None:
        made = {list: "()", dict: "{}", tuple: "()"}
        return made.get(info.default_factory)  # type: ignore[call-overload]
    value = info.default
    if info.annotation is float and isinstance(value, int):
        value = float(value)  # a struct keeps a default as written: 0 would stay an int
    return _source(value)


def _line(text: str, where: str) -> str:
    if len(text) > _LINE:
        raise CodegenError(f"{where}: the line {text.strip()!r} is too long to write")
    return text


def _struct(spec: StructSpec, module: _Module) -> list[str]:
    options = "frozen=True, gc=False, kw_only=True"
    if spec.forbid_unknown:
        options += ", forbid_unknown_fields=True"
    head = f"class {spec.name}({spec.base}, {options}):"
    if len(head) > _LINE:
        head = f"class {spec.name}(\n    {spec.base}, {options}\n):"
    lines = [head, f'    """{spec.doc}"""', ""]
    for name in spec.fields(spec.model):
        info = spec.model.model_fields[name]
        where = f"{spec.name}.{name}"
        if info.alias not in (None, name):
            raise CodegenError(f"{where}: an alias has no struct form")
        annotation = _type(info.annotation, list(info.metadata), where, module)
        default = _default(info, name)
        text = f"    {name}: {annotation}" + ("" if default is None else f" = {default}")
        lines.append(_line(text, where))
    if spec.checks:
        lines += _checks(spec.model)
    return lines


def _checks(model: type[BaseModel]) -> list[str]:
    decorators = model.__pydantic_decorators__
    if decorators.field_validators or decorators.root_validators:
        raise CodegenError(f"{model.__name__}: field validators have no struct form")
    lines = ["", "    def __post_init__(self) -> None:"]
    for decorator in decorators.model_validators.values():
        name = _qualified(decorator.func)
        if name not in MODEL_VALIDATORS or decorator.info.mode != "after":
            raise CodegenError(f"{model.__name__}: validator {name} has no struct form")
        lines.append(f"        # {name}")
        lines += [f"        {text}" for text in MODEL_VALIDATORS[name]]
    return lines if len(lines) > 2 else []


def _unchecked(specs: tuple[StructSpec, ...]) -> None:
    """A model with validators that no struct checks (`StructSpec.checks`) would be read
    without them."""
    checked = {spec.model for spec in specs if spec.checks}
    for spec in specs:
        decorators = spec.model.__pydantic_decorators__
        if spec.model not in checked and (
            decorators.model_validators or decorators.field_validators
        ):
            model = spec.model.__name__
            raise CodegenError(f"{spec.name}: the validators of {model} are unchecked")


HEADER = '''"""The runtime sample's fields as msgspec structs, for the brain's fast read.

Written from `schemas.jobs.RuntimeSample` (with its `NodeUsage`, `JobMeta` and envelope)
by `streams/brain/core/sample_codegen.py`: do not edit. After changing the contract,
`.venv/bin/python -m streams.brain.core.sample_codegen > streams/brain/core/sample_structs.py`
(tests/unit/brain/core/test_sample_structs.py fails until then).
"""

from datetime import datetime
from typing import Annotated, Literal, TypeVar

from msgspec import Meta, Struct

from schemas.envelope import ENV_NAME_PATTERN

CANONICAL_UUID = {uuid}
'''


STORED = '''

class StoredSample(SampleValues, frozen=True, gc=False, kw_only=True):
    """What a job's state keeps of a runtime sample: its own fields, its id and time."""

    event_id: str
    at: datetime


_S = TypeVar("_S", bound=StoredSample)


def stored(cls: type[_S], of: SampleValues, event_id: str, at: datetime) -> _S:
    """A `cls` of the values of `of`, taken `at`, from the event `event_id` (a keyword
    per field: a tenth of the time a generic copy took, which cost more than the read)."""
    return cls(
        event_id=event_id,
        at=at,
{fields}
    )
'''


def render(sample: type[RuntimeSample] = RuntimeSample) -> str:
    """The source of `sample_structs.py` for the runtime sample model `sample` (another
    than the contract's: what a change of it would give)."""
    specs = structs(sample)
    module = _Module(structs={spec.model: spec.name for spec in specs if spec.fields is _all})
    classes: list[str] = []
    _unchecked(specs)
    for spec in specs:
        classes += ["", "", *_struct(spec, module)]
    aliases = [_line(a, a.split(" = ")[0]) for a in module.aliases]
    copied = "\n".join(f"        {name}=of.{name}," for name in _own(sample))
    parts = [
        HEADER.format(uuid=_source(CANONICAL_UUID)),
        *aliases,
        *classes,
        STORED.format(fields=copied),
    ]
    return "\n".join(parts).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
