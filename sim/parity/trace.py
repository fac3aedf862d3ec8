"""The recorded-schedule format: one JSON file per run of a scheduler on a request stream.

A trace says what went in (the deployment, the scheduler's limits, the requests) and what the
scheduler did at every step. ``python -m sim parity record`` records one from vLLM's real
scheduler on the CPU; any scheduler that reports these fields per step can write one
(:func:`sim.parity.vllm_driver.record_step` reads them off vLLM's after each ``schedule()``).
Format ``batchsim-parity/1``::

    {"format": "batchsim-parity/1",
     "engine": {"name": "vllm", "version": "0.11.0"},
     "deployment": {"preset": "vllm-0.11", "model": "llama-3-8b", "gpu": "a100-80gb",
                    "tensor_parallel": 1, "max_model_len": 8192},
     "scheduler": {"max_num_batched_tokens": 2048, "max_num_seqs": 256, "block_size": 16,
                   "num_blocks": 400, "enable_prefix_caching": true, "async_scheduling": false},
     "requests": {"arrival_s": [...], "prompt_tokens": [...], "output_tokens": [...],
                  "block_keys": [[...], ...] or null},
     "steps": [{"add": [ids], "run": [id, tokens, id, tokens, ...], "preempt": [ids],
                "hit": [id, tokens, ...], "kv": blocks}, ...]}

``num_blocks`` is the usable KV blocks (vLLM's ``num_gpu_blocks`` less its null block).
``block_keys[r]`` names request r's full prompt blocks by content (equal keys: equal
prefixes, vLLM's chained block hashes; null: no prompt shares anything). Per step: ``add``
the requests handed to the scheduler before it ran (in order), ``run`` the requests it
scheduled with their token counts (flattened pairs, in its order), ``preempt`` the requests
it preempted, ``hit`` the prefix-cache hits (tokens) of requests it started or resumed, and
``kv`` the KV blocks held by requests after its allocations. Everything else (tokens each
request emits, completions) follows from these and the lengths.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.errors import UserError, cut
from sim.io.safe_write import write_text

FORMAT = "batchsim-parity/1"
SCHEDULER_KEYS = ("max_num_batched_tokens", "max_num_seqs", "block_size", "num_blocks", "enable_prefix_caching")
DEPLOYMENT_KEYS = ("preset", "model", "gpu", "tensor_parallel", "max_model_len")


@dataclass
class Step:
    """What a scheduler did in one step.

    Attributes:
        add: requests handed to the scheduler before this step, in order.
        run: (request, tokens) it scheduled, in its order.
        preempt: requests it preempted.
        hit: (request, prefix-cache hit tokens) for requests it started or resumed with a hit.
        kv: KV blocks held by requests after this step's allocations.
    """

    add: list[int] = field(default_factory=list)
    run: list[tuple[int, int]] = field(default_factory=list)
    preempt: list[int] = field(default_factory=list)
    hit: list[tuple[int, int]] = field(default_factory=list)
    kv: int = 0

    def to_json(self) -> dict[str, Any]:
        """The step as the trace file holds it (pairs flattened)."""
        return {
            "add": self.add,
            "run": [x for pair in self.run for x in pair],
            "preempt": self.preempt,
            "hit": [x for pair in self.hit for x in pair],
            "kv": self.kv,
        }


@dataclass
class Requests:
    """The request stream of a trace (indexed by request id)."""

    arrival_s: list[float]
    prompt_tokens: list[int]
    output_tokens: list[int]
    block_keys: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.prompt_tokens)


@dataclass
class ScheduleTrace:
    """One scheduler run: deployment, scheduler limits, requests and steps (see the module docstring)."""

    engine: dict[str, str]
    deployment: dict[str, Any]
    scheduler: dict[str, Any]
    requests: Requests
    steps: list[Step]

    def to_json(self) -> dict[str, Any]:
        """The whole trace as a JSON-ready dict."""
        req = self.requests
        return {
            "format": FORMAT,
            "engine": self.engine,
            "deployment": self.deployment,
            "scheduler": self.scheduler,
            "requests": {
                "arrival_s": req.arrival_s,
                "prompt_tokens": req.prompt_tokens,
                "output_tokens": req.output_tokens,
                "block_keys": req.block_keys,
            },
            "steps": [step.to_json() for step in self.steps],
        }

    def write(self, path: Path) -> None:
        """Write the trace, one step per line (small diffs when a golden file is re-recorded)."""
        data = self.to_json()
        steps = data.pop("steps")
        head = json.dumps(data, separators=(",", ":"))
        lines = [json.dumps(step, separators=(",", ":")) for step in steps]
        write_text(path, head[:-1] + ',"steps":[\n' + ",\n".join(lines) + "\n]}\n")


def read_trace(path: Path) -> ScheduleTrace:
    """Read and check a trace file.

    Raises:
        UserError: a missing or unreadable file, or one not in the ``batchsim-parity/1`` format.
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{str(path)!r}: cannot read a parity trace: {cut(str(exc), 80)}", field="trace") from None
    return parse_trace(data, str(path))


