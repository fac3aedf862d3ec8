"""Prefix caching on the Mooncake traces: exact reuse bound, monotone hit rate, bad input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from fakes import setup

from sim.config import PagedPolicyConfig
from sim.errors import UserError
from sim.serving.engine import Engine
from sim.workload.mooncake import clip_prompts, load_mooncake
from sim.workload.stream import RequestStream

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake"
CONVERSATION = TRACES / "conversation_trace.jsonl"
needs_shared = pytest.mark.skipif(
    not CONVERSATION.is_file(), reason=f"Mooncake trace not found at {CONVERSATION} (../shared next to the repo)"
)
BLOCK = 16


class Cost:
    def time_from_totals_s(self, tokens: int, seqs: int, work: float, decodes: int, kv: int) -> float:
        return 0.01 + tokens * 1e-5 + decodes * 1e-5


def _bound_from_hash_ids(path: Path, limit: int | None, block_size: int) -> tuple[int, int, int]:
    """(reused tokens, prompt tokens, hash-level reused blocks) straight from the JSONL: each 512-token
    hash covers 512 / block_size engine blocks; a full engine block hits iff its (hash, sub-block)
    appeared as a full block in an earlier request; a request computes at least its last token."""
    per_hash = 512 // block_size
    seen: set[tuple[int, int]] = set()
    seen_hashes: set[int] = set()
    reused = prompt_total = hash_hits = 0
    with open(path) as handle:
        for number, line in enumerate(handle):
            if limit is not None and number >= limit:
                break
            row = json.loads(line)
            prompt = row["input_length"]
            full = [(h, s) for j, h in enumerate(row["hash_ids"]) for s in range(per_hash)
                    if (j * per_hash + s + 1) * block_size <= prompt]  # fmt: skip
            cap = (prompt - 1) // block_size
            hits = [b in seen for b in full]
            assert hits == sorted(hits, reverse=True), "a hit after a miss: the ids are not prefix hashes"
            reused += min(sum(hits), cap) * block_size
            prompt_total += prompt
            hash_hits += sum(h in seen_hashes for h in row["hash_ids"])
            seen.update(full)
            seen_hashes.update(row["hash_ids"])
    return reused, prompt_total, hash_hits


def _sequential(stream: RequestStream) -> RequestStream:
    """One request at a time (a 1000 s gap, one output token): no request waits on another's prefill."""
    n = len(stream)
    return replace(stream, arrival_s=np.arange(n) * 1000.0, output_tokens=np.ones(n, np.int64), max_output_tokens=1)


def _run(stream: RequestStream, kv_blocks: int) -> Engine:
    policy = PagedPolicyConfig(name="p", max_num_batched_tokens=200_000)
    engine = Engine(stream, policy, setup(Cost(), kv_blocks=kv_blocks, block_size=BLOCK, prefix_caching=True))
    engine.run()
    return engine


def _stream(limit: int | None) -> RequestStream:
    trace = load_mooncake(CONVERSATION, limit)
    return RequestStream(trace.arrival_s, trace.prompt_tokens, trace.output_tokens,
                         int(trace.output_tokens.max()), content=trace.content)  # fmt: skip


@pytest.mark.slow
@needs_shared
def test_unbounded_cache_hits_exactly_the_reuse_bound_of_the_hash_ids() -> None:
    stream = _sequential(_stream(None))
    reused, prompt_total, hash_hits = _bound_from_hash_ids(CONVERSATION, None, BLOCK)
    blocks = int(sum(-(-p // BLOCK) for p in stream.prompt_tokens.tolist()))  # more than all distinct blocks
    engine = _run(stream, blocks + 1)
    assert engine.states[0].blocks.evicted_blocks == 0
    assert int(engine.records.cached_prompt_tokens.sum()) == reused
    assert 0.36 < hash_hits / len(load_mooncake(CONVERSATION).content.ids) < 0.37  # the 36.6 %
    assert abs(reused / prompt_total - 0.36) < 0.03


@pytest.mark.slow
@needs_shared
def test_hit_rate_never_falls_as_the_cache_grows() -> None:
    trace = clip_prompts(load_mooncake(CONVERSATION, 1500), 16_384)  # at most 1024 blocks per request
    outputs = np.minimum(trace.output_tokens, 32)  # real arrival times, short answers: a quick run
    stream = RequestStream(trace.arrival_s, trace.prompt_tokens, outputs, 32, content=trace.content)
    rates = []
    for kv_blocks in (1_100, 3_000, 10_000, 30_000, 200_000):
        engine = _run(stream, kv_blocks)
        rates.append(engine.records.cached_prompt_tokens.sum() / stream.prompt_tokens.sum())
    assert rates == sorted(rates) and rates[-1] > rates[0]


BAD_LINES = {
    "not json": ("{oops", "not valid JSON"),
    "missing field": ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "missing field(s) hash_ids"),
    "zero output": ('{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [1]}', "'output_length': 0"),
    "hash count": ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}', "must be 2 whole"),
    "negative hash": ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [-1]}', "'hash_ids'"),
    # Beyond int64 (the arrays they go into) or float range: refused, not an OverflowError.
    "hash 2**63": (
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [9223372036854775808]}',
        "2**63 - 1",
    ),
    "output 10**30": (
        '{"timestamp": 0, "input_length": 5, "output_length": ' + "1" + "0" * 30 + ', "hash_ids": [7]}',
        "'output_length'",
    ),
    "timestamp 10**400": (
        '{"timestamp": 1' + "0" * 400 + ', "input_length": 5, "output_length": 1, "hash_ids": [7]}',
        "'timestamp'",
    ),
    "integer of 5000 digits": ('{"timestamp": 1' + "0" * 5000 + ', "input_length": 5}', "not a usable JSON object"),
    "nested too deep": ("[" * 100_000, "not a usable JSON object"),
}


@pytest.mark.parametrize("case", BAD_LINES, ids=list(BAD_LINES))
def test_a_corrupt_line_is_one_clear_error(tmp_path: Path, case: str) -> None:
    line, fragment = BAD_LINES[case]
    good = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [7]}'
    path = tmp_path / "t.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(UserError, match="line 2") as info:
        load_mooncake(path)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message and len(message) < 400, message  # the value is cut short


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    line = '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [4, 5]}\n'
    plain, marked = tmp_path / "plain.jsonl", tmp_path / "marked.jsonl"
    plain.write_bytes(line.encode() * 2)
    marked.write_bytes(b"\xef\xbb\xbf" + line.encode() * 2)
    a, b = load_mooncake(plain), load_mooncake(marked)
    assert len(b) == 2
    np.testing.assert_array_equal(a.content.ids, b.content.ids)
    np.testing.assert_array_equal(a.output_tokens, b.output_tokens)


def test_the_largest_allowed_values_load_exactly(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(f'{{"timestamp": 0, "input_length": 5, "output_length": {2**53}, "hash_ids": [{2**63 - 1}]}}\n')
    trace = load_mooncake(path)
    assert int(trace.content.ids[0]) == 2**63 - 1 and int(trace.output_tokens[0]) == 2**53


def test_timestamps_must_not_go_back(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    row = '{{"timestamp": {}, "input_length": 5, "output_length": 1, "hash_ids": [7]}}'
    path.write_text(row.format(10) + "\n" + row.format(3) + "\n")
    with pytest.raises(UserError, match="'timestamp': 3 is not allowed"):
        load_mooncake(path)
