"""Reading YAML that cannot exhaust memory or time: every YAML file and value batchsim reads comes here.

Plain ``yaml.safe_load`` has three holes for a file a user hands over. An anchor used nine
times, whose content uses another anchor nine times, and so on nine levels deep, is 700
bytes of YAML but 9^9 (387 million) values once expanded; the parser shares the aliased
objects, but anything that walks or copies the data (overrides, validation) expands them.
Nesting a few hundred levels deep exhausts Python's recursion limit. And the file's size is
unbounded. Here the composer counts every node as it builds the document, an alias at the
size of what it names, and stops as soon as the expanded document would exceed
:data:`MAX_NODES` values or :data:`MAX_DEPTH` levels, before anything is constructed or
copied; files are read only up to :data:`MAX_BYTES`. Everything after loading (copies,
validation) therefore works on at most ``MAX_NODES`` values.

The loader also refuses duplicate keys (plain YAML silently keeps the last), supports YAML's
merge keys (``<<: *base``), reads ``1e12`` as a number as YAML 1.2 does (YAML 1.1 needs
``1.0e12``), and turns every problem into one :class:`UserError` line.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.error import MarkedYAMLError
from yaml.events import AliasEvent, MappingStartEvent, ScalarEvent, StreamStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.resolver import Resolver

from sim.errors import UserError, cut, shown

try:  # libyaml's event parser: ~5x faster than the pure-Python one (PyYAML wheels include it)
    from yaml.cyaml import CParser as _EventParser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _EventParser(Reader, Scanner, Parser):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)


MAX_BYTES = 1 << 20
"""Largest YAML file read (1 MiB). The longest shipped scenario is ~3 KB."""
MAX_NODES = 50_000
"""Most values (scalars, lists, mappings) in one document once aliases are expanded.

A real scenario holds a few hundred (quickstart: 77). The bound keeps the worst case of a
file within it, aliased or not, under ~1 s and ~100 MB (measured in tests/test_yaml_limits.py).
"""
MAX_DEPTH = 64
"""Deepest nesting once aliases are expanded (scenarios nest ~5 levels); far below the recursion limit."""
MAX_INT_CHARS = 100
"""Longest integer literal: YAML 1.1's base-60 integers (``1:2:3``) cost time quadratic in their length."""

_MERGE_TAG = "tag:yaml.org,2002:merge"
_PROBLEM_CHARS = 160
"""Longest parser message shown: PyYAML's messages quote the user's text (anchors, tags)."""


class YamlLimitError(MarkedYAMLError):
    """A document beyond :data:`MAX_NODES` or :data:`MAX_DEPTH`: refused as it is composed."""


class _BudgetComposer(Composer):
    """A composer that counts the document's expanded size and depth as it builds each node.

    Each node counts 1; an alias counts the expanded size of the node it names (known once that
    node is complete, so an alias inside the node it names, a recursive structure, is refused).
    """

    def __init__(self, max_nodes: int, max_depth: int) -> None:
        Composer.__init__(self)
        self._max_nodes = max_nodes
        self._max_depth = max_depth
        self._expanded = 0  # values so far, aliases expanded
        self._depth = 0  # of the node being composed (the root is 1)
        self._deepest = 0  # deepest level reached so far, aliases expanded
        self._anchored: dict[int, tuple[int, int]] = {}  # id(anchored node) -> (expanded size, height)

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            self._count_alias(event)
            return Composer.compose_node(self, parent, index)
        before, deepest_outside = self._expanded, self._deepest
        self._depth += 1
        self._deepest = self._depth
        self._count(1, self._depth, event)
        node = Composer.compose_node(self, parent, index)
        if event.anchor is not None:
            self._anchored[id(node)] = (self._expanded - before, self._deepest - self._depth)
        self._depth -= 1
        self._deepest = max(self._deepest, deepest_outside)
        return node

    def _count_alias(self, event: AliasEvent) -> None:
        target = self.anchors.get(event.anchor)
        if target is None:
            return  # the base composer reports the undefined alias
        if id(target) not in self._anchored:
            raise YamlLimitError(
                problem=f"alias *{cut(event.anchor, 40)} is used inside the node it names; recursive structures "
                "are not allowed",
                problem_mark=event.start_mark,
            )
        size, height = self._anchored[id(target)]
        self._count(size, self._depth + 1 + height, event)
        self._deepest = max(self._deepest, self._depth + 1 + height)

    def _count(self, nodes: int, depth: int, event: Any) -> None:
        self._expanded += nodes
        if self._expanded > self._max_nodes:
            raise YamlLimitError(
                problem=f"too many values: more than {self._max_nodes:,} once aliases are expanded; at most "
                f"{self._max_nodes:,} are allowed",
                problem_mark=event.start_mark,
            )
        if depth > self._max_depth:
            raise YamlLimitError(
                problem=f"nested too deeply: more than {self._max_depth} levels once aliases are expanded; at "
                f"most {self._max_depth} are allowed",
                problem_mark=event.start_mark,
            )


