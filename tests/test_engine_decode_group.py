"""The decode group's O(1) aggregates against a brute-force per-sequence model."""

from __future__ import annotations

from budget import examples
from fakes import decode_group_ops
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.serving.sequences import DECODE, DecodeGroup, Seq

ops = decode_group_ops(max_size=80)


@settings(max_examples=examples(2))
@given(st.sampled_from([1, 3, 4, 16]), ops)
def test_aggregates_match_brute_force(block_size, operations):
    group = DecodeGroup(block_size)
    members: dict[int, list] = {}  # rid -> [seq, context, generated]
    for rid, op in enumerate(operations):
        if op[0] == "add":
            _, prompt, generated_before, extra = op
            seq = Seq(rid, (0.0, rid), prompt, generated_before + 1 + extra, generated_before)
            group.add(seq)  # its prefill emitted token number generated_before + 1
            members[rid] = [seq, prompt + generated_before + 1, generated_before + 1]
        elif op[0] == "remove" and members:
            victim = sorted(members)[op[1] % len(members)]
            group.remove(members.pop(victim)[0])
        elif op[0] == "step":
            crossing = sum(1 for _, ctx, _ in members.values() if (ctx - 1) % block_size == 0)
            assert group.blocks_needed() == crossing
            done = {seq.rid for seq in group.advance()}
            for member in members.values():
                member[1] += 1
                member[2] += 1
            assert done == {
                rid for rid, (seq, _, gen) in members.items() if gen == seq.output_tokens
            }
            for rid in done:
                group.remove(members.pop(rid)[0])
        assert group.count == len(members)
        assert group.kv_tokens == sum(ctx for _, ctx, _ in members.values())
        ahead = [sum(1 for _, ctx, _ in members.values() if (ctx + j) % block_size == 0) for j in range(block_size)]
        assert group.block_need_cycle() == ahead  # new blocks of the steps after the next, if no one leaves
        for seq, ctx, gen in members.values():
            assert seq.phase == DECODE and group.context(seq) == ctx and group.generated(seq) == gen
            assert group.cached_blocks(seq) == -(-(ctx - 1) // block_size)
