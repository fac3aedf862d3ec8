"""Reading scenarios from YAML files and ``--set`` options.

``load_scenario`` and ``Scenario.replace`` share one path: dict -> dotted-path overrides
(:mod:`sim.config.overrides`) -> ``Scenario.from_data``; every pydantic error becomes one
:class:`UserError` naming the field path, the value and what is allowed
(:mod:`sim.config.validation_errors`, with a "did you mean" for typos).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sim.config import Scenario
from sim.config.overrides import with_overrides
from sim.errors import UserError
from sim.io.safe_paths import require_input_file

if TYPE_CHECKING:
    from sim.result import RunData


def load_scenario(path: str | Path, overrides: dict[str, Any] | None = None) -> Scenario:
    """Read, override and validate a scenario YAML file.

    Args:
        path: the YAML file.
        overrides: dotted-path overrides applied before validation, e.g.
            ``{"workload.arrival.rate": 4}``.

    Raises:
        UserError: the file is missing, not YAML, or fails validation.
    """
    path = require_input_file(path, "scenario file")  # a folder or a device is named as such, never read
    raw = parse_yaml(read_text_file(path), path)
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a scenario must be a YAML mapping, got {type(raw).__name__}")
    scenario = scenario_from_dict(raw, overrides)
    scenario._base_dir = str(path.resolve().parent)
    return scenario


def read_text_file(path: Path) -> str:
    """A text file's content as UTF-8 (a BOM is allowed); UserError naming the encoding problem otherwise."""
    data = path.read_bytes()
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise UserError(f"{path}: the file is UTF-16; save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UserError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}); save it as UTF-8"
        ) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate mapping keys (plain YAML keeps the last one silently)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key '{key}' (first at line {seen[key]})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line + 1
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def parse_yaml(text: str, path: Path | str = "<string>") -> Any:
    """Parse YAML text, refusing duplicate keys; UserError with the line on any problem."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise UserError(f"{path}: not valid YAML{where}: {problem}") from None


def scenario_from_dict(raw: dict[str, Any], overrides: dict[str, Any] | None = None) -> Scenario:
    """Validate a plain dict (as from YAML) into a Scenario, after applying overrides."""
    return Scenario.from_data(with_overrides(raw, overrides))


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """Plain-data form of a scenario (every default filled in); round-trips through validation."""
    return scenario.model_dump(mode="json")


def parse_set_options(items: list[str]) -> dict[str, Any]:
    """Parse CLI ``--set path=value`` strings; values are read as YAML scalars (4 -> int, true -> bool)."""
    overrides: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"--set expects path=value, got '{item}'")
        key, text = item.split("=", 1)
        try:
            overrides[key.strip()] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            overrides[key.strip()] = text
    return overrides


def resolved_yaml(result: RunData) -> str:
    """The scenario with every default filled in, plus seed, version and derived facts."""
    from sim.version import __version__

    document: dict[str, Any] = {
        "batchsim_version": __version__,
        "seed": result.seed,
        "derived": dict(result.facts),
        "scenario": scenario_to_dict(result.scenario),
    }
    return yaml.safe_dump(document, sort_keys=False)
