"""Mooncake trace loader (FAST'25 trace release, Apache-2.0; ../shared/traces/mooncake).

Each line of the JSONL file is one request: ``timestamp`` (ms since the trace start,
non-decreasing), ``input_length`` and ``output_length`` (tokens, >= 1) and ``hash_ids``:
one id per 512-token block of the prompt (the last block may be partial), chained so
that equal ids at the same position mean equal prefixes. The ids become a
:class:`~sim.workload.content.PromptContent` with 512-token units. A UTF-8 byte-order mark
at the start of the file is accepted, as YAML and the CSV readers accept one.

Every problem is one :class:`~sim.errors.UserError` naming the file, the line, the field,
the value (cut short) and what is allowed. The numbers are held in int64 arrays, so a
length or id beyond their range is refused here rather than overflowing later.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import UserError, shown
from sim.workload.content import PromptContent

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per Mooncake ``hash_ids`` entry."""
MAX_LENGTH_TOKENS = 2**53
"""Largest ``input_length``/``output_length`` accepted: the most a float64 (the metrics) holds exactly."""
MAX_HASH_ID = 2**63 - 1
"""Largest ``hash_ids`` entry: ids are kept as int64."""
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
        with open(path, encoding="utf-8-sig") as handle:  # -sig: a leading byte-order mark is skipped
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
    except (ValueError, RecursionError) as exc:  # an integer of > 4300 digits; arrays nested too deep
        raise _bad(f"{where}: not a usable JSON object ({_first_words(exc)}); each line must be one") from None
    if not isinstance(row, dict) or any(name not in row for name in _FIELDS):
        missing = [n for n in _FIELDS if not isinstance(row, dict) or n not in row]
        raise _bad(f"{where}: missing field(s) {', '.join(missing)}; a Mooncake line has {', '.join(_FIELDS)}")
    stamp = row["timestamp"]
    if not _is_number(stamp) or stamp < previous_ms:
        raise _bad(
            f"{where}, field 'timestamp': {shown(stamp)} is not allowed; it must be a finite number of ms >= the "
            f"previous line's ({previous_ms:g})"
        )
    prompt = _count(row["input_length"], where, "input_length")
    output = _count(row["output_length"], where, "output_length")
    return float(stamp), prompt, output, _hash_ids(row["hash_ids"], prompt, where)


def _count(value: Any, where: str, name: str) -> int:
    if not _is_whole(value, 1, MAX_LENGTH_TOKENS):
        raise _bad(
            f"{where}, field '{name}': {shown(value)} is not allowed; it must be a whole number from 1 to "
            f"2**53 ({MAX_LENGTH_TOKENS})"
        )
    return value


def _hash_ids(value: Any, prompt: int, where: str) -> list[int]:
    expected = -(-prompt // MOONCAKE_BLOCK_TOKENS)
    ok = isinstance(value, list) and all(_is_whole(v, 0, MAX_HASH_ID) for v in value)
    if not ok or len(value) != expected:
        raise _bad(
            f"{where}, field 'hash_ids': {shown(value)} is not allowed; it must be {expected} whole numbers from 0 "
            f"to 2**63 - 1 (one per {MOONCAKE_BLOCK_TOKENS}-token block of input_length {prompt})"
        )
    return value


def _is_whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)  # a JSON integer beyond float range overflows: not a usable time
    except OverflowError:
        return False


def _first_words(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 80 else text[:80] + "..."


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