def parse_trace(data: Any, where: str = "trace") -> ScheduleTrace:
    """A :class:`ScheduleTrace` from the decoded JSON of a trace file.

    Raises:
        UserError: naming the first field that is missing or malformed.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise UserError(f"{where}: format = {cut(repr(got), 80)}: expected {FORMAT!r}", field="trace")
    for key, names in (("deployment", DEPLOYMENT_KEYS), ("scheduler", SCHEDULER_KEYS)):
        block = data.get(key)
        missing = [n for n in names if not isinstance(block, dict) or n not in block]
        if missing:
            raise UserError(f"{where}: {key} lacks {', '.join(missing)}", field="trace")
    requests = _parse_requests(data.get("requests"), where)
    steps = data.get("steps")
    if not isinstance(steps, list):
        raise UserError(f"{where}: steps = {cut(repr(steps), 80)}: expected a list of steps", field="trace")
    parsed = [_parse_step(step, i, len(requests), where) for i, step in enumerate(steps)]
    raw_engine = data.get("engine")
    engine: dict[str, str] = raw_engine if isinstance(raw_engine, dict) else {}
    return ScheduleTrace(engine, data["deployment"], data["scheduler"], requests, parsed)


def _int_list(value: Any, what: str, where: str, low: int = 0) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise UserError(f"{where}: {what} = {cut(repr(value), 80)}: expected a list of integers", field="trace")
    if any(x < low for x in value):
        raise UserError(f"{where}: {what} = {cut(repr(value), 80)}: values must be >= {low}", field="trace")
    return value


def _parse_requests(block: Any, where: str) -> Requests:
    if not isinstance(block, dict):
        raise UserError(f"{where}: requests = {cut(repr(block), 80)}: expected a mapping", field="trace")
    prompts = _int_list(block.get("prompt_tokens"), "requests.prompt_tokens", where, 1)
    outputs = _int_list(block.get("output_tokens"), "requests.output_tokens", where, 1)
    arrivals = block.get("arrival_s")
    if not isinstance(arrivals, list) or not all(isinstance(x, (int, float)) for x in arrivals):
        raise UserError(f"{where}: requests.arrival_s: expected a list of numbers", field="trace")
    keys = block.get("block_keys")
    if keys is not None and (not isinstance(keys, list) or len(keys) != len(prompts)):
        raise UserError(f"{where}: requests.block_keys: expected null or one list per request", field="trace")
    if not len(arrivals) == len(prompts) == len(outputs):
        raise UserError(f"{where}: requests: arrival_s, prompt_tokens and output_tokens differ in length", "trace")
    if keys is not None:
        keys = [_int_list(k, f"requests.block_keys[{i}]", where, -(2**62)) for i, k in enumerate(keys)]
    return Requests([float(a) for a in arrivals], prompts, outputs, keys)


def _pairs(flat: list[int], what: str, where: str) -> list[tuple[int, int]]:
    if len(flat) % 2:
        raise UserError(f"{where}: {what}: expected (request, tokens) pairs, got an odd count", field="trace")
    return list(zip(flat[::2], flat[1::2], strict=True))


def _parse_step(step: Any, index: int, count: int, where: str) -> Step:
    if not isinstance(step, dict):
        raise UserError(f"{where}: steps[{index}] = {cut(repr(step), 80)}: expected a mapping", field="trace")
    what = f"steps[{index}]"
    parsed = Step(
        add=_int_list(step.get("add", []), f"{what}.add", where),
        run=_pairs(_int_list(step.get("run", []), f"{what}.run", where), f"{what}.run", where),
        preempt=_int_list(step.get("preempt", []), f"{what}.preempt", where),
        hit=_pairs(_int_list(step.get("hit", []), f"{what}.hit", where), f"{what}.hit", where),
        kv=step.get("kv", 0) if isinstance(step.get("kv", 0), int) else -1,
    )
    ids = parsed.add + [r for r, _ in parsed.run] + parsed.preempt + [r for r, _ in parsed.hit]
    if parsed.kv < 0 or any(r >= count for r in ids):
        raise UserError(f"{where}: {what}: a request id >= {count} or a negative kv", field="trace")
    return parsed
