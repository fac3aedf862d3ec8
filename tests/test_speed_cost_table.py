"""The cost model's integer tables equal the interpolated curves at every integer they cover."""

from __future__ import annotations

import numpy as np
import pytest

from sim.hardware.cost_model import TABLE_SIZE, CostModel, calibrated_configs, load_cost_model
from sim.hardware.curves import PiecewiseLinear

CONFIGS = [*calibrated_configs()[:3], ("llama-2-7b", "h100-sxm", 1), ("llama-2-7b", "l40s", 1)]


def _curves(cost: CostModel) -> list[tuple[PiecewiseLinear, list[float]]]:
    # The all-reduce tables are their own definition (an envelope over token counts, test_all_reduce.py);
    # the lookup-versus-fallback test below covers them.
    pairs = [(cost._linear, cost._linear_t), (cost._lm_head, cost._lm_head_t)]
    if cost._cpu is not None:
        pairs.append((cost._cpu, cost._cpu_t))
    assert len(pairs) >= 3, "the test should cover the CPU-overhead curve too"
    return pairs


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_table_equals_curve_at_every_integer(config: tuple[str, str, int]) -> None:
    cost = load_cost_model(*config)
    for curve, table in _curves(cost):
        assert len(table) == TABLE_SIZE
        mismatches = [x for x in range(TABLE_SIZE) if table[x] != curve(x)]
        assert mismatches == [], f"{config}: table differs from the curve at {mismatches[:5]}"


def test_table_covers_below_first_knot_and_tail() -> None:
    curve = PiecewiseLinear([4.0, 10.0, 20.0, 40.0], [1.0, 2.0, 2.5, 9.0])
    table = curve.table(100)
    assert table[0] == curve(0) == max(0.0, 1.0 + (2.0 - 1.0) / 6.0 * -4.0)
    assert table[99] == curve(99) and table[99] > 9.0  # extrapolated tail
    assert [table[x] for x in range(100)] == [curve(x) for x in range(100)]


@pytest.mark.parametrize("config", CONFIGS[:2], ids=lambda c: "-".join(map(str, c)))
def test_time_from_totals_lookup_equals_curve_path(config: tuple[str, str, int]) -> None:
    """Python ints take the table; numpy ints take the curves: both give the same bits."""
    cost = load_cost_model(*config)
    rng = np.random.default_rng(0)
    for _ in range(3000):
        prefill_seqs = int(rng.integers(0, 4))
        prefill = int(rng.integers(prefill_seqs, 9000)) if prefill_seqs else 0
        decodes = int(rng.integers(0 if prefill else 1, 600))
        work = float(prefill * rng.integers(1, 3000))
        kv = int(rng.integers(decodes, decodes * 4000 + 1))
        fast = cost.time_from_totals_s(prefill, prefill_seqs, work, decodes, kv)
        slow = cost.time_from_totals_s(np.int64(prefill), np.int64(prefill_seqs), work, np.int64(decodes), kv)
        assert fast == slow
    big = cost.time_from_totals_s(TABLE_SIZE + 5, 1, 1e9, 0, 0)  # past the table: the curves
    assert big == cost.time_from_totals_s(np.int64(TABLE_SIZE + 5), np.int64(1), 1e9, np.int64(0), 0)
