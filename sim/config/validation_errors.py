"""Pydantic validation errors as one readable line naming the field, the value and what is allowed."""

from __future__ import annotations

import difflib
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from sim.errors import did_you_mean


def format_validation_error(exc: ValidationError, root: type[BaseModel], limit: int = 3) -> str:
    """Pydantic's errors as ONE line: ``invalid scenario: field.path = value: problem; ...``.

    Unknown keys (with their "did you mean") come first, and a "required field is missing"
    that such a typo explains (``rat:`` for ``rate:``) is left out: it is the same mistake.
    """
    errors = _explained_errors(exc.errors(), root)
    lines = [_format_one(err, root) for err in errors[:limit]]
    more = len(errors) - limit
    text = "invalid scenario: " + "; ".join(lines)
    return text + (f" (and {more} more)" if more > 0 else "")


def _explained_errors(errors: list[Any], root: type[BaseModel]) -> list[Any]:
    typos = [err for err in errors if err["type"] == "extra_forbidden"]
    rest = [err for err in errors if err["type"] != "extra_forbidden"]
    hinted = set()
    for err in typos:
        loc, model = _clean_location(tuple(err["loc"]), root)
        allowed = sorted(model.model_fields) if model is not None else []
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        if close:
            hinted.add((*loc[:-1], close[0]))
    def explained(err: Any) -> bool:
        return err["type"] == "missing" and _clean_location(tuple(err["loc"]), root)[0] in hinted

    rest = [err for err in rest if not explained(err)]
    return typos + rest


def _format_one(err: Any, root: type[BaseModel]) -> str:
    loc, model = _clean_location(tuple(err["loc"]), root)
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
    if not loc:  # a whole-scenario check (sim.config.compat): its message names its fields itself
        return message
    return f"{path} = {shown}: {message}"


def _clean_location(loc: tuple[Any, ...], root: type[BaseModel]) -> tuple[tuple[Any, ...], type[BaseModel] | None]:
    """Drop pydantic's union-tag segments from ``loc``; return it and the model owning its last key."""
    cleaned: list[Any] = []
    model: type[BaseModel] | None = root
    owner: type[BaseModel] | None = root
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
