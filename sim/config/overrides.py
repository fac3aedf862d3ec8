"""Dotted-path overrides (``--set``, ``Scenario.replace``, sweep axes) on a scenario's plain data.

``policies[continuous].max_batch_size`` selects a list item by its ``name``,
``policies[2]`` by index; every other segment is a mapping key. These work on dicts, so
the schema (:mod:`sim.config`) and the YAML reader (:mod:`sim.io.scenario`) both use them.
"""

from __future__ import annotations

import re
from typing import Any

from sim.errors import UserError, did_you_mean, shown

_SEGMENT = re.compile(r"([^.\[\]]+)|\[([^\]]+)\]")


def with_overrides(data: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """A deep copy of ``data`` with every ``dotted path -> value`` of ``overrides`` set.

    Raises:
        UserError: a mapping key that is not text (see :func:`deep_copy`), or a path that does not fit the data.
    """
    copied = deep_copy(data)
    for dotted, value in (overrides or {}).items():
        set_path(copied, dotted, deep_copy(value, dotted))
    return copied


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
        raise UserError(f"empty override path {shown(dotted)}")
    return parts


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
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
            raise UserError(f"cannot set {shown(dotted)}: {shown(where)} is not a mapping or list")


def _list_index(items: list[Any], part: str | int, dotted: str) -> int:
    if isinstance(part, int):
        if -len(items) <= part < len(items):
            return part
        raise UserError(f"cannot set {shown(dotted)}: index {part} out of range (list has {len(items)} items)")
    name = part.strip("[]")
    names = [item.get("name") for item in items if isinstance(item, dict)]
    if name in names:
        return names.index(name)
    listed = ", ".join(shown(str(n), 40)[1:-1] for n in names[:10]) + (", ..." if len(names) > 10 else "")
    raise UserError(
        f"cannot set {shown(dotted)}: no item named {shown(name)}{did_you_mean(name, map(str, names))}; names: {listed}"
    )


def deep_copy(value: Any, where: str = "scenario") -> Any:
    """A copy of plain data (dicts, lists, scalars) whose every mapping key is text.

    YAML aliases make one list or dict appear in several places; the copy gives each place its
    own, so an override changes only the place it names. The YAML reader has already bounded
    the expanded size (:mod:`sim.io.yaml_reader`), so the copy is bounded too.

    Args:
        value: the data.
        where: its dotted path, for the error.

    Raises:
        UserError: a key that is not text (YAML reads ``1:``, ``null:`` or ``true:`` as a number, null or boolean).
    """
    return _copy(value, (where,))


def _copy(value: Any, path: tuple[str | int, ...]) -> Any:
    # The path is a tuple, joined only for an error: a long key repeated by aliases must not be copied per item.
    if isinstance(value, dict):
        copied = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise UserError(
                    f"{_join(path)}: key {_as_yaml(key)} is not a field name; keys are text (YAML reads a bare "
                    "number, null or true/false as a value)"
                )
            copied[key] = _copy(item, (*path, key))
        return copied
    if isinstance(value, list):
        return [_copy(item, (*path, index)) for index, item in enumerate(value)]
    return value


def _as_yaml(key: Any) -> str:
    return "null" if key is None else str(key).lower() if isinstance(key, bool) else shown(key)


def _join(path: tuple[str | int, ...]) -> str:
    root, *parts = path
    text = "" if root == "scenario" and parts else str(root)
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part[:40]}" if text else part[:40])
    return text
