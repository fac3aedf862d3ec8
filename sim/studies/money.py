"""``results/money.md``: the seed's static-vs-continuous result in dollars and joules, at equal SLO.

Latency speedups compare policies at the same load; an operator compares what it costs to meet
the same target. Two restatements, both on A100-80GBs priced and powered as in docs/cost.md:

* **The incident** (``scenarios/incident.yaml``): every policy is given the same SLO, the
  clients' own: every request completes (none gives up at its 8 s timeout) and p99 E2E <= 8 s.
  :func:`sim.sweeps.cheapest.cheapest_fleet` finds the fewest A100s each policy needs for the
  incident's request stream; their rent per hour, dollars per million output tokens and
  joules per token are set next to the one-A100 run of the incident itself.
* **The speedup map** (``results/speedup_map.csv``, written first by ``python -m sim report``):
  for each length class and batch size, the map's SLO (every request completes, p99 E2E <= 3 x
  static's full-batch time) is applied to both policies; static's capacity is the map's, and
  continuous batching's is searched the same way (:func:`sim.sweeps.slo_capacity.capacity`, at or
  below its own saturation throughput, the map's burst row). Each
  policy is then run at its capacity: one A100 serving as much as it can within the SLO, so
  dollars and joules per token are what that rate costs.

The report hook is :func:`write_money_report`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from sim.io.outputs import CSV_FLOAT_FORMAT, atomic_file
from sim.io.scenario import load_scenario
from sim.sweeps.tasks import build_scenario, scenario_dict

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
INCIDENT_SLO = {"e2e_p99_s": 8.0}
"""The incident's clients give up after 8 s: meeting this (with every request completed) means none does."""
INCIDENT_POLICIES = ("static", "continuous", "vllm-v0")
MONEY_COLUMNS = ("usd_per_mtok", "joules_per_token", "fleet_usd_per_hour")
INCIDENT_COLUMNS = [
    "policy",
    "a100s",
    "fleet_usd_per_hour",
    "usd_per_mtok",
    "joules_per_token",
    "e2e_p99_s",
    "ttft_p99_s",
    "one_a100_usd_per_mtok",
    "one_a100_joules_per_token",
    "one_a100_timed_out",
]
MAP_MONEY_COLUMNS = [
    "length_class",
    "max_batch_size",
    "slo_e2e_p99_s",
    "static_capacity_rps",
    "continuous_capacity_rps",
    "static_usd_per_mtok",
    "continuous_usd_per_mtok",
    "cost_ratio",
    "static_joules_per_token",
    "continuous_joules_per_token",
    "energy_ratio",
    "note",
]


def incident_money(scenarios_dir: Path = SCENARIOS, workers: int = 0) -> pd.DataFrame:
    """Per incident policy: the fewest A100s meeting ``INCIDENT_SLO`` and that fleet's money, next to one A100's."""
    from sim.runner import run
    from sim.sweeps.cheapest import cheapest_fleet

    base = load_scenario(scenarios_dir / "incident.yaml")
    one_a100 = run(base, policies=list(INCIDENT_POLICIES), load_frac=False).summary.set_index("policy")
    found = cheapest_fleet(
        base,
        INCIDENT_SLO,
        gpus=[base.gpu],
        tensor_parallel=[base.tensor_parallel],
        policies=list(INCIDENT_POLICIES),
        max_gpus=16,
        cost_span=0,  # every policy's own answer, however expensive
        workers=workers,
    )
    rows = []
    for policy in INCIDENT_POLICIES:
        smallest = found.configs.set_index("policy").loc[policy]
        fleet = found.runs[(found.runs["policy"] == policy) & (found.runs["fleet"] == smallest["smallest_fleet"])]
        best = fleet.iloc[0] if len(fleet) else pd.Series(dtype=float)
        rows.append(
            {
                "policy": policy,
                "a100s": smallest["num_gpus"],
                **{
                    c: float(best.get(c, math.nan))
                    for c in ("fleet_usd_per_hour", "usd_per_mtok", "joules_per_token", "e2e_p99_s", "ttft_p99_s")
                },
                "one_a100_usd_per_mtok": float(one_a100.loc[policy, "usd_per_mtok"]),
                "one_a100_joules_per_token": float(one_a100.loc[policy, "joules_per_token"]),
                "one_a100_timed_out": int(one_a100.loc[policy, "timed_out"]),
            }
        )
    return pd.DataFrame(rows, columns=INCIDENT_COLUMNS)


