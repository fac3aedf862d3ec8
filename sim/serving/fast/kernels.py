"""The four built-in policies' decisions over a :class:`FastReplica`: the compact view/plan form.

Each kernel is one policy's ``schedule(view) -> IterationPlan`` (and the KV ledger's answers it
asks for) written over the replica's ints and lists: ``decide(now_s)`` leaves the plan in
``pieces`` (prefill pieces), ``preempt`` (victims), ``decode``, ``pad`` (static padding) and
``wake_at_s``, and returns whether it runs a pass. The policies in :mod:`sim.policies` stay the
reference; a kernel is used only for the policy class it mirrors
(:func:`sim.serving.fast.paths.fast_path_refusal`), and the property tests hold both paths to
identical records. A policy change that a kernel does not follow turns the fast path off for
that policy (``KERNEL_SOURCES``), never gives different results.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from sim.metrics.records import WAITING
from sim.policies.base import VLLM_WATERMARK_FRACTION
from sim.serving.fast.group import DECODE
from sim.serving.fast.replica import FastReplica, Totals

_NONE: list = []  # the plan parts of a pass that has none (never appended to)
_NO_CHUNK, _LEDGER = -1, -2
"""The chunked kernel's plan, for its ``begin``: made without the ledger or joiners, with no prefill chunk (else
the chunk's slot), or one to begin in full (``FastReplica.begin``)."""


