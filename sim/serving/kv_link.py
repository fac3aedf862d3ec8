"""KV transfer between a prefill and a decode replica: its duration and the link it queues on.

One :class:`Link` per (prefill replica, decode replica) pair. Transfers on a link are
served first come first served, one at a time, each at the link's full bandwidth: a
transfer asked for at t waits until the link is free, then takes

    latency + bytes / bandwidth

(``after_prefill``), so two transfers asked for at once end at T and 2T: the second one
*waits* T, then takes T. This is exactly a capacity-1 ``simpy.Resource``; it is kept as a
next-free time because a transfer's duration is known when it starts (one timeout per
transfer instead of a request, a grant and a release).

``layerwise`` (DistServe and Splitwise pipeline the KV of each layer behind the
computation of the next): a layer's KV is ready 1/L of the way through the last prefill
pass, so if the transfer starts the moment that pass ends, its first L-1 layers could
have been sent during the pass's last (L-1)/L. What remains is

    latency + max(bytes / bandwidth / L, bytes / bandwidth - pass_s * (L - 1) / L)

A transfer that had to wait (link busy, decode memory full) gets no overlap: its KV was
complete before it could move.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransferModel:
    """How long one request's KV takes over one link.

    Attributes:
        bytes_per_token: KV bytes one GPU pair carries per prompt token (the larger TP shard
            of the two pools: every GPU pair of a replica pair sends its shard in parallel).
        bytes_per_s: link bandwidth per GPU pair, one direction.
        latency_s: fixed cost of one transfer.
        layers: transformer layers (the layerwise pipeline depth).
        layerwise: overlap the transfer with the last prefill pass.
    """

    bytes_per_token: int
    bytes_per_s: float
    latency_s: float
    layers: int
    layerwise: bool = False

    def bytes_for(self, prompt_tokens: int) -> int:
        """KV bytes of a prompt over one GPU pair."""
        return prompt_tokens * self.bytes_per_token

    def duration_s(self, prompt_tokens: int, overlap_pass_s: float = 0.0) -> float:
        """Link time of one transfer of ``prompt_tokens`` tokens of KV.

        Args:
            prompt_tokens: tokens whose KV is sent.
            overlap_pass_s: duration of the prefill pass the transfer may hide behind
                (layerwise only; 0 when the transfer could not start at its end).
        """
        wire_s = self.bytes_for(prompt_tokens) / self.bytes_per_s
        if self.layerwise and overlap_pass_s > 0:
            hidden_s = overlap_pass_s * (self.layers - 1) / self.layers
            wire_s = max(wire_s / self.layers, wire_s - hidden_s)
        return self.latency_s + wire_s


class Link:
    """One prefill-decode replica pair's link: FIFO, one transfer at a time.

    Attributes:
        free_at_s: when the last transfer booked on it ends.
        busy_s: total link time booked (for utilization).
        transfers: transfers booked.
    """

    __slots__ = ("free_at_s", "busy_s", "transfers")

    def __init__(self) -> None:
        self.free_at_s = 0.0
        self.busy_s = 0.0
        self.transfers = 0

    def book(self, now_s: float, duration_s: float) -> float:
        """Queue a transfer of ``duration_s`` asked for at ``now_s``; return its wait before it starts."""
        wait_s = max(0.0, self.free_at_s - now_s)
        self.free_at_s = now_s + wait_s + duration_s
        self.busy_s += duration_s
        self.transfers += 1
        return wait_s
