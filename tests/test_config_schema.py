"""Scenario schema: every shipped file validates; each class of mistake names its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from sim.config import Scenario
from sim.config.overrides import split_path
from sim.errors import UserError
from sim.io.scenario import load_scenario, parse_set_options, scenario_from_dict, scenario_to_dict

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(REPO.glob("scenarios/**/*.yaml"))

BASE = {
    "name": "t",
    "workload": {
        "requests": 10,
        "arrival": {"kind": "poisson", "rate": 1.0},
        "prompt_tokens": {"kind": "fixed", "value": 10},
        "output_tokens": {"kind": "uniform", "low": 5, "high": 9},
    },
    "policies": [
        {"name": "s", "kind": "static", "max_batch_size": 4},
        {"name": "c", "kind": "continuous", "max_batch_size": 4},
    ],
}


def test_there_are_shipped_scenarios() -> None:
    names = {p.stem for p in SHIPPED}
    assert {"quickstart", "overload", "splitwise_conv", "short", "medium", "long", "mixed"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_scenario_validates(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.base_dir == str(path.parent.resolve())
    # Round trip: the fully-defaulted dump validates back to an equal scenario.
    assert scenario_to_dict(scenario_from_dict(scenario_to_dict(scenario))) == scenario_to_dict(scenario)


@pytest.mark.parametrize(
    ("override", "must_mention"),
    [
        ({"workload.arrival.rat": 2}, ["workload.arrival.rat", "did you mean 'rate'"]),
        ({"workload.arrival.rate": -1}, ["workload.arrival.rate", "-1", "greater than or equal to"]),
        ({"workload.arrival.kind": "poison"}, ["workload.arrival.kind", "poison", "did you mean 'poisson'"]),
        ({"policies[s].max_batch_size": "many"}, ["policies[0].max_batch_size", "'many'", "integer"]),
        ({"policies[c].kind": "orca"}, ["policies[1].kind", "orca", "continuous"]),
        ({"memory.gpu_memory_utilization": 1.5}, ["memory.gpu_memory_utilization", "1.5", "less than or equal to 1"]),
        ({"workload.output_tokens.low": 50}, ["workload.output_tokens", "high (9) must be >= low (50)"]),
        ({"router": "fastest"}, ["router", "fastest", "round_robin"]),
        ({"polices": []}, ["polices", "did you mean 'policies'"]),
    ],
)
def test_bad_input_names_field_and_value(override: dict, must_mention: list[str]) -> None:
    with pytest.raises(UserError) as info:
        scenario_from_dict(BASE, override)
    message = str(info.value)
    for fragment in must_mention:
        assert fragment in message, f"{fragment!r} missing from: {message}"


def test_duplicate_policy_names_rejected() -> None:
    with pytest.raises(UserError, match="unique.*s"):
        scenario_from_dict(BASE, {"policies[c].name": "s"})


def test_lengths_required_unless_trace() -> None:
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    del raw["workload"]["prompt_tokens"]
    with pytest.raises(UserError, match="prompt_tokens is required"):
        scenario_from_dict(raw)
    raw["workload"]["arrival"] = {"kind": "trace", "path": "x.csv"}
    assert scenario_from_dict(raw).workload.prompt_tokens is None


def test_overrides_by_name_index_and_new_key() -> None:
    s = scenario_from_dict(BASE, {"policies[c].max_batch_size": 32, "policies[0].max_wait_s": 0.5, "seed": 9})
    assert s.policy("c").max_batch_size == 32
    assert s.policy("s").max_wait_s == 0.5
    assert s.seed == 9
    # The original is untouched (frozen, copied).
    assert scenario_from_dict(BASE).policy("c").max_batch_size == 4


def test_replace_keeps_base_dir_and_validates() -> None:
    s = load_scenario(REPO / "scenarios" / "quickstart.yaml")
    t = s.replace(**{"workload.arrival.rate": 4.0})
    assert t.workload.arrival.rate == 4.0 and s.workload.arrival.rate != 4.0
    assert t.base_dir == s.base_dir
    with pytest.raises(UserError, match="workload.arrival.rate"):
        s.replace(**{"workload.arrival.rate": 0})


def test_override_of_unknown_policy_name_suggests() -> None:
    with pytest.raises(UserError, match="no item named 'continous'.*did you mean 'c'|no item named 'continous'"):
        scenario_from_dict(BASE, {"policies[continous].max_batch_size": 2})


def test_set_option_parsing() -> None:
    parsed = parse_set_options(["workload.arrival.rate=4", "cost.cpu_overhead=false", "name=abc", "x.y=1.5"])
    assert parsed == {"workload.arrival.rate": 4, "cost.cpu_overhead": False, "name": "abc", "x.y": 1.5}
    with pytest.raises(UserError, match="path=value"):
        parse_set_options(["workload.arrival.rate"])
    assert split_path("policies[vllm].max_batch_size") == ["policies", "[vllm]", "max_batch_size"]
    assert split_path("policies[2].chunk_size") == ["policies", 2, "chunk_size"]


def test_config_is_frozen() -> None:
    s = scenario_from_dict(BASE)
    with pytest.raises(ValidationError, match="frozen"):
        s.seed = 3  # type: ignore[misc]


def test_json_schema_documents_every_field() -> None:
    schema = Scenario.model_json_schema()
    assert set(schema["required"]) == {"name", "workload", "policies"}
    undocumented = [name for name, prop in schema["properties"].items() if "description" not in prop]
    assert undocumented == []
    json.dumps(schema)  # serialisable for editors


def _nested_models(model: type, seen: set[type]) -> set[type]:
    """Every pydantic model reachable from ``model``'s fields (through unions, lists, Annotated)."""
    import typing

    from pydantic import BaseModel

    def walk(annotation: object) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation not in seen:
                seen.add(annotation)
                for field in annotation.model_fields.values():
                    walk(field.annotation)
            return
        for arg in typing.get_args(annotation):
            walk(arg)

    walk(model)
    return seen


def test_markdown_reference_has_a_table_for_every_block_of_the_schema() -> None:
    """A block added to the schema (a new nested model) without a section in sim.schema_doc fails here,
    as disaggregation, workload.shared_prefix, workload.sessions, schedule phases and engine once did."""
    from sim.schema_doc import SECTIONS, documented_models, schema_markdown

    reachable = _nested_models(Scenario, set())
    missing = sorted(m.__name__ for m in reachable - set(documented_models()))
    assert missing == []
    markdown = schema_markdown()
    for model in reachable:  # each field of each block has its row
        for name in model.model_fields:
            if name != "kind":
                assert f"| `{name}` |" in markdown, (model.__name__, name)
    assert len({title for title, _ in SECTIONS}) == len(SECTIONS)