def map_money(speedup_map_csv: Path, scenarios_dir: Path = SCENARIOS, workers: int = 0) -> pd.DataFrame:
    """Per (class, batch size) of the speedup map: both policies' capacity under the map's SLO and their money there."""
    from sim.studies.speedup_map import MapConfig, class_scenarios, point_overrides
    from sim.sweeps.backends import open_backend

    config = MapConfig()
    cells = pd.read_csv(speedup_map_csv)
    columns = ["length_class", "max_batch_size", "capacity_rps", "saturation_rps", "continuous_throughput_rps"]
    cells = cells[cells["load"] == "burst"][columns]
    bases = class_scenarios(scenarios_dir, config.classes)
    jobs = []
    for cell in cells.itertuples(index=False):
        base = bases[cell.length_class]
        batch = int(cell.max_batch_size)
        raw = scenario_dict(base.replace(**point_overrides(config, batch, 0.5, float(cell.capacity_rps), 0)))
        slo = {"e2e_p99_s": config.slo_batches * batch / float(cell.saturation_rps)}
        saturated = float(cell.continuous_throughput_rps)  # continuous's burst throughput: its ceiling
        jobs.append(((cell.length_class, batch), raw, base.base_dir, slo, float(cell.capacity_rps), saturated))
    with open_backend("local", workers) as engine:
        found = dict(engine.imap_unordered(_cell_job, jobs))
    rows = [found[(c, int(b))] for c, b in zip(cells["length_class"], cells["max_batch_size"], strict=True)]
    return pd.DataFrame(rows, columns=MAP_MONEY_COLUMNS)


def _cell_job(job: tuple[Any, ...]) -> tuple[tuple[str, int], dict[str, Any]]:
    """One map cell in a pool worker: continuous's capacity, then both policies run at their capacity."""
    from sim.runner import run
    from sim.sweeps.slo_capacity import capacity

    (name, batch), raw, base_dir, slo, static_rps, saturated_rps = job
    scenario = build_scenario(raw, {}, base_dir)
    # searched up to its saturation throughput, as the map searches static's: above it a finite run's queue
    # has not grown enough yet to break the SLO, and the "capacity" would be an artefact of the run's length
    found = capacity(_only(scenario, "continuous"), slo, rate_low=static_rps, rate_high=saturated_rps, workers=1)
    found = found.iloc[0]
    continuous_rps = float(found["rate_rps"])
    money = {}
    for policy, rate in (("static", static_rps), ("continuous", continuous_rps)):
        at = _only(scenario, policy).replace(**{"workload.arrival.rate": rate, "slo": {**slo}})
        row = run(at, load_frac=False).summary.iloc[0] if rate > 0 else pd.Series(dtype=float)
        money[policy] = {c: float(row.get(c, math.nan)) for c in MONEY_COLUMNS}
    static, fast = money["static"], money["continuous"]
    return (name, batch), {
        "length_class": name,
        "max_batch_size": batch,
        "slo_e2e_p99_s": slo["e2e_p99_s"],
        "static_capacity_rps": static_rps,
        "continuous_capacity_rps": continuous_rps,
        "static_usd_per_mtok": static["usd_per_mtok"],
        "continuous_usd_per_mtok": fast["usd_per_mtok"],
        "cost_ratio": static["usd_per_mtok"] / fast["usd_per_mtok"],
        "static_joules_per_token": static["joules_per_token"],
        "continuous_joules_per_token": fast["joules_per_token"],
        "energy_ratio": static["joules_per_token"] / fast["joules_per_token"],
        "note": str(found["note"]),
    }


def _only(scenario: Any, policy: str) -> Any:
    raw = scenario_dict(scenario)
    raw["policies"] = [p for p in raw["policies"] if p["name"] == policy]
    return build_scenario(raw, {}, scenario.base_dir)


def money_markdown(incident: pd.DataFrame, cells: pd.DataFrame | None) -> str:
    """The report: both tables with what they say."""
    from sim.hardware.catalog import get_gpu
    from sim.report.tables import frame_markdown

    price = get_gpu("a100-80gb").usd_per_hour
    lines = [
        "# What a token costs: static vs continuous batching in dollars and joules, at equal SLO",
        "",
        "Generated by `python -m sim report` (`sim/studies/money.py`). Llama-2-7B on A100-80GBs at "
        f"${price:.2f} per GPU-hour (the catalog price; `python -m sim list gpus`), GPU energy from the power model "
        "of docs/cost.md. Dollars per million output tokens (USD/Mtok) bill the GPUs for the run's window; joules "
        "per token are GPU energy (busy and idle) over output tokens of completed requests.",
        "",
        "## The incident, at the clients' SLO",
        "",
        "`scenarios/incident.yaml` (a two-minute peak of 4.5 req/s, clients giving up after 8 s). SLO for every "
        "policy: every request completes and p99 E2E <= 8 s. `a100s` is the fewest A100s that meet it "
        "(`capacity --cheapest`); the `one_a100_` columns are the incident as it happened, on one A100.",
        "",
        frame_markdown(incident).rstrip("\n"),
        "",
        *_incident_lines(incident),
    ]
    if cells is not None:
        lines += [
            "",
            "## The speedup map, at equal SLO",
            "",
            "Each cell of `results/speedup_map.md` (Poisson arrivals, prompts 128-512 tokens) with one SLO for both "
            "policies: every request completes and p99 E2E <= 3 x static's full-batch time (`slo_e2e_p99_s`). "
            "Each policy runs at its own capacity under it (static's from the map, continuous's searched the same "
            "way), so USD/Mtok and J/token are what one A100 costs per token when it serves all it can within the "
            "SLO; `cost_ratio` and `energy_ratio` are static / continuous.",
            "",
            frame_markdown(cells.drop(columns="note")).rstrip("\n"),
            "",
            *_map_lines(cells),
        ]
    return "\n".join(lines) + "\n"


