"""Energy per output token against published measurements (ML.ENERGY Leaderboard v3.0, H100).

Replays every published configuration of Llama-3.1-8B on one H100 SXM (max_num_seqs 8 to 512;
conditions and source in :mod:`sim.studies.energy_points`) and prints, per point, the measured
and simulated power, output tokens/s and joules per output token with the relative errors;
the points used to fit the power model's shares are marked ``fit``, the others are held out.

``--fit`` re-derives :data:`sim.hardware.power.K_MEMORY` and ``K_COMPUTE``: the two shares for
which the simulated busy power of the fitted points equals the measured power (per pass, with
the power-limit cap), solved with scipy's least squares. The constants in the library are what
this printed when they were set.

    python benchmarks/bench_energy.py            # the comparison table
    python benchmarks/bench_energy.py --fit      # the fit, then the table with the fitted shares
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.hardware.catalog import get_gpu  # noqa: E402
from sim.hardware.power import PowerModel  # noqa: E402
from sim.io.scenario import scenario_from_dict  # noqa: E402
from sim.studies.energy_points import (  # noqa: E402
    POINTS,
    SOURCE,
    PublishedPoint,
    output_lengths_csv,
    point_scenario,
    simulate_point,
)


def fit_shares(lengths: Path) -> tuple[float, float]:
    """(memory share, compute share) matching the fitted points' measured power."""
    from scipy.optimize import least_squares

    from sim.runner import run

    gpu = get_gpu("h100-sxm")
    passes = []
    for point in (p for p in POINTS if p.fitted):
        result = run(scenario_from_dict(point_scenario(point, lengths), {}), load_frac=False)
        it = result.iterations
        last_send = float(result.requests["arrival_s"].max())
        steady = (it["start_s"] + it["duration_s"]).to_numpy() <= last_send
        rows = it.loc[steady]
        passes.append((point, rows["mfu"].to_numpy(), rows["mbu"].to_numpy(), rows["duration_s"].to_numpy()))

    def residuals(shares: np.ndarray) -> np.ndarray:
        model = PowerModel(gpu.tdp_w, gpu.idle_w, memory_share=shares[0], compute_share=shares[1])
        return np.array(
            [np.average(model.pass_watts(mfu, mbu), weights=d) / p.power_w - 1 for p, mfu, mbu, d in passes]
        )

    fit = least_squares(residuals, x0=[0.6, 1.5], bounds=([0, 0], [5, 5]))
    return float(fit.x[0]), float(fit.x[1])


def table(lengths: Path) -> str:
    """One line per published point: measured vs simulated, with relative errors."""
    lines = [
        f"source: {SOURCE}",
        "B      fit   power W (meas/sim, err)    tok/s (meas/sim, err)      J/token (meas/sim, err)",
    ]
    for point in POINTS:
        sim = simulate_point(point, lengths)
        lines.append(_line(point, sim))
    return "\n".join(lines)


def _line(point: PublishedPoint, sim: dict[str, float]) -> str:
    def cell(measured: float, simulated: float, digits: int) -> str:
        return f"{measured:8.{digits}f} / {simulated:8.{digits}f} {simulated / measured - 1:+6.1%}"

    tag = "fit" if point.fitted else "held"
    return (
        f"{point.max_num_seqs:<6d} {tag:<5} {cell(point.power_w, sim['power_w'], 1)}   "
        f"{cell(point.output_tps, sim['output_tps'], 0)}   {cell(point.joules_per_token, sim['joules_per_token'], 4)}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", action="store_true", help="re-fit the power model's shares first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lengths = output_lengths_csv(Path(tmp) / "outputs.csv")
        if args.fit:
            memory, compute = fit_shares(lengths)
            print(f"fitted: K_MEMORY = {memory:.3f}, K_COMPUTE = {compute:.3f}")
            import sim.hardware.power as power

            power.K_MEMORY, power.K_COMPUTE = memory, compute
            PowerModel.__init__.__defaults__ = (memory, compute)  # the dataclass defaults, for this process
        print(table(lengths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
