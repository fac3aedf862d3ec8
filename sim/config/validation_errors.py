"""Pydantic validation errors as one readable line naming the field, the value and what is allowed.

Pydantic's error locations carry its own labels for the members of a union
(``function-before[_not_a_boolean(), float]``, ``tagged-union[...]``) and it reports a value
that fits no member once per member. Users see neither: a location keeps only field names,
list indices, variant kinds and the unknown key itself, and the per-member errors of one
value become one "must be a number or a mapping".
"""

from __future__ import annotations

import difflib
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from sim.errors import cut, did_you_mean, shown

_PLAIN_MESSAGES = {
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be text",
    "dict_type": "must be a mapping (key: value)",
    "model_type": "must be a mapping (key: value)",
    "model_attributes_type": "must be a mapping (key: value)",
    "list_type": "must be a list",
}
"""Pydantic error types whose own messages name Python types ("a valid dictionary or object to extract fields from")."""


def format_validation_error(exc: ValidationError, root: type[BaseModel], limit: int = 3) -> str:
    """Pydantic's errors as ONE line: ``invalid scenario: field.path = value: problem; ...``.

    Unknown keys (with their "did you mean") come first, and a "required field is missing"
    that such a typo explains (``rat:`` for ``rate:``) is left out: it is the same mistake.
    """
    errors = [dict(err, loc=_clean_location(tuple(err["loc"]), root, err["type"])) for err in exc.errors()]
    lines = _one_per_value(_explained_errors(_without_other_members(errors)))
    more = len(lines) - limit
    text = "invalid scenario: " + "; ".join(lines[:limit])
    return text + (f" (and {more} more)" if more > 0 else "")


def _explained_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    typos = [err for err in errors if err["type"] == "extra_forbidden"]
    hinted = set()
    for err in typos:
        path, owner = err["loc"]
        allowed = sorted(owner.model_fields) if owner is not None else []
        close = difflib.get_close_matches(str(path[-1]), allowed, n=1, cutoff=0.6)
        if close:
            hinted.add((*path[:-1], close[0]))
    rest = [err for err in errors if err["type"] != "extra_forbidden"]
    rest = [err for err in rest if not (err["type"] == "missing" and err["loc"][0] in hinted)]
    return typos + rest


def _without_other_members(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop "must be a number" at a path where the value got further as another union member.

    ``acceptance_rate: {kind: beta}`` fails as a float and as a mapping missing ``mean``: the
    user meant the mapping, so only its error is news.
    """

    def went_further(path: tuple[Any, ...]) -> bool:
        return any(err["type"] not in _PLAIN_MESSAGES and err["loc"][0][: len(path)] == path for err in errors)

    return [err for err in errors if err["type"] not in _PLAIN_MESSAGES or not went_further(err["loc"][0])]


def _one_per_value(errors: list[dict[str, Any]]) -> list[str]:
    """One message per location, and one for all the unknown keys of one mapping.

    A value that fits no union member gets 'must be X or Y'.
    """
    grouped: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for err in errors:
        path = err["loc"][0]
        grouped.setdefault(("unknown", path[:-1]) if err["type"] == "extra_forbidden" else (path,), []).append(err)
    lines = []
    for key, group in grouped.items():
        if key[0] == "unknown":
            lines.append(_unknown_keys(group))
        elif len(group) > 1 and all(err["type"] in _PLAIN_MESSAGES for err in group):
            wanted = dict.fromkeys(_PLAIN_MESSAGES[err["type"]].removeprefix("must be ") for err in group)
            lines.append(f"{_join_loc(group[0]['loc'][0])} = {_value(group[0])}: must be {' or '.join(wanted)}")
        else:
            lines.extend(dict.fromkeys(_format_one(err) for err in group))
    return lines


def _unknown_keys(group: list[dict[str, Any]]) -> str:
    path, model = group[0]["loc"]
    allowed = sorted(model.model_fields) if model is not None else []
    keys = [str(err["loc"][0][-1]) for err in group]
    named = ", ".join(f"{shown(key, 40)}{did_you_mean(key, allowed)}" for key in keys)
    where = _join_loc(path) if len(keys) == 1 else _join_loc(path[:-1])
    return f"{where}: unknown key{'s' if len(keys) > 1 else ''} {named}; allowed keys here: {', '.join(allowed)}"


def _format_one(err: dict[str, Any]) -> str:
    loc, _ = err["loc"]
    path = _join_loc(loc)
    kind = err["type"]
    if kind == "missing":
        return f"{path}: required field is missing"
    if kind == "union_tag_invalid":
        tag = err.get("ctx", {}).get("tag", err.get("input"))
        expected = str(err.get("ctx", {}).get("expected_tags", ""))
        options = [t.strip(" '") for t in expected.split(",")]
        return f"{path}.kind = {shown(tag)}: unknown kind{did_you_mean(str(tag), options)}; allowed: {expected}"
    if kind == "union_tag_not_found":
        return f"{path}: needs a 'kind' key to say which variant it is"
    if not loc:  # a whole-scenario check (sim.config.compat): its message names its fields itself
        return _message(err)
    return f"{path} = {_value(err)}: {_message(err)}"


def _value(err: dict[str, Any]) -> str:
    value = err.get("input")
    if isinstance(value, (dict, list)):  # never formatted whole: it may be large
        return "a mapping" if isinstance(value, dict) else "a list"
    return shown(value)


def _message(err: dict[str, Any]) -> str:
    if err["type"] in _PLAIN_MESSAGES:
        return _PLAIN_MESSAGES[err["type"]]
    return err["msg"].replace("Value error, ", "").replace("Input should be", "must be")


def _clean_location(
    loc: tuple[Any, ...], root: type[BaseModel], kind: str
) -> tuple[tuple[Any, ...], type[BaseModel] | None]:
    """The location as the user wrote it, and the model owning its last key.

    Keeps field names, list indices and the unknown key of an ``extra_forbidden`` error; a
    variant's kind (``policies.2.paged``) selects the model to follow and is dropped, as is
    every label pydantic gives a union member. These are the only strings a location holds.
    """
    cleaned: list[Any] = []
    models: list[type[BaseModel]] = [root]
    owner: type[BaseModel] | None = root
    for position, part in enumerate(loc):
        if isinstance(part, int):
            cleaned.append(part)
            continue
        if kind == "extra_forbidden" and position == len(loc) - 1:
            cleaned.append(part)
            owner = models[0] if len(models) == 1 else None
            break
        holder = next((m for m in models if part in m.model_fields), None)
        if holder is not None:
            cleaned.append(part)
            owner = holder
            models = _models_in(holder.model_fields[part].annotation)
            continue
        variant = next((m for m in models if _kind_default(m) == part), None)
        if variant is not None:
            models = [variant]
    return tuple(cleaned), owner


def _kind_default(model: type[BaseModel]) -> Any:
    field = model.model_fields.get("kind")
    return field.default if field is not None else None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Every model an annotation may hold (through unions, Optional, Annotated, lists)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in get_args(annotation) if get_origin(annotation) is not None else ():
        for model in _models_in(arg):
            if model not in found:
                found.append(model)
    return found


def _join_loc(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        part_text = f"[{part}]" if isinstance(part, int) else cut(repr(str(part)[:41])[1:-1], 40)
        text += part_text if isinstance(part, int) or not text else f".{part_text}"
    return text or "scenario"