class _StrictConstructor(SafeConstructor):
    """SafeConstructor refusing duplicate keys, keeping merge keys, and reporting bad scalars as YAML errors."""

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return SafeConstructor.construct_object(self, node, deep=deep)
        except (ValueError, OverflowError, KeyError, AttributeError) as exc:
            # PyYAML's scalar constructors trust the resolver's pattern; a scalar with an explicit tag
            # that does not fit it (2023-02-30, 0b_, !!bool maybe, !!timestamp 1) fails inside them.
            if not isinstance(node, ScalarNode):
                raise
            why = f" ({exc})" if isinstance(exc, (ValueError, OverflowError)) else ""
            kind = node.tag.rsplit(":", 1)[-1]
            raise ConstructorError(
                None, None, f"{shown(node.value, 40)} is not a valid {kind}{why}", node.start_mark
            ) from None

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):  # else (!!set [1]) the base class says a mapping was expected
            self._refuse_duplicate_keys(node)
        return SafeConstructor.construct_mapping(self, node, deep=deep)

    def _refuse_duplicate_keys(self, node: MappingNode) -> None:
        # Only the keys written in this mapping: keys a merge (<<) brings in are meant to be overridden.
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node)
            if not isinstance(key, Hashable):
                raise ConstructorError(
                    None, None, "a key must be a single value, not a list or mapping", key_node.start_mark
                )
            if key in seen:
                raise ConstructorError(
                    None, None, f"duplicate key {shown(key)} (first at line {seen[key]})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line + 1

    def construct_yaml_int(self, node: Node) -> int:
        if len(node.value) > MAX_INT_CHARS:
            raise ConstructorError(None, None, f"an integer of more than {MAX_INT_CHARS} characters", node.start_mark)
        return SafeConstructor.construct_yaml_int(self, node)


# SafeConstructor registers its own function for ints; the mapping constructor is looked up on self.
_StrictConstructor.add_constructor("tag:yaml.org,2002:int", _StrictConstructor.construct_yaml_int)


class _BudgetLoader(_BudgetComposer, _EventParser, _StrictConstructor, Resolver):
    """Events from libyaml, composed under a budget in Python, constructed by the strict constructor."""

    def __init__(self, text: str, max_nodes: int, max_depth: int) -> None:
        _EventParser.__init__(self, text)
        _BudgetComposer.__init__(self, max_nodes, max_depth)
        _StrictConstructor.__init__(self)
        Resolver.__init__(self)


# YAML 1.2 reads 1e12 and 1.5e3 as numbers; YAML 1.1 (PyYAML) only with a dot and a signed exponent
# (1.0e+12), and otherwise as strings that no number field accepts.
_BudgetLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def load_yaml_text(text: str, *, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> Any:
    """Parse one YAML document within the node and depth budget; PyYAML's exceptions as they come.

    Raises:
        YamlLimitError: beyond ``max_nodes`` values or ``max_depth`` levels once aliases are expanded.
        yaml.YAMLError: not valid YAML, or a duplicate key.
    """
    loader = _BudgetLoader(text, max_nodes, max_depth)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_yaml(
    text: str, source: Path | str = "<string>", *, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH
) -> Any:
    """Parse one YAML document within the budget (see :func:`load_yaml_text`).

    Args:
        text: the YAML text.
        source: what the error names (a path, ``--set x``).
        max_nodes: most values once aliases are expanded.
        max_depth: deepest nesting once aliases are expanded.

    Raises:
        UserError: not valid YAML, a duplicate key, or beyond the budget; one line with the line number.
    """
    try:
        return load_yaml_text(text, max_nodes=max_nodes, max_depth=max_depth)
    except yaml.YAMLError as exc:
        raise UserError(yaml_error_text(exc, source)) from None


def yaml_error_text(exc: yaml.YAMLError, source: Path | str) -> str:
    """One line for a PyYAML error: the source, the line and column, and the problem (cut to a bounded length)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or str(exc)
    problem = cut(" ".join(str(problem).split()), _PROBLEM_CHARS)  # PyYAML's messages may span lines
    if isinstance(exc, YamlLimitError):
        return f"{source}: {problem}" + (f" ({where})" if where else "")
    return f"{source}: not valid YAML" + (f" at {where}" if where else "") + f": {problem}"


def parse_option_value(text: str, option: str) -> Any:
    """A command-line value read as YAML (``4`` -> int, ``true`` -> bool), within the YAML budget.

    Text that is not valid YAML stays the text itself; a value beyond the budget (an alias bomb) is refused.

    Raises:
        UserError: beyond the YAML budget (see :mod:`sim.io.yaml_reader`).
    """
    if not text.strip():
        return ""
    try:
        return load_yaml_text(text)
    except YamlLimitError as exc:
        raise UserError(yaml_error_text(exc, option)) from None
    except yaml.YAMLError:
        return text


def read_text_file(path: Path, *, max_bytes: int = MAX_BYTES, what: str = "file") -> str:
    """A text file's content as UTF-8 (a BOM is allowed), read only up to ``max_bytes``.

    Raises:
        UserError: unreadable, larger than ``max_bytes``, UTF-16, or not UTF-8 (naming the byte and line).
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)  # not stat(): /proc files and pipes report no size
    except OSError as exc:
        raise UserError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        size = path.stat().st_size if path.is_file() else 0
        actual = f"{size / 2**20:.1f} MiB" if size > max_bytes else f"over {max_bytes:,} bytes"
        raise UserError(
            f"{path}: the {what} is {actual}; a {what} may be at most {max_bytes / 2**20:g} MiB ({max_bytes:,} bytes)"
        )
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise UserError(f"{path}: the file is UTF-16; save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UserError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}); save it as UTF-8"
        ) from None


def read_yaml_file(path: Path, *, what: str = "YAML file") -> Any:
    """Read and parse a YAML file within :data:`MAX_BYTES` and the node budget (see :func:`parse_yaml`)."""
    return parse_yaml(read_text_file(path, what=what), path)


def first_key(path: Path) -> Any:
    """The first key of the top-level mapping of a YAML file (None if there is none), reading no further.

    Cheap whatever the file's size: only the events up to that key are parsed.
    """
    try:
        with open(path, encoding="utf-8-sig") as handle:
            parser = _EventParser(handle)
            try:
                events = [parser.get_event() for _ in range(4)]  # stream, document, mapping start, first key
            finally:
                parser.dispose()
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(events[0], StreamStartEvent) or not isinstance(events[2], MappingStartEvent):
        return None
    return events[3].value if isinstance(events[3], ScalarEvent) else None
