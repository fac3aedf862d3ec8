"""Identity of prompt content: which requests share which prompt prefixes.

Lengths alone cannot say whether two prompts share tokens, so a stream may carry a
:class:`PromptContent`: for each request a list of *unit ids*, one per ``unit_tokens``
tokens of its content (the last unit may be partial). A unit id names the whole prefix up
to the end of its unit (a chained hash, as Mooncake's ``hash_ids`` of 512-token blocks):
two requests whose k-th unit ids are equal have identical first k units.

The engine maps units onto its own KV blocks with :meth:`PromptContent.block_keys`: block
b (tokens [b*B, (b+1)*B)) ends inside unit u = ((b+1)*B - 1) // U at offset
o = (b+1)*B - u*U, and its key is ``id[u] * (U + 1) + o``. Because the unit id already
names the prefix before it, the pair names the block's whole prefix: exactly vLLM's
"hash of (previous block's key, block tokens)". With B = 16 and U = 512 one Mooncake hash
covers 32 engine blocks with distinct keys. Only blocks that end inside the content are
keyed; a prompt's last partial block never is (vLLM caches full blocks only).

Requests without content identity (a stream without ``content``) need keys only once they
are preempted (their recompute can hit their own freed blocks): then they get keys no
other request has (negative numbers, :func:`unique_block_keys`); see
:mod:`sim.serving.prefix_memory`. A request's own tokens (its generated ones, and prompt tokens
the content does not describe) get such keys too: no other request has them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PromptContent:
    """Unit ids of each request's content, in CSR form.

    Attributes:
        unit_tokens: tokens per unit (512 for Mooncake traces).
        ids: all requests' unit ids concatenated (int64, >= 0).
        starts: request r's ids are ``ids[starts[r]:starts[r + 1]]`` (len = requests + 1).
        content_tokens: tokens the ids describe per request (its prompt, or prompt plus
            output for a conversation turn whose answer the next turn repeats).
    """

    unit_tokens: int
    ids: np.ndarray
    starts: np.ndarray
    content_tokens: np.ndarray

    def __post_init__(self) -> None:
        if self.unit_tokens < 1:
            raise ValueError("unit_tokens must be >= 1")
        if len(self.starts) != len(self.content_tokens) + 1:
            raise ValueError("starts must have one entry more than content_tokens")

    def __len__(self) -> int:
        return len(self.content_tokens)

    def block_keys(self, rid: int, block_size: int) -> list[int]:
        """Keys of request ``rid``'s full KV blocks of ``block_size`` tokens, in order."""
        units = self.ids[self.starts[rid] : self.starts[rid + 1]]
        tokens = min(int(self.content_tokens[rid]), len(units) * self.unit_tokens)
        return _keys(units, self.unit_tokens, tokens // block_size, block_size)

    def block_count(self, rid: int, block_size: int) -> int:
        """How many keys :meth:`block_keys` gives request ``rid`` (without building them)."""
        units = int(self.starts[rid + 1] - self.starts[rid])
        return min(int(self.content_tokens[rid]), units * self.unit_tokens) // block_size

    def permuted(self, order: np.ndarray) -> PromptContent:
        """The same contents, request ``i`` of the result being request ``order[i]`` of this."""
        lengths = np.diff(self.starts)[order]
        starts = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        ids = np.concatenate([self.ids[self.starts[r] : self.starts[r + 1]] for r in order]) if len(order) else self.ids
        return PromptContent(self.unit_tokens, ids.astype(np.int64), starts, self.content_tokens[order])


def _keys(units: np.ndarray, unit_tokens: int, blocks: int, block_size: int) -> list[int]:
    ends = (np.arange(1, blocks + 1, dtype=np.int64)) * block_size
    unit = (ends - 1) // unit_tokens
    offset = ends - unit * unit_tokens
    return (units[unit] * (unit_tokens + 1) + offset).tolist()


def unique_block_keys(rid: int, tokens: int, block_size: int, first: int = 0) -> list[int]:
    """Keys nobody else has, for request ``rid``'s full blocks ``first`` to ``tokens // block_size`` (excluded).

    Block b's key depends on (rid, b) only, so the same block always gets the same key (a request's
    generated tokens are its own: vLLM hashes them into its blocks, and no other request has them).
    """
    base = -(rid + 1) << 24  # 2**24 blocks per request: far beyond any context window
    return list(range(base + first, base + tokens // block_size))


def reuse_bound_tokens(content: PromptContent, prompt_tokens: np.ndarray, block_size: int) -> int:
    """Prompt tokens an unbounded cache serves if requests run one after another.

    Every full prompt block whose key appeared in an earlier request's content hits,
    except that at least one prompt token is always computed (vLLM: the last token's
    logits are needed). Computed independently of the engine, from the ids alone.
    """
    seen: set[int] = set()
    hits = 0
    for rid, prompt in enumerate(prompt_tokens.tolist()):
        keys = content.block_keys(rid, block_size)
        limit = (prompt - 1) // block_size
        run = 0
        while run < min(limit, len(keys)) and keys[run] in seen:
            run += 1
        hits += run
        seen.update(keys)
    return hits * block_size
