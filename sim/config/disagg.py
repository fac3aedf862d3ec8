"""Schema of a disaggregated deployment: a prefill pool, a decode pool and the KV link between them.

Splitwise (ISCA'24), DistServe (OSDI'24) and Mooncake run prompt processing and token
generation on different GPUs. A scenario's ``disaggregation:`` block describes one such
deployment; it is simulated on the scenario's request stream next to the colocated
policies and appears as its own summary row, labelled by ``name``. The semantics are in
``docs/disaggregation.md``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from sim.config.base import Float, Int, StrictModel
from sim.config.policies import PolicyConfig

LINK_DEFAULTS: dict[str, tuple[float, float]] = {
    "nvlink": (300.0, 5.0),
    "infiniband": (25.0, 10.0),
    "pcie": (16.0, 10.0),
}
"""Link kind -> (GB/s per GPU pair and direction, latency in µs): A100 NVLink 3 (600 GB/s both
ways), HDR InfiniBand (200 Gb/s per GPU NIC), PCIe 4.0 x16 (as Splitwise's PCIe case)."""

class PoolConfig(StrictModel):
    """One pool of identical replicas (prefill or decode)."""

    replicas: Int = Field(1, ge=1, le=10_000, description="Replicas in this pool.")
    tensor_parallel: Int = Field(1, ge=1, le=1024, description="GPUs per replica of this pool.")
    gpu: str | None = Field(None, description="GPU of this pool (default: the scenario's gpu).")
    policy: PolicyConfig = Field(description="Batching policy of every replica of this pool (a policies[] entry).")


class LinkConfig(StrictModel):
    """The link that carries KV from a prefill replica to a decode replica (one per replica pair)."""

    kind: Literal["nvlink", "infiniband", "pcie"] = Field(
        "infiniband", description="Link technology; sets the defaults of gb_per_s and latency_us."
    )
    gb_per_s: Float | None = Field(
        None,
        gt=0,
        le=1e9,
        description="Bandwidth per GPU pair in GB/s (1e9 bytes), one direction (default per kind: "
        "nvlink 300, infiniband 25, pcie 16).",
    )
    latency_us: Float | None = Field(
        None, ge=0, le=1e9, description="Fixed latency of one transfer in µs (default per kind: nvlink 5, else 10)."
    )

    @property
    def bytes_per_s(self) -> float:
        """Bandwidth in bytes per second (the kind's default unless set)."""
        gb = self.gb_per_s if self.gb_per_s is not None else LINK_DEFAULTS[self.kind][0]
        return gb * 1e9

    @property
    def latency_s(self) -> float:
        """Latency of one transfer in seconds (the kind's default unless set)."""
        us = self.latency_us if self.latency_us is not None else LINK_DEFAULTS[self.kind][1]
        return us * 1e-6


class DisaggregationConfig(StrictModel):
    """Prefill and decode on separate pools, the KV cache sent over a link in between."""

    name: str = Field(
        "disaggregated",
        min_length=1,
        description="Label of the disaggregated deployment's row in tables and plots (not a policy name).",
    )
    prefill: PoolConfig = Field(description="The prefill pool: requests are routed here and get their first token.")
    decode: PoolConfig = Field(description="The decode pool: requests decode here once their KV has arrived.")
    link: LinkConfig = Field(default=LinkConfig(), description="KV link between each prefill and decode replica.")
    transfer: Literal["layerwise", "after_prefill"] = Field(
        "after_prefill",
        description="'after_prefill': the KV is sent once the prefill pass ends; 'layerwise': each layer's KV "
        "is sent while later layers compute, so only what the last prefill pass cannot hide remains.",
    )


def expand_pool_presets(data: dict[str, Any], facts_for: Any) -> dict[str, Any]:
    """Fill the presets of the pools' policy entries, each with its own pool's GPU.

    Args:
        data: the raw scenario mapping.
        facts_for: ``facts_for(gpu_or_None) -> DeploymentFacts``.
    """
    block = data.get("disaggregation")
    if not isinstance(block, dict):
        return data
    from sim.presets import expand_preset

    pools: dict[str, Any] = {}
    for pool in ("prefill", "decode"):
        entry = block.get(pool)
        if not isinstance(entry, dict):
            continue
        policy = entry.get("policy")
        if isinstance(policy, dict) and "preset" in policy:
            pools[pool] = {**entry, "policy": expand_preset(policy, facts_for(entry.get("gpu")))}
    return {**data, "disaggregation": {**block, **pools}}
