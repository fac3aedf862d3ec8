"""Speculative decoding in the engine: verification passes, KV for draft tokens, draft time.

With ``speculative`` set on a policy, every decode step of a sequence drafts gamma_r =
min(gamma, tokens it still needs - 1) tokens (capped so a request never drafts past its
last token) and one target pass verifies gamma_r + 1 tokens per sequence. The pass is
priced like a prefill chunk of gamma_r + 1 tokens against the sequence's cached context
(chunk x (context + chunk / 2) attention work; linear-layer tokens grow, weight reads do
not), with the LM head sampling every verified position, plus the drafting:

* ``draft_model``: gamma decode passes of the draft model's own cost model over the batch;
* ``eagle``: gamma x ``draft_cost_ratio`` x a target decode step of the batch;
* ``ngram``: nothing (prompt lookup on the host).

KV: the blocks for all gamma_r + 1 written positions are allocated before the pass (the
policy's ``try_decode_step`` asked for exactly these) and the blocks of rejected positions
are released after it, so a replica never holds more than its capacity, speculative blocks
included. Which tokens are accepted comes from :mod:`sim.serving.spec_acceptance`.

The policy still only decides (``plan.decode``); this module is the engine side. With
speculation off none of it runs and the engine is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.config import SpeculativeConfig
from sim.serving.pricing import CostModelLike
from sim.serving.sequences import DECODE, Seq
from sim.serving.spec_acceptance import AcceptanceTrace, build_trace

if TYPE_CHECKING:
    from sim.serving.state import CostTotals, ReplicaState


EAGLE_FALLBACK_RATIO = 0.05
"""A draft step as a share of a target decode step, for cost models without a per-component breakdown."""


@dataclass(frozen=True)
class Speculation:
    """One run's speculative-decoding setup, shared by its replicas.

    Attributes:
        config: the policy's ``speculative`` block.
        trace: accepted tokens per request and output position.
        target: the target model's cost model (eagle drafts are priced as a fraction of it).
        draft: the draft model's cost model (method draft_model), else None.
    """

    config: SpeculativeConfig
    trace: AcceptanceTrace
    target: CostModelLike
    draft: CostModelLike | None = None

    @property
    def gamma(self) -> int:
        """Draft tokens per sequence per step."""
        return self.config.num_speculative_tokens

    def draft_s(self, seqs_by_pass: list[int], kv_by_pass: list[int]) -> float:
        """Time of the draft passes: pass j drafts for ``seqs_by_pass[j]`` sequences
        attending to ``kv_by_pass[j]`` tokens in all."""
        method = self.config.method
        if method == "ngram":
            return 0.0
        if method == "eagle" and self.config.draft_cost_ratio is None:
            step = self._eagle_step_s
            return sum(step(n, kv) for n, kv in zip(seqs_by_pass, kv_by_pass, strict=True) if n)
        if method == "eagle":
            price, scale = self.target.time_from_totals_s, self.config.draft_cost_ratio
        else:
            assert self.draft is not None, "method draft_model without a draft cost model"
            price, scale = self.draft.time_from_totals_s, 1.0
        assert scale is not None
        total = sum(price(0, 0, 0.0, n, kv) for n, kv in zip(seqs_by_pass, kv_by_pass, strict=True) if n)
        return scale * total

    def _eagle_step_s(self, seqs: int, kv_tokens: int) -> float:
        """One forward of an EAGLE head for ``seqs`` sequences: one decoder layer of the target's shape
        (its linear ops, attention over the sequences' KV, its all-reduces), the LM head over every
        sequence, and the step's own host and launch time (``draft_step_ms``).

        EAGLE's head is a single transformer layer on the target's hidden states, decoded through
        the target's (or a same-width) LM head (Li et al., ICML 2024; EAGLE-3, 2025); vLLM runs one
        such forward per draft token (``EagleProposer.propose``). A cost model without a breakdown
        (test fakes) prices the layer and head as :data:`EAGLE_FALLBACK_RATIO` of a decode step.
        """
        host_s = self.config.draft_step_ms * 1e-3
        breakdown = getattr(self.target, "breakdown_from_totals_s", None)
        layers = getattr(self.target, "num_layers", None)
        if breakdown is None or not layers:
            return EAGLE_FALLBACK_RATIO * self.target.time_from_totals_s(0, 0, 0.0, seqs, kv_tokens) + host_s
        parts = breakdown(0, 0, 0.0, seqs, kv_tokens)
        layer_s = (parts["linear"] + parts.get("attention_decode", 0.0) + parts.get("all_reduce", 0.0)) / layers
        return layer_s + parts["lm_head"] + host_s

    def correction_s(self, counted_rows: int, sampled_rows: int, verify: CostTotals) -> float:
        """What the prefill form misses in a verification pass (0 for a cost model without a breakdown).

        * LM head: the totals count ``counted_rows`` sampled rows (one per piece), verification
          samples ``sampled_rows`` (every verified position).
        * Attention: the prefill form was fitted on compute-bound prefills and prices a short
          chunk's KV reads below what one decode step reads (about 1/5 for 5 tokens against a
          long context), but every verified sequence reads its whole KV at least once; the
          verification's attention is the larger of the prefill form and the decode form of the
          same sequences (a roofline max).
        """
        breakdown = getattr(self.target, "breakdown_from_totals_s", None)
        if breakdown is None:
            return 0.0
        extra = 0.0
        if sampled_rows > counted_rows:
            extra += breakdown(0, 0, 0.0, sampled_rows, 0)["lm_head"] - breakdown(0, 0, 0.0, counted_rows, 0)["lm_head"]
        tokens, seqs, work, kv_tokens = verify[0], verify[1], verify[2], verify[4]
        if seqs:
            as_prefill = breakdown(tokens, seqs, work, 0, 0).get("attention_prefill", 0.0)
            as_decode = breakdown(0, 0, 0.0, seqs, kv_tokens).get("attention_decode", 0.0)
            extra += max(0.0, as_decode - as_prefill)
        return extra


def make_speculation(
    config: SpeculativeConfig, stream: Any, seed: int, target: CostModelLike, draft: CostModelLike | None
) -> Speculation:
    """The setup of one run: the acceptance trace of ``stream`` and the cost models."""
    return Speculation(config, build_trace(config, stream.output_tokens, seed), target, draft)


class SpeculativeCostModel:
    """A replica's cost model: the target's time for the pass totals plus that pass's drafting.

    The decode decoration computes the extra time when the replica prepares the pass
    (``begin``), just before the worker prices it, so the worker's one cost call stays unchanged.
    """

    def __init__(self, target: CostModelLike, decode: SpeculativeDecode) -> None:
        self._target = target.time_from_totals_s
        self._decode = decode

    def time_from_totals_s(
        self,
        num_prefill_tokens: int,
        num_prefill_seqs: int,
        prefill_attn_work: float,
        num_decode_seqs: int,
        decode_kv_tokens: int,
    ) -> float:
        """Target time of the totals plus the extra time of the pass being prepared."""
        totals = (num_prefill_tokens, num_prefill_seqs, prefill_attn_work, num_decode_seqs, decode_kv_tokens)
        return self._target(*totals) + self._decode.pass_extra_s


class SpeculativeDecode:
    """Decorates one replica's decode steps with drafting and verification (module docstring).

    The replica state (:class:`~sim.serving.state.ReplicaState`, its ``speculation``) calls
    it instead of its plain decode step; it uses the state's public parts only (``running``,
    ``decoders``, ``memory``, ``records``), so it runs on every memory model. Per request it
    counts ``spec_steps``, ``spec_proposed_tokens`` and ``spec_accepted_tokens`` in the records.

    Args:
        speculation: the run's setup, shared by its replicas.

    Attributes:
        pass_extra_s: draft and correction time of the pass ``begin`` last prepared.
    """

    def __init__(self, speculation: Speculation) -> None:
        self.speculation = speculation
        self.pass_extra_s = 0.0
        self._gamma = speculation.gamma
        self._pending: list[tuple[Seq, int, int]] = []  # (member, drafted, accepted) of the pass in flight
        self._surplus_blocks = 0  # blocks of positions the pass in flight will reject

    # ------------------------------------------------------------------ ledger questions
    def blocks_needed(self, state: ReplicaState, steps: int = 1) -> int:
        """Blocks the next step needs: every decoding member writes gamma_r + 1 positions."""
        _one_step(steps)
        if not state.memory.grows_per_step:
            return 0
        return sum(self._step_blocks(state, seq) for seq in _members(state))

    def growth_blocks(self, state: ReplicaState, seq: Seq, steps: int = 1) -> int:
        """Blocks member ``seq`` needs for the next step (what preempting it gives back)."""
        _one_step(steps)
        if not state.memory.grows_per_step or seq.phase != DECODE:
            return 0
        return self._step_blocks(state, seq)

    # ------------------------------------------------------------------ the pass
    def begin(self, state: ReplicaState, plan: Any) -> tuple[int, int, float, int]:
        """Draw the members' accepted tokens and allocate their draft positions' blocks; price the
        drafting. Returns the verification as prefill terms: (tokens, pieces, attention work,
        cached context read)."""
        if plan.charge_idle_slots or plan.steps > 1:
            raise RuntimeError("speculative decoding runs only with iteration-level, single-step plans")
        tokens, work, context, seqs_by_pass, kv_by_pass = self._verification(state)
        verified = len(self._pending)
        spec = self.speculation
        verify = (tokens, verified, work, 0, context + verified)  # decode KV: cached + fed-in token
        prefills = len(plan.prefill)
        self.pass_extra_s = spec.draft_s(seqs_by_pass, kv_by_pass) + spec.correction_s(
            prefills + verified, prefills + tokens, verify
        )
        return tokens, verified, work, context

    def end(self, state: ReplicaState) -> None:
        """Roll back the rejected positions' blocks and credit the accepted tokens (the step's own
        token per member is the state's)."""
        self.pass_extra_s = 0.0
        if not self._pending:
            return
        if self._surplus_blocks:
            state.memory.give_back(self._surplus_blocks)
            self._surplus_blocks = 0
        records, credit, extra = state.records, state.decoders.credit_extra, 0
        for seq, drafted, accepted in self._pending:
            credit(seq, accepted)
            extra += accepted
            rid = seq.rid
            records.spec_steps[rid] += 1
            records.spec_proposed_tokens[rid] += drafted
            records.spec_accepted_tokens[rid] += accepted
        state.outstanding_tokens -= extra
        self._pending.clear()

    def _verification(self, state: ReplicaState) -> tuple[int, float, int, list[int], list[int]]:
        """Draw each member's accepted tokens, allocate its draft positions' blocks; return
        (verified tokens, attention work, cached context read, draft passes' sequences,
        draft passes' KV tokens)."""
        decoders, memory, trace = state.decoders, state.memory, self.speculation.trace
        blocks_for, gamma, pending = memory.blocks_for, self._gamma, self._pending
        paged = memory.grows_per_step
        by_draft = [0] * (gamma + 1)  # members by tokens drafted, and their contexts
        context_by_draft = [0] * (gamma + 1)
        tokens, work, cached, allocate, keep = 0, 0.0, 0, 0, 0
        for seq in _members(state):
            context = decoders.context(seq)
            generated = context - seq.prompt_tokens
            drafted = min(gamma, seq.output_tokens - generated - 1)
            accepted = trace.accepted(seq.rid, generated, drafted) if drafted else 0
            chunk = drafted + 1
            tokens += chunk
            work += chunk * (context - 1 + chunk / 2)
            cached += context - 1
            if paged:
                base = blocks_for(context - 1)
                allocate += blocks_for(context + drafted) - base
                keep += blocks_for(context + accepted) - base
            by_draft[drafted] += 1
            context_by_draft[drafted] += context
            pending.append((seq, drafted, accepted))
        if paged:
            memory.allocate(allocate)
            self._surplus_blocks = allocate - keep
        seqs_by_pass, kv_by_pass = _draft_passes(by_draft, context_by_draft)
        return tokens, work, cached, seqs_by_pass, kv_by_pass

    def _step_blocks(self, state: ReplicaState, seq: Seq) -> int:
        context = state.decoders.context(seq)
        drafted = min(self._gamma, seq.output_tokens - (context - seq.prompt_tokens) - 1)
        blocks_for = state.memory.blocks_for
        return blocks_for(context + drafted) - blocks_for(context - 1)


def _members(state: ReplicaState) -> list[Seq]:
    return [seq for seq in state.running.values() if seq.phase == DECODE]


def _one_step(steps: int) -> None:
    if steps != 1:
        raise ValueError(f"speculative decoding plans one decode step at a time, asked {steps}")


def _draft_passes(by_draft: list[int], context_by_draft: list[int]) -> tuple[list[int], list[int]]:
    """Draft pass j runs for the members drafting more than j tokens, each attending to context + j."""
    gamma = len(by_draft) - 1
    seqs_by_pass, kv_by_pass = [0] * gamma, [0] * gamma
    seqs = kv = 0
    for j in range(gamma - 1, -1, -1):  # members drafting > j tokens: a suffix sum
        seqs += by_draft[j + 1]
        kv += context_by_draft[j + 1]
        seqs_by_pass[j], kv_by_pass[j] = seqs, kv + j * seqs
    return seqs_by_pass, kv_by_pass
