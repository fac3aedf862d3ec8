"""Length distributions: clamps, inclusive bounds, shapes, and a property over all configs."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import (
    EmpiricalLength,
    FixedLength,
    LognormalLength,
    NormalLength,
    UniformLength,
    ZipfLength,
)
from sim.errors import UserError
from sim.workload.lengths import make_length_sampler, sample_lengths

DATA = Path(__file__).resolve().parent / "data"


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_fixed_is_constant() -> None:
    values = sample_lengths(FixedLength(value=77), 1000, _rng())
    assert values.dtype == np.int64 and set(values.tolist()) == {77}


def test_uniform_is_inclusive_and_flat() -> None:
    values = sample_lengths(UniformLength(low=3, high=7), 50_000, _rng())
    counts = np.bincount(values, minlength=8)[3:]
    assert values.min() == 3 and values.max() == 7 and counts.sum() == 50_000
    # Each of 5 values: p = 0.2, binomial sd = sqrt(n p (1-p)) ~ 89.
    assert np.all(np.abs(counts - 10_000) < 5 * 89)


def test_uniform_single_value() -> None:
    assert set(sample_lengths(UniformLength(low=9, high=9), 100, _rng()).tolist()) == {9}


def test_normal_is_rounded_and_clamped_at_both_ends() -> None:
    config = NormalLength(mean=100, std=200, min=10, max=150)
    values = sample_lengths(config, 20_000, _rng())
    assert values.dtype == np.int64
    assert values.min() == 10 and values.max() == 150
    # P(X <= 10) for N(100, 200) is Phi(-0.45) ~ 0.326 (10.5 after rounding: ~0.327).
    assert np.mean(values == 10) == pytest.approx(0.327, abs=0.02)


def test_normal_without_clamping_keeps_mean_and_std() -> None:
    values = sample_lengths(NormalLength(mean=1000, std=50, min=1, max=100_000), 50_000, _rng())
    assert values.mean() == pytest.approx(1000, abs=1.5)  # sd of mean 0.22
    assert values.std() == pytest.approx(50, rel=0.02)


def test_lognormal_median_is_exp_mu() -> None:
    config = LognormalLength(median=200, sigma=1.0, min=1, max=1_000_000)
    values = sample_lengths(config, 50_000, _rng())
    assert np.median(values) == pytest.approx(200, rel=0.03)
    # log of a lognormal is normal with sd sigma (rounding barely matters at ~200).
    assert np.log(values).std() == pytest.approx(1.0, rel=0.03)


def test_lognormal_extreme_tail_is_clamped_not_overflowed() -> None:
    values = sample_lengths(LognormalLength(median=100, sigma=500, min=5, max=4096), 1000, _rng())
    assert values.min() == 5 and values.max() == 4096


def test_zipf_starts_at_min_and_clips_at_max() -> None:
    values = sample_lengths(ZipfLength(a=2.0, min=50, max=400), 100_000, _rng())
    assert values.min() == 50 and values.max() == 400
    # Rank 1 of Zipf(2) has probability 1/zeta(2) = 6/pi^2; it lands on min.
    assert np.mean(values == 50) == pytest.approx(6 / np.pi**2, abs=0.01)
    # Mass clipped onto max: P(K > 351) ~ 1/(zeta(2) * 351.5).
    assert np.mean(values == 400) == pytest.approx(1 / (np.pi**2 / 6 * 351.5), abs=0.0015)


def test_zipf_exponent_near_one_is_fast_and_bounded() -> None:
    values = sample_lengths(ZipfLength(a=1.000001, min=1, max=4096), 100_000, _rng())
    assert values.min() >= 1 and values.max() == 4096


def test_empirical_resamples_the_column() -> None:
    config = EmpiricalLength(path=str(DATA / "lengths_only.csv"), column="num_decode_tokens")
    sampler = make_length_sampler(config)
    values = sampler.sample(_rng(), 20_000)
    assert set(values.tolist()) == {54, 156, 2958, 2048}  # every row drawn, nothing else
    assert sampler.upper_bound_tokens == 2958
    assert np.bincount(np.searchsorted([54, 156, 2048, 2958], values)).min() > 4500


def test_empirical_clamps_and_relative_path() -> None:
    config = EmpiricalLength(
        path="lengths_only.csv", column="num_prefill_tokens", min=100, max=3000
    )
    sampler = make_length_sampler(config, base_dir=str(DATA))
    values = sampler.sample(_rng(), 5000)
    assert set(values.tolist()) == {100, 2015, 3000}
    assert sampler.upper_bound_tokens == 3000


def test_empirical_accepts_registered_trace_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(DATA / "tiny_trace.csv", tmp_path / "splitwise_conv.csv")
    monkeypatch.setenv("BATCHSIM_TRACE_DIR", str(tmp_path))
    config = EmpiricalLength(path="azure-conv-2023", column="num_decode_tokens")
    values = sample_lengths(config, 1000, _rng())
    assert set(values.tolist()) <= {20, 5, 300, 1, 64}


def test_empirical_bad_column_is_a_user_error() -> None:
    config = EmpiricalLength(path=str(DATA / "lengths_only.csv"), column="num_decode_token")
    with pytest.raises(
        UserError, match="num_decode_token.*did you mean 'num_decode_tokens'"
    ) as err:
        make_length_sampler(config, field="workload.output_tokens")
    assert err.value.field == "workload.output_tokens"


def test_empirical_max_below_min_is_a_user_error() -> None:
    config = EmpiricalLength(
        path=str(DATA / "lengths_only.csv"), column="num_decode_tokens", min=10, max=5
    )
    with pytest.raises(UserError, match="max"):
        make_length_sampler(config)


def test_empirical_missing_file_is_a_user_error() -> None:
    with pytest.raises(UserError, match="not found"):
        make_length_sampler(EmpiricalLength(path="no/such.csv", column="x"))


# --------------------------------------------------------------------------- property
_token = st.integers(min_value=1, max_value=50_000)


@st.composite
def _clamps(draw: st.DrawFn) -> dict[str, int]:
    low, high = sorted((draw(_token), draw(_token)))
    return {"min": low, "max": high}


_configs = st.one_of(
    st.builds(FixedLength, value=_token),
    _clamps().map(lambda c: UniformLength(low=c["min"], high=c["max"])),
    st.builds(
        lambda c, mean, std: NormalLength(mean=mean, std=std, **c),
        _clamps(),
        st.floats(1e-3, 1e7),
        st.floats(0, 1e7),
    ),
    st.builds(
        lambda c, median, sigma: LognormalLength(median=median, sigma=sigma, **c),
        _clamps(),
        st.floats(1e-3, 1e7),
        st.floats(0, 1e3),
    ),
    st.builds(lambda c, a: ZipfLength(a=a, **c), _clamps(), st.floats(1.0001, 50)),
)


def _bounds(config: object) -> tuple[int, int]:
    if isinstance(config, FixedLength):
        return config.value, config.value
    if isinstance(config, UniformLength):
        return config.low, config.high
    return config.min, config.max  # type: ignore[attr-defined]


@settings(max_examples=examples(1.5))
@given(config=_configs, seed=st.integers(0, 2**32))
def test_any_valid_length_config_gives_ints_within_its_clamps(config: object, seed: int) -> None:
    sampler = make_length_sampler(config)  # type: ignore[arg-type]
    values = sampler.sample(_rng(seed), 500)
    low, high = _bounds(config)
    assert values.dtype == np.int64 and values.shape == (500,)
    assert values.min() >= low >= 1
    assert values.max() <= high == sampler.upper_bound_tokens
