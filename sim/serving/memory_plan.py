"""Which memory model a replica runs: the one place that maps a deployment's choices to a model.

:class:`MemoryPlan` is decided once per run (the policy's memory discipline, prefix
caching, the drafter) and builds each replica's :class:`~sim.serving.memory.KVMemory`
when the replica's decode group exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.metrics.records import RequestRecords
from sim.serving.kv_cache import BlockAllocator
from sim.serving.memory import KVMemory, PagedMemory, ReserveMemory
from sim.serving.prefix_cache import PrefixCacheAllocator
from sim.serving.prefix_memory import PrefixCachedMemory
from sim.serving.sequences import DecodeGroup
from sim.workload.content import PromptContent


@dataclass(frozen=True)
class MemoryPlan:
    """Which memory model a replica runs, before its decode group exists (see :meth:`build`).

    Attributes:
        reserve_tokens: reserve memory with this many output tokens per request (None: paged).
        whole_prompt: paged memory granting a (re)prefill's blocks at admission.
        prefix_caching: paged memory with prefix caching.
        content: the stream's prompt content identity (prefix caching; None: none).
        drop_last_hit_block: an EAGLE-style drafter drops the last block of every prefix hit.
    """

    reserve_tokens: int | None = None
    whole_prompt: bool = False
    prefix_caching: bool = False
    content: PromptContent | None = None
    drop_last_hit_block: bool = False

    def __post_init__(self) -> None:
        if self.reserve_tokens is not None and (self.prefix_caching or self.whole_prompt):
            raise ValueError("reserve memory neither caches prefixes nor grants whole prompts")

    def build(
        self, kv_blocks: int, block_size: int, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
        records: RequestRecords, decoders: DecodeGroup, *, lags_outputs: bool = False,
    ) -> KVMemory:  # fmt: skip
        """The memory model of one replica with ``kv_blocks`` blocks of ``block_size`` tokens
        (``lags_outputs``: the engine sees each pass's outputs one pass late, async scheduling)."""
        if self.prefix_caching:
            allocator = PrefixCacheAllocator(kv_blocks, block_size)
            return PrefixCachedMemory(
                allocator, prompt_tokens, output_tokens, records, decoders, whole_prompt=self.whole_prompt,
                content=self.content, drop_last_hit_block=self.drop_last_hit_block, lags_outputs=lags_outputs,
            )  # fmt: skip
        parts = (BlockAllocator(kv_blocks, block_size), prompt_tokens, output_tokens, records, decoders)
        if self.reserve_tokens is not None:
            return ReserveMemory(*parts, reserve_tokens=self.reserve_tokens)
        return PagedMemory(*parts, whole_prompt=self.whole_prompt)