class Kernel(FastReplica):
    """A replica state that decides its own passes as one policy would.

    Attributes:
        pieces, preempt, decode, pad, wake_at_s: the last plan (see the module docstring).
    """

    def __init__(self, policy: object, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.pieces: list[tuple[int, int]] = _NONE
        self.preempt: list[int] = _NONE
        self.decode = False
        self.wake_at_s: float | None = None

    def decide(self, now_s: float) -> bool:  # pragma: no cover - every kernel overrides it
        """Plan the pass at ``now_s``; whether it runs one."""
        raise NotImplementedError

    def _admit_reserved(self, room: int, limit: float = float("inf")) -> list[tuple[int, int]]:
        """``admit_waiting`` under reserve memory without a token budget: FIFO while the reservations fit."""
        pieces: list[tuple[int, int]] = []
        free = self.total_blocks - self.used_blocks
        reserve, size, status = self.reserve_tokens, self.block_size, self._status
        prompt, generated = self._prompt, self.cols.generated_tokens
        for rid in self.waiting:
            if status[rid] != WAITING:
                continue
            if room <= 0:
                break
            length = prompt[rid]
            blocks = -(-(length + reserve) // size)  # type: ignore[operator]
            if blocks > free:
                break
            free -= blocks
            pieces.append((rid, length + generated[rid]))
            room -= 1
        return pieces


class ContinuousKernel(Kernel):
    """``ContinuousPolicy.schedule``: decode everyone, FIFO joiners while slots and reservations last."""

    def __init__(self, policy: object, *args: object, **kwargs: object) -> None:
        super().__init__(policy, *args, **kwargs)
        self.max_batch_size: int = policy.max_batch_size  # type: ignore[attr-defined]

    def decide(self, now_s: float) -> bool:
        """See the class docstring."""
        self.pop_abandoned_heads()
        self.decode = decode = self.count > 0
        room = self.max_batch_size - len(self.running)
        pieces = self._admit_reserved(room) if self.waiting_count and room > 0 else _NONE
        self.pieces = pieces
        return decode or bool(pieces)


class StaticKernel(Kernel):
    """``StaticPolicy.schedule``: continue the batch, or start one when full or waited long enough."""

    def __init__(self, policy: object, *args: object, **kwargs: object) -> None:
        super().__init__(policy, *args, **kwargs)
        self.max_batch_size: int = policy.max_batch_size  # type: ignore[attr-defined]
        self.max_wait_s: float = policy.max_wait_s  # type: ignore[attr-defined]
        self.pad_finished: bool = policy.pad_finished  # type: ignore[attr-defined]

    def decide(self, now_s: float) -> bool:
        """See the class docstring."""
        self.pop_abandoned_heads()
        self.wake_at_s = None
        if self.running:
            self.pieces, self.decode, self.pad = _NONE, True, self.pad_finished
            return True
        self.decode = self.pad = False
        self.pieces = _NONE
        if not self.waiting_count:
            return False
        pieces = self._admit_reserved(self.max_batch_size)
        full = len(pieces) == self.max_batch_size or len(pieces) < self.waiting_count
        deadline_s = self.oldest_waiting_since_s() + self.max_wait_s
        if full or now_s >= deadline_s:
            self.pieces = pieces
            return bool(pieces)
        self.wake_at_s = deadline_s
        return False


class _PagedLedger(Kernel):
    """The KV ledger's answers under paged memory (``sim.serving.ledger.KVLedger``), for one plan."""

    def _new_plan(self) -> None:
        self.free = self.total_blocks - self.used_blocks
        self.taken: dict[int, int] = {}
        self.decode_steps = 0
        self.released: list[int] = []
        self.pieces, self.preempt = [], []

    def _try_decode_step(self) -> bool:
        if self.decode_steps:
            return True
        need = self.per_residue[-self.step % self.block_size]
        if self.released:
            need -= sum(self._growth(rid) for rid in self.released)
        if need > self.free:
            return False
        self.free -= need
        self.decode_steps = 1
        return True

    def _growth(self, rid: int) -> int:
        slot = self.running[rid]
        return int(self.slots.phase[slot] == DECODE and self.crosses_next(slot))

    def _take(self, rid: int, blocks: int) -> bool:
        if blocks > self.free:
            return False
        self.free -= blocks
        if blocks:
            self.taken[rid] = self.taken.get(rid, 0) + blocks
        return True

    def _try_extend(self, rid: int, tokens: int) -> bool:
        slot, slots = self.running[rid], self.slots
        need = -(-(slots.computed[slot] + tokens) // self.block_size) - slots.blocks[slot]  # ``blocks_for``, inline
        return self._take(rid, need if need > 0 else 0)

    def _ledger_release(self, rid: int) -> None:
        """Count running request ``rid`` as preempted in this plan: its blocks and promises come back."""
        self.free += self.held(self.running[rid]) + self.taken.pop(rid, 0)
        if self.decode_steps:
            self.free += self._growth(rid)
        else:
            self.released.append(rid)

    def _preempt_until(self, fits: Callable[[], bool], requester: int | None = None) -> bool:
        """``sim.policies.base.preempt_until``."""
        if fits():
            return True
        preempt = self.preempt
        chosen = set(preempt)
        for _, victim in reversed(self.order):
            if victim in chosen:
                continue
            self._ledger_release(victim)
            preempt.append(victim)
            if victim == requester:
                return False
            if fits():
                return True
        return False

    def _admit_paged(self, room: int, budget: int, keep_free: float, *, chunked: bool, oversize_alone: bool) -> int:
        """``sim.policies.base.admit_waiting`` under paged memory; returns the budget left."""
        pieces, status = self.pieces, self._status
        keep = int(keep_free * self.total_blocks)
        for rid in self.waiting:
            if status[rid] != WAITING:
                continue
            if room <= 0 or budget <= 0:
                break
            tokens = self.queued_tokens(rid)
            whole = tokens
            if chunked:
                tokens = min(tokens, int(budget))
            elif tokens > budget and not (oversize_alone and not pieces):
                break
            blocks = self.blocks_for(whole if self.whole_prompt else tokens)
            if blocks + keep > self.free:
                break
            self._take(rid, blocks)
            pieces.append((rid, tokens))
            room -= 1
            budget -= tokens
        return budget

    def _watermark(self) -> float:
        return VLLM_WATERMARK_FRACTION if self.running else 0.0


class PagedKernel(_PagedLedger):
    """``PagedPolicy.schedule`` (one scheduler step): prefill-first, else decode with preemption."""

    def __init__(self, policy: object, *args: object, **kwargs: object) -> None:
        super().__init__(policy, *args, **kwargs)
        self.max_batch_size: int = policy.max_batch_size  # type: ignore[attr-defined]
        self.max_num_batched_tokens: int = policy.max_num_batched_tokens  # type: ignore[attr-defined]

    def decide(self, now_s: float) -> bool:
        """See the class docstring."""
        self.pop_abandoned_heads()
        room = self.max_batch_size - len(self.running)
        if self.waiting_count and room > 0:
            self._new_plan()
            self._admit_paged(room, self.max_num_batched_tokens, self._watermark(), chunked=False, oversize_alone=True)
            if self.pieces:
                self.decode = False
                return True
        elif self.count and self.per_residue[-self.step % self.block_size] <= self.total_blocks - self.used_blocks:
            self.pieces, self.preempt, self.decode = _NONE, _NONE, True  # the step fits: no victim, no ledger
            return True
        else:
            self._new_plan()
        if self.count:
            self._preempt_until(self._try_decode_step)
            self.decode = True
            return True
        self.decode = False
        return False


class ChunkedKernel(_PagedLedger):
    """``ChunkedPrefillPolicy.schedule``: decodes first, then chunks for running, then for waiting requests."""

    def __init__(self, policy: object, *args: object, **kwargs: object) -> None:
        super().__init__(policy, *args, **kwargs)
        self.chunk_size: int = policy.chunk_size  # type: ignore[attr-defined]
        self.max_running: int = policy.max_running  # type: ignore[attr-defined]
        self._chunk_slot = _LEDGER  # the plan's one prefill chunk (see ``_NO_CHUNK``)
        self._chunk_blocks = 0  # the new blocks of a plan made without the ledger: the decode step's and the chunk's

    def decide(self, now_s: float) -> bool:
        """See the class docstring.

        The plan is made in one pass over local block counts while it preempts no one: the decode step's
        blocks fit, and so do those of every prefill chunk it continues. Without a preemption the ledger
        of the full plan (``_plan_with_ledger``) only counts free blocks down (``_take``), its decoders and
        budget stay as they were, and the watermark sees the same running requests: the same plan.
        """
        waiting = self.waiting
        if waiting and self._status[waiting[0]] != WAITING:
            self.pop_abandoned_heads()
        count = self.count
        step_blocks = self.per_residue[-self.step % self.block_size] if count else 0
        free = self.total_blocks - self.used_blocks - step_blocks
        if free < 0:
            return self._plan_with_ledger()
        budget = self.chunk_size - count
        size = self.block_size
        pieces: list[tuple[int, int]] = _NONE
        chunk_slot = _NO_CHUNK
        chunk_blocks = step_blocks
        prefilling = self.prefilling
        if prefilling and budget > 0:
            running, slots = self.running, self.slots
            computed, target, blocks = slots.computed, slots.target, slots.blocks
            pieces = []
            for _, rid in prefilling:
                if budget <= 0:
                    break
                slot = running[rid]
                done = computed[slot]
                tokens = target[slot] - done
                if tokens > budget:
                    tokens = budget
                grow = -(-(done + tokens) // size) - blocks[slot]
                if grow > 0:
                    if grow > free:
                        return self._plan_with_ledger()  # a preemption may follow
                    free -= grow
                    chunk_blocks += grow
                pieces.append((rid, tokens))
                budget -= tokens
                chunk_slot = slot
            if len(pieces) > 1:
                chunk_slot = _LEDGER
        if budget > 0 and self.waiting_count and len(self.running) < self.max_running:
            if pieces is _NONE:
                pieces = []
            chunk_slot = _LEDGER
            self._admit_free(pieces, free, self.max_running - len(self.running), budget)
        self.pieces, self.preempt, self.decode = pieces, _NONE, count > 0
        self._chunk_slot, self._chunk_blocks = chunk_slot, chunk_blocks
        return count > 0 or bool(pieces)

    def _plan_with_ledger(self) -> bool:
        """The full plan, with the ledger's preemptions."""
        self._chunk_slot = _LEDGER
        self._new_plan()
        if self.count and not self._try_decode_step():  # ``_preempt_until`` asks the same first (calls saved)
            self._preempt_until(self._try_decode_step)
        preempt = self.preempt  # (filled in place by the preemptions below)
        decodes = self._decoders_left() if preempt else self.count
        budget = self._continue_prefills(self.chunk_size - decodes)
        still = self._decoders_left() if preempt else self.count
        self.decode = still > 0
        budget += decodes - still
        room = self.max_running - (len(self.running) - len(self.preempt))
        if self.waiting_count and room > 0 and budget > 0:
            self._admit_paged(room, budget, self._watermark(), chunked=True, oversize_alone=False)
        return self.decode or bool(self.pieces)

    def _admit_free(self, pieces: list[tuple[int, int]], free: int, room: int, budget: int) -> None:
        """``_admit_paged(room, budget, self._watermark(), chunked=True, oversize_alone=False)`` over ``free``
        blocks instead of the ledger's."""
        status, prompt, generated = self._status, self._prompt, self.cols.generated_tokens
        keep = int(self._watermark() * self.total_blocks)
        size, whole_prompt = self.block_size, self.whole_prompt
        for rid in self.waiting:
            if status[rid] != WAITING:
                continue
            if room <= 0 or budget <= 0:
                break
            whole = prompt[rid] + generated[rid]
            tokens = min(whole, int(budget))
            blocks = -(-(whole if whole_prompt else tokens) // size)
            if blocks + keep > free:
                break
            free -= blocks
            pieces.append((rid, tokens))
            room -= 1
            budget -= tokens

    def begin(self, pieces: list[tuple[int, int]], preempt: list[int], decode: bool, pad: bool, now_s: float) -> Totals:
        """``FastReplica.begin``, in one step for a plan made without the ledger or joiners, of decodes and at
        most one continued chunk (its new blocks counted by the plan)."""
        slot = self._chunk_slot
        if slot == _LEDGER:
            return super().begin(pieces, preempt, decode, pad, now_s)
        self._chunk_slot = _LEDGER
        if self._chunk_blocks:
            self._allocate(self._chunk_blocks)
        if slot == _NO_CHUNK:  # a pure decode plan
            self.prefill_context_tokens = 0
            return 0, 0, 0.0, self.count, self.kv_tokens
        slots = self.slots
        done = slots.computed[slot]
        tokens = pieces[0][1]
        grow = -(-(done + tokens) // self.block_size) - slots.blocks[slot]
        if grow > 0:
            slots.blocks[slot] += grow
        slots.computed[slot] = done + tokens
        self.prefill_context_tokens = done
        self.outstanding_tokens -= tokens
        attention_work = tokens * (done + tokens / 2)  # as ``_begin_prefills`` sums it: 0.0 + x is x
        if decode:
            return tokens, 1, attention_work, self.count, self.kv_tokens
        return tokens, 1, attention_work, 0, 0

    def _decoders_left(self) -> int:
        if not self.preempt:
            return self.count
        running, phase = self.running, self.slots.phase
        return self.count - sum(1 for rid in self.preempt if phase[running[rid]] == DECODE)

    def _continue_prefills(self, budget: int) -> int:
        pieces, slots = self.pieces, self.slots
        for _, rid in self.prefilling:  # not changed while a plan is made (preemptions apply in ``begin``)
            if budget <= 0:
                break
            if rid in self.preempt:
                continue
            slot = self.running[rid]
            tokens = min(budget, slots.target[slot] - slots.computed[slot])
            if self._try_extend(rid, tokens) or self._preempt_until(
                partial(self._try_extend, rid, tokens), requester=rid
            ):
                pieces.append((rid, tokens))
                budget -= tokens
        return budget
