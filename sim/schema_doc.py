"""Markdown reference of the scenario schema, generated from the pydantic field docs.

``python -m sim schema --markdown`` prints it; the README embeds the same text and a test
checks they agree, so the field reference cannot drift from the code.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from sim import config
from sim.config.policy_base import CUDAGraphsConfig

SECTIONS: list[tuple[str, Any]] = [
    ("Top level", config.Scenario),
    ("`memory`", config.MemoryConfig),
    ("`cost`", config.CostConfig),
    ("`workload`", config.Workload),
    ("`workload.arrival` (by `kind`)", config.Arrival),
    ("`workload.arrival.phases[]` (`kind: schedule`)", config.SchedulePhase),
    ("`workload.prompt_tokens` / `workload.output_tokens` (by `kind`)", config.Length),
    ("`workload.shared_prefix`", config.SharedPrefix),
    ("`workload.sessions`", config.Sessions),
    ("`policies[]` (by `kind`)", config.PolicyConfig),
    ("`policies[].engine_cpu`", config.EngineCPUConfig),
    ("`policies[].all_reduce`", config.AllReduceConfig),
    ("`policies[].speculative`", config.SpeculativeConfig),
    ("`policies[].cuda_graphs`", CUDAGraphsConfig),
    ("`policies[].speculative.acceptance_rate` as a distribution (by `kind`)", config.AcceptanceDistribution),
    ("`frontend`", config.FrontendConfig),
    ("`client`", config.ClientConfig),
    ("`admission`", config.AdmissionConfig),
    ("`slo`", config.SLOConfig),
    ("`metrics`", config.MetricsConfig),
    ("`engine`", config.EngineConfig),
    ("`disaggregation`", config.DisaggregationConfig),
    ("`disaggregation.prefill` / `disaggregation.decode`", config.PoolConfig),
    ("`disaggregation.link`", config.LinkConfig),
]
"""Each block of the scenario file and its model(s); a test checks that every model reachable from
``Scenario`` is here, so a new block cannot be left out of the reference."""


def schema_markdown() -> str:
    """The scenario field reference as Markdown tables, one per config block."""
    parts = []
    for title, target in SECTIONS:
        parts.append(f"#### {title}\n")
        for model in _models(target):
            parts.append(_table(model, with_kind=len(_models(target)) > 1))
    return "\n".join(parts)


def documented_models() -> list[type[BaseModel]]:
    """Every model the reference has a table for."""
    return [model for _, target in SECTIONS for model in _models(target)]


def _models(target: Any) -> list[type[BaseModel]]:
    if isinstance(target, type) and issubclass(target, BaseModel):
        return [target]
    inner = typing.get_args(target)[0]
    return list(typing.get_args(inner))


def _table(model: type[BaseModel], *, with_kind: bool) -> str:
    lines = []
    if with_kind:
        kind = model.model_fields["kind"].default
        lines.append(f"`kind: {kind}` — {(model.__doc__ or '').strip()}\n")
    lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if name == "kind" and with_kind:
            continue
        lines.append(f"| `{name}` | {_type_name(field.annotation)} | {_default(field)} | {field.description or ''} |")
    return "\n".join(lines) + "\n"


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    if field.default_factory is not None or isinstance(field.default, BaseModel):
        return "defaults"
    return f"`{field.default}`" if field.default is not None else "none"


def _type_name(annotation: Any) -> str:
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is dict:
        return f"mapping of {_type_name(args[1])}"
    if args:
        names = [_type_name(a) for a in args if a is not type(None)]
        text = " \\| ".join(dict.fromkeys(names))
        return f"list of {text}" if origin is list else text
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))
