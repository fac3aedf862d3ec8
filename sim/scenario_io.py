"""Reading scenarios from YAML, dotted-path overrides, and readable validation errors.

``load_scenario`` and ``Scenario.replace`` share one path: dict -> overrides ->
``Scenario.model_validate``; every pydantic error becomes one :class:`UserError` naming
the field path, the value and what is allowed (with a "did you mean" for typos).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from sim.config import Scenario
from sim.errors import UserError, did_you_mean

_SEGMENT = re.compile(r"([^.\[\]]+)|\[([^\]]+)\]")


def load_scenario(path: str | Path, overrides: dict[str, Any] | None = None) -> Scenario:
    """Read, override and validate a scenario YAML file.

    Args:
        path: the YAML file.
        overrides: dotted-path overrides applied before validation, e.g.
            ``{"workload.arrival.rate": 4}``.

    Raises:
        UserError: the file is missing, not YAML, or fails validation.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"scenario file not found: {path}")
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
    data = _deep_copy(raw)
    for dotted, value in (overrides or {}).items():
        _set_path(data, dotted, value)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise UserError(format_validation_error(exc)) from None


def apply_overrides(scenario: Scenario, overrides: dict[str, Any]) -> Scenario:
    """A validated copy of ``scenario`` with dotted-path overrides applied."""
    new = scenario_from_dict(scenario_to_dict(scenario), overrides)
    new._base_dir = scenario.base_dir
    return new


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


# --------------------------------------------------------------------------- dotted paths
def split_path(dotted: str) -> list[str | int]:
    """``'policies[continuous].max_batch_size'`` -> ``['policies', 'continuous', 'max_batch_size']``.

    Bracketed integers become list indices; other bracketed text selects a list item by ``name``.
    """
    parts: list[str | int] = []
    for plain, bracket in _SEGMENT.findall(dotted):
        if bracket:
            parts.append(int(bracket) if bracket.lstrip("-").isdigit() else f"[{bracket}]")
        else:
            parts.append(plain)
    if not parts:
        raise UserError(f"empty override path '{dotted}'")
    return parts


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = split_path(dotted)
    node: Any = data
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = dotted if last else ".".join(map(str, parts[: depth + 1]))
        if isinstance(node, list):
            index = _list_index(node, part, dotted)
            if last:
                node[index] = value
                return
            node = node[index]
        elif isinstance(node, dict):
            key = str(part)
            if last:
                node[key] = value
                return
            node = node.setdefault(key, {})
        else:
            raise UserError(f"cannot set '{dotted}': '{where}' is not a mapping or list")


def _list_index(items: list[Any], part: str | int, dotted: str) -> int:
    if isinstance(part, int):
        if -len(items) <= part < len(items):
            return part
        raise UserError(f"cannot set '{dotted}': index {part} out of range (list has {len(items)} items)")
    name = part.strip("[]")
    names = [item.get("name") for item in items if isinstance(item, dict)]
    if name in names:
        return names.index(name)
    raise UserError(
        f"cannot set '{dotted}': no item named '{name}'{did_you_mean(name, map(str, names))}; "
        f"names: {', '.join(map(str, names))}"
    )


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


# --------------------------------------------------------------------------- errors
def format_validation_error(exc: ValidationError, limit: int = 3) -> str:
    """Pydantic's errors as ONE line: ``invalid scenario: field.path = value: problem; ...``.

    Unknown keys (with their "did you mean") come first, and a "required field is missing"
    that such a typo explains (``rat:`` for ``rate:``) is left out: it is the same mistake.
    """
    errors = _explained_errors(exc.errors())
    lines = [_format_one(err) for err in errors[:limit]]
    more = len(errors) - limit
    text = "invalid scenario: " + "; ".join(lines)
    return text + (f" (and {more} more)" if more > 0 else "")


def _explained_errors(errors: list[Any]) -> list[Any]:
    typos = [err for err in errors if err["type"] == "extra_forbidden"]
    rest = [err for err in errors if err["type"] != "extra_forbidden"]
    hinted = set()
    for err in typos:
        loc, model = _clean_location(tuple(err["loc"]))
        allowed = sorted(model.model_fields) if model is not None else []
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        if close:
            hinted.add((*loc[:-1], close[0]))
    rest = [err for err in rest if not (err["type"] == "missing" and _clean_location(tuple(err["loc"]))[0] in hinted)]
    return typos + rest


def _format_one(err: Any) -> str:
    loc, model = _clean_location(tuple(err["loc"]))
    path = _join_loc(loc)
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        allowed = sorted(model.model_fields) if model is not None else []
        return (
            f"{path}: unknown key '{key}'{did_you_mean(key, allowed)}; "
            f"allowed keys here: {', '.join(allowed)}"
        )
    if kind == "missing":
        return f"{path}: required field is missing"
    if kind == "union_tag_invalid":
        tag = str(err.get("ctx", {}).get("tag", err.get("input")))
        expected = str(err.get("ctx", {}).get("expected_tags", ""))
        options = [t.strip(" '") for t in expected.split(",")]
        return f"{path}.kind = '{tag}': unknown kind{did_you_mean(tag, options)}; allowed: {expected}"
    if kind == "union_tag_not_found":
        return f"{path}: needs a 'kind' key to say which variant it is"
    value = err.get("input")
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    message = err["msg"].replace("Value error, ", "").replace("Input should be", "must be")
    return f"{path} = {shown}: {message}"


def _clean_location(loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], type[BaseModel] | None]:
    """Drop pydantic's union-tag segments from ``loc``; return it and the model owning its last key."""
    cleaned: list[Any] = []
    model: type[BaseModel] | None = Scenario
    owner: type[BaseModel] | None = Scenario
    for part in loc:
        if isinstance(part, int):
            cleaned.append(part)
            continue
        if model is not None and part not in model.model_fields:
            variant = _variant_by_tag(model, cleaned, part)
            if variant is not None:
                model = variant
                continue
        cleaned.append(part)
        owner = model
        model = _field_model(model, part) if model is not None else None
    return tuple(cleaned), owner


def _variant_by_tag(model: type[BaseModel], path: list[Any], tag: str) -> type[BaseModel] | None:
    for candidate in _models_in(model):
        kind = candidate.model_fields.get("kind")
        if kind is not None and kind.default == tag:
            return candidate
    return None


def _field_model(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    field = model.model_fields.get(name)
    if field is None:
        return None
    candidates = _models_in(field.annotation)
    return candidates[0] if len(candidates) == 1 else _Union(candidates) if candidates else None  # type: ignore[return-value]


class _Union:
    """Stand-in for a union of models while walking an error location."""

    def __init__(self, members: list[type[BaseModel]]) -> None:
        self.members = members
        self.model_fields: dict[str, Any] = {}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, _Union):
        return annotation.members
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in get_args(annotation):
        found.extend(_models_in(arg))
    if get_origin(annotation) is None and not found:
        return []
    return found


def _join_loc(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "scenario"
