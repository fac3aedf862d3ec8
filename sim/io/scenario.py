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
from sim.errors import UserError, shown
from sim.io.safe_paths import require_input_file
from sim.io.yaml_reader import parse_option_value, parse_yaml, read_text_file

if TYPE_CHECKING:
    from sim.result import RunData


def load_scenario(path: str | Path, overrides: dict[str, Any] | None = None) -> Scenario:
    """Read, override and validate a scenario YAML file.

    Args:
        path: the YAML file.
        overrides: dotted-path overrides applied before validation, e.g.
            ``{"workload.arrival.rate": 4}``.

    Raises:
        UserError: the file is missing, larger than 1 MiB, not YAML, beyond the YAML budget (50,000 values
            once aliases are expanded, 64 levels deep; :mod:`sim.io.yaml_reader`), or fails validation.
    """
    path = require_input_file(path, "scenario file")  # a folder or a device is named as such, never read
    # Size and expanded-node budgets here, before the copy in with_overrides: nothing larger is ever copied.
    raw = parse_yaml(read_text_file(path, what="scenario"), path)
    if not isinstance(raw, dict):
        got = "an empty file" if raw is None else f"a {type(raw).__name__}"
        raise UserError(f"{path}: a scenario must be a YAML mapping (key: value lines), got {got}")
    base_dir = str(path.resolve().parent)
    scenario = scenario_from_dict(raw, overrides, base_dir=base_dir)
    scenario._base_dir = base_dir
    return scenario


def scenario_from_dict(
    raw: dict[str, Any], overrides: dict[str, Any] | None = None, *, base_dir: str | None = None
) -> Scenario:
    """Validate a plain dict (as from YAML) into a Scenario, after applying overrides; a relative
    ``calibration`` path is looked up in ``base_dir`` (the scenario file's folder) first."""
    data = with_overrides(raw, overrides)
    if isinstance(data.get("calibration"), str) and data["calibration"]:
        from sim.io.serving_calibration import resolve_calibration_path

        data = {**data, "calibration": resolve_calibration_path(data["calibration"], base_dir)}
    return Scenario.from_data(data)


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """Plain-data form of a scenario (every default filled in); round-trips through validation."""
    return scenario.model_dump(mode="json")


def parse_set_options(items: list[str]) -> dict[str, Any]:
    """Parse CLI ``--set path=value`` strings; values are read as YAML scalars (4 -> int, true -> bool)."""
    overrides: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"--set expects path=value, got {shown(item)}")
        key, text = item.split("=", 1)
        overrides[key.strip()] = parse_option_value(text, f"--set {key.strip()}")
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
