"""Dotted-path overrides (``--set``, ``Scenario.replace``, sweep axes) on a scenario's plain data.

``policies[continuous].max_batch_size`` selects a list item by its ``name``,
``policies[2]`` by index; every other segment is a mapping key. These work on dicts, so
the schema (:mod:`sim.config`) and the YAML reader (:mod:`sim.io.scenario`) both use them.
"""

from __future__ import annotations

import re
from typing import Any

from sim.errors import UserError, did_you_mean

_SEGMENT = re.compile(r"([^.\[\]]+)|\[([^\]]+)\]")


def with_overrides(data: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """A deep copy of ``data`` with every ``dotted path -> value`` of ``overrides`` set."""
    copied = deep_copy(data)
    for dotted, value in (overrides or {}).items():
        set_path(copied, dotted, value)
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
        raise UserError(f"empty override path '{dotted}'")
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


def deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [deep_copy(v) for v in value]
    return value
