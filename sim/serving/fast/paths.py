"""Which engine path a run takes, and building the fast path's replicas.

The general engine (:mod:`sim.serving.worker`, :mod:`sim.serving.state`) runs every scenario and
every feature. The fast path (:mod:`sim.serving.fast`) runs the scenarios that dominate large runs
(the four built-in policies, reserve or paged memory, one scheduler step, any clients, routers,
replicas, front end and engine CPU model) on the same SimPy clock, with identical records. It is
chosen automatically: :func:`fast_path_refusal` says why a run cannot take it (None: it can), and
:func:`engine_path` names the path for ``scenario.resolved.yaml``.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import textwrap
import tokenize
from array import array
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import simpy

from sim.policies import base
from sim.policies.base import Policy
from sim.policies.chunked_prefill import ChunkedPrefillPolicy
from sim.policies.continuous import ContinuousPolicy
from sim.policies.paged import PagedPolicy
from sim.policies.static import StaticPolicy
from sim.serving.cpu_time import EngineCPUTime
from sim.serving.fast.kernels import ChunkedKernel, ContinuousKernel, Kernel, PagedKernel, StaticKernel
from sim.serving.fast.span import SpanPricer
from sim.serving.setup import lags_outputs

KERNELS: dict[type[Policy], type[Kernel]] = {
    StaticPolicy: StaticKernel,
    ContinuousPolicy: ContinuousKernel,
    PagedPolicy: PagedKernel,
    ChunkedPrefillPolicy: ChunkedKernel,
}
"""Policy class -> the kernel that mirrors its ``schedule``."""

MIRRORED: dict[type[Policy], str] = {
    StaticPolicy: "fa2354ceddfa9d9e",
    ContinuousPolicy: "ab60cc4111e0d7d6",
    PagedPolicy: "f2d42ed7edbe084a",
    ChunkedPrefillPolicy: "1a7f4aa0959aa1c2",
}
"""The decision code each kernel was checked against (:func:`decision_digest`). When a policy's code
changes, its runs take the general path until its kernel is checked again (the property tests of
``tests/test_fast_path.py``) and this digest updated."""

SHARED_HELPERS = (base.admit_waiting, base.preempt_until, base.watermark, base.decoders_left)
"""The helpers of :mod:`sim.policies.base` the kernels mirror too."""

ENGINE_PATHS = ("fast", "general")


def engine_path(policy: Policy, config: Any, setup: Any) -> str:
    """``fast`` or ``general``: the path :class:`sim.serving.engine.Engine` takes for this run."""
    return "general" if fast_path_refusal(policy, config, setup) else "fast"


def fast_path_refusal(policy: Policy, config: Any, setup: Any) -> str | None:
    """Why a run of ``policy`` (built from ``config``) with ``setup`` takes the general path (None: it need not).

    Args:
        policy: the policy object.
        config: its config (speculative decoding is read there).
        setup: the run's :class:`~sim.serving.setup.EngineSetup`.
    """
    replica = setup.replica
    kind = type(policy)
    refusals = (
        (not replica.fast_path, "the fast path is turned off"),
        (not replica.merge_decode_steps, "engine.merge_decode_steps is off (the plain loop, for debugging)"),
        (kind not in KERNELS, f"no fast kernel for {kind.__name__}"),
        (getattr(config, "speculative", None) is not None, "speculative decoding"),
        (replica.prefix_caching, "prefix caching"),
        (replica.pipeline is not None, "pipeline stages"),
        (getattr(policy, "num_scheduler_steps", 1) != 1, "multi-step scheduling"),
        (getattr(policy, "v1", False), "vLLM V1 scheduling rules (scheduling: vllm-v1)"),
        (lags_outputs(replica.engine_cpu), "async scheduling's one-step output lag (engine_cpu.overlap_step)"),
        (setup.router == "prefix_affinity", "the prefix_affinity router"),
        (not _simpy_queue_readable(), "this SimPy keeps its event queue elsewhere"),
    )
    for refused, why in refusals:
        if refused:
            return why
    if decision_digest(kind) != MIRRORED.get(kind):
        return f"{kind.__name__}'s decisions changed since its fast kernel was checked"
    return None


@cache
def _simpy_queue_readable() -> bool:
    env = simpy.Environment()
    return isinstance(getattr(env, "_queue", None), list) and hasattr(getattr(env, "_eid", None), "__next__")


@cache
def decision_digest(kind: type[Policy]) -> str:
    """A digest of a policy's decision code and the shared helpers (tokens only: comments, docstrings
    and layout do not count), or "" when the source cannot be read."""
    try:
        parts = [inspect.getsource(kind), *(inspect.getsource(helper) for helper in SHARED_HELPERS)]
    except (OSError, TypeError):
        return ""
    digest = hashlib.sha256()
    for part in parts:
        for token in _code_tokens(part):
            digest.update(token.encode())
            digest.update(b"\0")
    return digest.hexdigest()[:16]


def _code_tokens(source: str) -> list[str]:
    """The source's tokens without comments, line structure and docstrings."""
    kept: list[str] = []
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    tokens = list(tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline))
    for i, token in enumerate(tokens):
        if token.type in skip:
            continue
        starts_statement = i == 0 or tokens[i - 1].type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        ends_statement = i + 1 < len(tokens) and tokens[i + 1].type == tokenize.NEWLINE
        if token.type == tokenize.STRING and starts_statement and ends_statement:
            continue  # a docstring
        kept.append(token.string)
    return kept


def pass_pricer(cost_model: Any, engine_cpu: Any) -> Callable[..., float]:
    """The duration of a pass that starts a scheduling step, from its totals (``Worker.price``)."""
    price = cost_model.time_from_totals_s
    if engine_cpu is None:
        return price
    cpu = EngineCPUTime.from_config(engine_cpu)

    def priced(*totals: Any) -> float:
        return cpu.pass_time_s(price(*totals), totals[1] + totals[3], first_of_step=True)

    return priced


def build_kernels(
    stream: Any, policy: Policy, replica: Any, records: Any, itl: Any, replicas: int
) -> tuple[list[Kernel], SpanPricer]:
    """The fast path's replica states (one kernel per replica) and the pricing of their passes.

    Args:
        stream: the run's requests.
        policy: the policy object (a class of ``KERNELS``).
        replica: the replicas' :class:`~sim.serving.setup.ReplicaSetup`.
        records, itl: the run's request records and inter-token gaps.
        replicas: how many replicas.
    """
    from sim.serving.cuda_graphs import with_cuda_graphs

    kernel = KERNELS[type(policy)]
    prompt, output = _int_array(stream.prompt_tokens), _int_array(stream.output_tokens)
    reserve = stream.max_output_tokens if policy.memory == "reserve" else None
    whole = reserve is None and bool(getattr(policy, "allocates_whole_prompt", False))
    states = [
        kernel(
            policy,
            index,
            records,
            prompt,
            output,
            replica.engine_kv_blocks,
            replica.block_size,
            itl,
            reserve_tokens=reserve,
            whole_prompt=whole,
            holds_slots=policy.holds_slots,
            orders_running=policy.memory == "paged",
        )  # fmt: skip
        for index in range(replicas)
    ]
    cost = with_cuda_graphs(replica.cost_model, replica.cuda_graphs)
    return states, SpanPricer(pass_pricer(cost, replica.engine_cpu), cost if replica.engine_cpu is None else None)


def _int_array(values: Any) -> array:
    """``values`` as a typed array of Python ints (8 bytes each; read without numpy's scalar boxing)."""
    out = array("q")
    out.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())
    return out
