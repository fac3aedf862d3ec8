"""Mooncake trace loader (FAST'25 trace release, Apache-2.0; ../shared/traces/mooncake).

Each line of the JSONL file is one request: ``timestamp`` (ms since the trace start,
non-decreasing), ``input_length`` and ``output_length`` (tokens, >= 1) and ``hash_ids``:
one id per 512-token block of the prompt (the last block may be partial), chained so
that equal ids at the same position mean equal prefixes. The ids become a
:class:`~sim.workload.content.PromptContent` with 512-token units.

Every problem is one :class:`~sim.errors.UserError` naming the file, the line, the field,
the value and what is allowed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import UserError
from sim.workload.content import PromptContent

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per Mooncake ``hash_ids`` entry."""
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(frozen=True)
class MooncakeTrace:
    """A loaded Mooncake trace, in file order.

    Attributes:
        arrival_s: send times in seconds since the trace start.
        prompt_tokens, output_tokens: lengths (int64 >= 1).
        content: the prompts' 512-token block ids.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    content: PromptContent

    def __len__(self) -> int:
        return len(self.prompt_tokens)


def load_mooncake(path: Path, limit: int | None = None) -> MooncakeTrace:
    """Read and validate a Mooncake JSONL trace (at most ``limit`` requests from its start).

    Raises:
        UserError: unreadable file, a line that is not a JSON object with the four fields,
            a bad value, timestamps out of order, or no requests at all.
    """
    rows: list[tuple[float, int, int, list[int]]] = []
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if limit is not None and len(rows) >= limit:
                    break
                if line.strip():
                    rows.append(_parse_line(line, path, number, rows[-1][0] if rows else 0.0))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the Mooncake trace: {exc}", field="workload.arrival.path") from None
    if not rows:
        raise UserError(f"{path}: the Mooncake trace has no requests", field="workload.arrival.path")
    return _assemble(rows)


def _parse_line(line: str, path: Path, number: int, previous_ms: float) -> tuple[float, int, int, list[int]]:
    where = f"{path}, line {number}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _bad(f"{where}: not valid JSON ({exc.msg}); each line must be one JSON object") from None
    if not isinstance(row, dict) or any(name not in row for name in _FIELDS):
        missing = [n for n in _FIELDS if not isinstance(row, dict) or n not in row]
        raise _bad(f"{where}: missing field(s) {', '.join(missing)}; a Mooncake line has {', '.join(_FIELDS)}")
    stamp = row["timestamp"]
    if not _is_number(stamp) or stamp < previous_ms:
        raise _bad(
            f"{where}, field 'timestamp': {stamp!r} is not allowed; it must be a number of ms >= the previous "
            f"line's ({previous_ms:g})"
        )
    prompt = _count(row["input_length"], where, "input_length")
    output = _count(row["output_length"], where, "output_length")
    return float(stamp), prompt, output, _hash_ids(row["hash_ids"], prompt, where)


def _count(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(f"{where}, field '{name}': {value!r} is not allowed; it must be a whole number >= 1")
    return value


def _hash_ids(value: Any, prompt: int, where: str) -> list[int]:
    expected = -(-prompt // MOONCAKE_BLOCK_TOKENS)
    ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    if not ok or len(value) != expected:
        shown = value if not isinstance(value, list) or len(value) < 8 else f"a list of {len(value)} entries"
        raise _bad(
            f"{where}, field 'hash_ids': {shown!r} is not allowed; it must be {expected} whole numbers >= 0 "
            f"(one per {MOONCAKE_BLOCK_TOKENS}-token block of input_length {prompt})"
        )
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def _bad(message: str) -> UserError:
    return UserError(message, field="workload.arrival.path")


def _assemble(rows: list[tuple[float, int, int, list[int]]]) -> MooncakeTrace:
    stamps, prompts, outputs, hashes = zip(*rows, strict=True)
    lengths = np.fromiter((len(h) for h in hashes), dtype=np.int64, count=len(hashes))
    starts = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    ids = np.fromiter((i for h in hashes for i in h), dtype=np.int64, count=int(starts[-1]))
    prompt_tokens = np.array(prompts, dtype=np.int64)
    content = PromptContent(MOONCAKE_BLOCK_TOKENS, ids, starts, prompt_tokens.copy())
    return MooncakeTrace(
        np.array(stamps, dtype=np.float64) / 1000.0, prompt_tokens, np.array(outputs, dtype=np.int64), content
    )


def clip_prompts(trace: MooncakeTrace, max_prompt_tokens: int) -> MooncakeTrace:
    """Keep at most the first ``max_prompt_tokens`` tokens of every prompt.

    The head is kept, so the clipped prompts keep their leading block ids and their
    sharing among each other (a shorter context window sees only the first blocks).
    """
    prompt = np.minimum(trace.prompt_tokens, max_prompt_tokens)
    content = PromptContent(trace.content.unit_tokens, trace.content.ids, trace.content.starts, prompt.copy())
    return MooncakeTrace(trace.arrival_s, prompt, trace.output_tokens, content)