def _incident_lines(incident: pd.DataFrame) -> list[str]:
    by = incident.set_index("policy")
    static, fast = by.loc["static"], by.loc["continuous"]
    if not (static["usd_per_mtok"] > 0 and fast["usd_per_mtok"] > 0):
        return ["Static batching meets the SLO on no fleet of up to 16 A100s."]
    return [
        f"To keep every client under its 8 s timeout, static batching needs {int(static['a100s'])} A100s where "
        f"continuous batching needs {int(fast['a100s'])}: {static['usd_per_mtok'] / fast['usd_per_mtok']:.1f}x the "
        f"dollars per token (${static['usd_per_mtok']:.2f} vs ${fast['usd_per_mtok']:.2f} per million) and "
        f"{static['joules_per_token'] / fast['joules_per_token']:.1f}x the joules "
        f"({static['joules_per_token']:.2f} vs {fast['joules_per_token']:.2f} J/token). On the one A100 of the "
        f"incident the gap looks smaller per delivered token (${static['one_a100_usd_per_mtok']:.2f} vs "
        f"${fast['one_a100_usd_per_mtok']:.2f}), but static's figure is for a service that lost "
        f"{int(static['one_a100_timed_out'])} requests to timeouts: the bill that meets the SLO is the one to compare.",
    ]


def _map_lines(cells: pd.DataFrame) -> list[str]:
    ratio, energy = cells["cost_ratio"].dropna(), cells["energy_ratio"].dropna()
    if ratio.empty:
        return []
    worst = cells.loc[ratio.idxmax()]
    saturated = int(cells["note"].str.startswith("meets the SLO at every rate").sum())
    lines = [
        f"At equal SLO static batching costs {ratio.min():.2f}x-{ratio.max():.2f}x continuous batching's dollars per "
        f"token (median {ratio.median():.2f}x) and {energy.min():.2f}x-{energy.max():.2f}x its joules (median "
        f"{energy.median():.2f}x); the largest gap is {worst['length_class']} outputs at batch "
        f"{int(worst['max_batch_size'])}, where the spread of output lengths wastes the most static slots. The dollar "
        "ratio is the ratio of tokens one GPU-hour serves within the SLO; the energy ratio is "
        f"{'a little smaller' if energy.median() < ratio.median() else 'as large or larger'}: an idle or padded slot "
        "still costs rent, but a fuller batch also draws more power per second.",
    ]
    if saturated:
        lines += [
            "",
            f"In {saturated} of {len(cells)} cells continuous batching meets this SLO all the way to its saturation "
            "throughput (the map's burst row; `note`): there the ratio is continuous batching's full throughput "
            "against static batching's SLO-limited one.",
        ]
    return lines


def write_money_report(out_dir: Path, *, plots: bool = True, scenarios_dir: Path = SCENARIOS) -> Path:
    """Write ``money.md`` and ``money.csv`` (the map cells) into ``out_dir``; the map part needs
    ``out_dir / "speedup_map.csv"`` (skipped, saying so, when absent)."""
    incident = incident_money(scenarios_dir)
    map_csv = out_dir / "speedup_map.csv"
    cells = map_money(map_csv, scenarios_dir) if map_csv.exists() else None
    text = money_markdown(incident, cells)
    if cells is None:
        text += "\nThe speedup map part is skipped: no speedup_map.csv in this folder.\n"
    with atomic_file(out_dir / "money.md") as tmp:
        tmp.write_text(text)
    with atomic_file(out_dir / "money.csv") as tmp:
        frame = (
            pd.concat([incident.assign(part="incident"), cells.assign(part="speedup_map")])
            if cells is not None
            else incident.assign(part="incident")
        )
        frame.to_csv(tmp, index=False, float_format=CSV_FLOAT_FORMAT)
    return out_dir / "money.md"
