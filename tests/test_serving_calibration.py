"""Serving calibration (issue 29): the file, the scenario field that names it, the GPU step scale, reading
benchmark tools' JSON, and ``calibrate-serving`` recovering known terms from synthetic runs.

Must hold: a calibration file round-trips; a folder of broken benchmark files is one clear error naming the
file and the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.calibration.benchmark_files import cases_of_json
from sim.calibration.serving_fit import replay_requests
from sim.cli import main
from sim.config import Scenario
from sim.errors import UserError
from sim.hardware.cost_model import load_cost_model
from sim.io.scenario import load_scenario
from sim.io.serving_calibration import ServingCalibration, read_calibration, write_calibration
from sim.resolve import resolve
from sim.vllm_defaults import V1_FRONTEND, VLLM_V1_CPU

SERVER = {"gpu": "l40s", "engine_version": "0.11.0", "tensor_parallel": 1, "num_gpus": 1, "max_model_len": 4096}
"""The server of the synthetic runs: an L40S (no profiles: a roofline prices it) under vLLM 0.11."""

terms = st.floats(min_value=0.0, max_value=500.0, allow_nan=False).map(lambda v: round(v, 4))


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# --------------------------------------------------------------------------- the file
@settings(max_examples=examples(0.5))
@given(latency=terms, pass_ms=st.floats(0, 50).map(lambda v: round(v, 4)), scale=st.floats(0.1, 10).map(
    lambda v: round(v, 4)), runs=st.lists(st.text(min_size=1, max_size=20), max_size=3))  # fmt: skip
def test_a_calibration_file_round_trips(latency: float, pass_ms: float, scale: float, runs: list[str],
                                        tmp_path_factory: pytest.TempPathFactory) -> None:  # fmt: skip
    original = ServingCalibration(
        serving={"v1": {"frontend": {"latency_ms": latency}, "engine_cpu": {"pass_ms": pass_ms}},
                 "v0": {"frontend": {"per_request_ms": 2.5}}},
        step_scale={"h100-sxm": scale}, fitted_on={"runs": runs, "leave_one_out": [{"run": "a", "error_pct": -1.5}]},
    )  # fmt: skip
    path = tmp_path_factory.mktemp("cal") / "calibration.yaml"
    write_calibration(original, path)
    assert read_calibration(path) == original


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"format": "other/1"}, "format = 'other/1'"),
        ({"format": "batchsim-serving-calibration/1", "serving": {"v2": {}}}, "serving.v2: unknown engine generation"),
        ({"format": "batchsim-serving-calibration/1", "serving": {"v1": {"frontend": {"latency": 3}}}},
         "serving.v1.frontend.latency: unknown term"),
        ({"format": "batchsim-serving-calibration/1", "serving": {"v1": {"engine_cpu": {"pass_ms": -1}}}},
         "serving.v1.engine_cpu.pass_ms = -1: must be a number >= 0"),
        ({"format": "batchsim-serving-calibration/1", "step_scale": {"h100": 1.1}}, "step_scale.h100: unknown GPU"),
        ({"format": "batchsim-serving-calibration/1", "step_scale": {"l40s": 0}},
         "step_scale.l40s = 0: must be a number > 0"),
    ],
)  # fmt: skip
def test_a_broken_calibration_file_is_one_line_naming_the_field(
    document: dict, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cal.yaml").write_text(yaml.safe_dump(document))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario_data(calibration="cal.yaml")))
    assert main(["validate", str(tmp_path / "s.yaml")]) == 2
    line = one_error_line(capsys)
    assert line.startswith("error: calibration: ") and named in line


# --------------------------------------------------------------------------- the scenario field
def scenario_data(**changes: object) -> dict:
    data = {
        "name": "cal", "model": "llama-3-8b", "gpu": "h100-sxm",
        "workload": {"requests": 20, "arrival": {"kind": "poisson", "rate": 2.0},
                     "prompt_tokens": {"kind": "fixed", "value": 100}, "output_tokens": {"kind": "fixed", "value": 20}},
        "policies": [{"name": "v1", "preset": "vllm-0.11"},
                     {"name": "own", "preset": "vllm-0.11", "frontend": {"latency_ms": 1.0}},
                     {"name": "v0", "preset": "vllm-0.6"},
                     {"name": "plain", "kind": "continuous", "max_batch_size": 8}],
    }  # fmt: skip
    return data | changes


def test_a_calibration_overrides_the_presets_terms_and_scales_its_gpu(tmp_path: Path) -> None:
    calibration = ServingCalibration(serving={"v1": {"frontend": {"latency_ms": 21.5},
                                                     "engine_cpu": {"step_us_per_seq": 3.0}}},
                                     step_scale={"h100-sxm": 1.25, "a100-80gb": 0.5})  # fmt: skip
    write_calibration(calibration, tmp_path / "cal.yaml")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario_data(calibration="cal.yaml")))
    scenario = load_scenario(tmp_path / "s.yaml")  # a path relative to the scenario file
    v1, own, v0 = (scenario.policy(n) for n in ("v1", "own", "v0"))
    assert (v1.frontend.latency_ms, v1.frontend.per_request_ms) == (21.5, V1_FRONTEND["per_request_ms"])
    assert (v1.engine_cpu.step_us_per_seq, v1.engine_cpu.pass_ms) == (3.0, VLLM_V1_CPU["pass_ms"])
    assert own.frontend.latency_ms == 1.0  # what a policy sets itself wins
    assert v0.frontend.latency_ms != 21.5  # another generation's terms are untouched
    assert scenario.cost.step_scale == 1.25  # the scenario's GPU's scale, not the A100's
    assert scenario.replace(**{"cost.step_scale": 2.0}).cost.step_scale == 2.0
    assert resolve(scenario).cost_model.gpu_time_scale == 1.25


def test_a_step_scale_multiplies_the_gpu_time_and_leaves_the_cpu_time() -> None:
    gpu_only = load_cost_model("llama-2-7b", "a100-80gb", 1, cpu_overhead=False)
    with_cpu = load_cost_model("llama-2-7b", "a100-80gb", 1)
    for totals in [(512, 1, 512 * 256.0, 0, 0), (0, 0, 0.0, 64, 64 * 900), (3000, 2, 4e6, 100, 100 * 2000)]:
        assert gpu_only.scaled(1.3).time_from_totals_s(*totals) == pytest.approx(
            1.3 * gpu_only.time_from_totals_s(*totals), rel=1e-12
        )
        cpu = with_cpu.time_from_totals_s(*totals) - gpu_only.time_from_totals_s(*totals)
        scaled = with_cpu.scaled(0.7).time_from_totals_s(*totals)
        assert scaled == pytest.approx(0.7 * gpu_only.time_from_totals_s(*totals) + cpu, rel=1e-12)
    with pytest.raises(ValueError):
        gpu_only.scaled(0.0)


# --------------------------------------------------------------------------- benchmark files
def vllm_result(inputs: list[int], outputs: list[int], ttfts: list[float], e2e: list[float], **extra: object) -> dict:
    """A benchmark_serving --save-result document (the keys the tool writes, a few summary figures)."""
    return {
        "date": "20250101-000000", "backend": "vllm", "model_id": "meta-llama/Llama-2-7b-hf",
        "num_prompts": len(inputs),
        "request_rate": "inf", "burstiness": 1.0, "max_concurrency": None, "duration": max(e2e),
        "completed": len(inputs), "input_lens": inputs, "output_lens": outputs, "ttfts": ttfts,
        "itls": [[(e - t) / max(o - 1, 1)] * max(o - 1, 0) for t, e, o in zip(ttfts, e2e, outputs, strict=True)],
        "errors": [""] * len(inputs), "generated_texts": ["x"] * len(inputs), **extra,
    }  # fmt: skip


def guidellm_report(requests: list[dict], strategy: dict) -> dict:
    return {"benchmarks": [{"type_": "generative_benchmark", "args": {"strategy": strategy},
                            "worker": {"backend_model": "meta-llama/Llama-2-7b-hf"},
                            "requests": {"successful": requests, "errored": [], "incomplete": []}}]}  # fmt: skip


def good_guidellm() -> dict:
    requests = [{"prompt_tokens": 100 + i, "output_tokens": 20, "start_time": 1000.0 + i,
                 "first_token_time": 1000.05 + i, "end_time": 1000.5 + i} for i in range(5)]  # fmt: skip
    return guidellm_report(requests, {"type_": "constant", "rate": 1.0})


BROKEN: list[tuple[str, object, str]] = [
    ("run.json", {**vllm_result([10, 20], [5, 5], [0.1, 0.2], [0.5, 0.6]), "ttfts": None}, "field 'ttfts'"),
    ("run.json", {k: v for k, v in vllm_result([10], [5], [0.1], [0.5]).items() if k != "itls"},
     "field 'itls' missing"),
    ("run.json", vllm_result([10, 20], [5, 5], [0.1, -0.2], [0.5, 0.6]), "ttfts[1] = -0.2"),
    ("run.json", {**vllm_result([10, 20], [5, 5], [0.1, 0.2], [0.5, 0.6]), "input_lens": [10]}, "differ in length"),
    ("run.json", {**vllm_result([10], [5], [0.1], [0.5]), "request_rate": -3}, "request_rate = -3"),
    ("run.json", "{not json", "not valid JSON at line 1"),
    ("run.json", {"hello": 1}, "not a benchmark result batchsim reads"),
    ("guide.json", {"benchmarks": []}, "field 'benchmarks'"),
    ("guide.json", (lambda d: d["benchmarks"][0]["requests"]["successful"][3].pop("first_token_time") and d)(
        good_guidellm()), "benchmarks[0].requests.successful[3].first_token_time = None"),
    ("guide.json", (lambda d: d["benchmarks"][0]["args"]["strategy"].update(type_="warp") or d)(good_guidellm()),
     "benchmarks[0].args.strategy.type_ = 'warp'"),
    ("guide.json", (lambda d: d["benchmarks"][0].update(request_samples={"successful": 2}) or d)(good_guidellm()),
     "benchmarks[0].request_samples"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "document", "named"), BROKEN, ids=[b[2][:30] for b in BROKEN])
def test_a_broken_benchmark_file_is_one_line_naming_the_file_and_the_field(
    name: str, document: object, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "README.md").write_text("not read")
    (folder / "good.json").write_text(json.dumps(vllm_result([10], [5], [0.1], [0.5])))
    (folder / name).write_text(document if isinstance(document, str) else json.dumps(document))
    out = tmp_path / "cal.yaml"
    assert main(["calibrate-serving", str(folder), "--gpu", "a100-80gb", "--engine-version", "0.11.0",
                 "--out", str(out), "--quiet"]) == 2  # fmt: skip
    line = one_error_line(capsys)
    assert str(folder / name) in line and named in line, line
    assert not out.exists()


def test_a_folder_without_runs_and_a_missing_server_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "README.md").write_text("nothing")
    assert main(["calibrate-serving", str(tmp_path), "--quiet", "--out", str(tmp_path / "c.yaml")]) == 2
    assert "no real runs" in one_error_line(capsys)
    (tmp_path / "run.json").write_text(json.dumps(vllm_result([10], [5], [0.1], [0.5])))
    assert main(["calibrate-serving", str(tmp_path), "--quiet", "--out", str(tmp_path / "c.yaml")]) == 2
    assert "no column 'engine_version'" in one_error_line(capsys)


def test_the_tools_own_figures_are_read_as_they_measured_them(tmp_path: Path) -> None:
    document = vllm_result([10, 20, 30], [5, 1, 9], [0.1, 0.2, 0.3], [0.5, 0.2, 1.1], output_throughput=12.0)
    (tmp_path / "run.json").write_text(json.dumps(document))
    (case,) = cases_of_json(tmp_path / "run.json", SERVER)
    assert case.measured["ttft_p50_ms"] == pytest.approx(200.0)
    assert case.measured["tpot_p50_ms"] == pytest.approx(np.median([400 / 4, 800 / 8]))  # output > 1 only
    assert case.measured["e2e_p50_ms"] == pytest.approx(500.0)
    assert case.measured["output_tps"] == 12.0  # the tool's own throughput
    (tmp_path / "g.json").write_text(json.dumps(good_guidellm()))
    (run,) = cases_of_json(tmp_path / "g.json", SERVER)
    assert run.measured["ttft_p50_ms"] == pytest.approx(50.0) and run.requests["send_s"].tolist() == [0, 1, 2, 3, 4]


def test_the_loop_time_is_fitted_only_where_requests_queue_at_the_loop(tmp_path: Path) -> None:
    from sim.calibration.serving_terms import default_terms, queues_at_the_loop

    # Sends 1 s apart (a gamma of huge shape is a constant gap): no request waits for another's parse, so the loop's
    # time and the latency outside it add once to every request and only their sum is identified.
    paced = vllm_result([100] * 8, [20] * 8, [0.1] * 8, [0.5] * 8, request_rate=1.0, burstiness=1e6)
    (tmp_path / "paced.json").write_text(json.dumps(paced))
    (tmp_path / "burst.json").write_text(json.dumps(vllm_result([100] * 8, [20] * 8, [0.1] * 8, [0.5] * 8)))
    (paced_case,) = cases_of_json(tmp_path / "paced.json", SERVER)
    (burst_case,) = cases_of_json(tmp_path / "burst.json", SERVER)
    loop_s = V1_FRONTEND["per_request_ms"] / 1e3
    assert not queues_at_the_loop(paced_case, loop_s) and queues_at_the_loop(paced_case, 1.01)  # flips at the gap
    assert queues_at_the_loop(burst_case, loop_s)
    alone = [t.name for t in default_terms([paced_case])]
    assert "per_request_ms" not in alone and "v1.latency_ms" in alone
    assert "per_request_ms" in [t.name for t in default_terms([paced_case, burst_case])]


# --------------------------------------------------------------------------- recovering known terms
def synthetic_folder(folder: Path, truth: ServingCalibration) -> None:
    """Runs of Llama-2-7B on an L40S under vLLM 0.11 as if measured: replays under the ``truth`` calibration,
    written as a benchmark_serving burst, a benchmark_serving Poisson run and a GuideLLM concurrent run."""
    folder.mkdir()
    write_calibration(truth, folder.parent / "truth.yaml")
    rng = np.random.default_rng(1)
    inputs, outputs = rng.integers(50, 800, 48).tolist(), rng.integers(20, 200, 48).tolist()
    work = folder.parent / "work"
    work.mkdir()
    for name, extra in (("burst", {}), ("paced", {"request_rate": 6.0})):
        template = vllm_result(inputs, outputs, [0.1] * 48, [1.0] * 48, **extra)
        (folder / f"{name}.json").write_text(json.dumps(template))
        (case,) = cases_of_json(folder / f"{name}.json", SERVER)
        done = replay_requests(case, folder.parent / "truth.yaml", work).sort_values("request_id")
        measured = vllm_result(inputs, outputs, done["ttft_s"].tolist(), done["e2e_s"].tolist(), **extra)
        (folder / f"{name}.json").write_text(json.dumps(measured))


def test_calibrate_serving_recovers_a_known_step_scale_and_loop_latency(tmp_path: Path, capsys) -> None:
    truth = ServingCalibration(serving={"v1": {"frontend": {"latency_ms": 30.0}}}, step_scale={"l40s": 1.3})
    synthetic_folder(tmp_path / "runs", truth)
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate-serving", str(tmp_path / "runs"), "--gpu", "l40s", "--engine-version", "0.11.0",
                 "--max-model-len", "4096", "--out", str(out)]) == 0  # fmt: skip
    fitted = read_calibration(out)
    assert fitted.step_scale["l40s"] == pytest.approx(1.3, rel=0.05)
    assert fitted.serving["v1"]["frontend"]["latency_ms"] == pytest.approx(30.0, abs=5.0)
    errors = fitted.fitted_on["median_abs_error_pct"]
    assert max(errors["leave_one_out"].values()) < 5.0  # each run predicted from the other alone
    assert errors["presets"]["tpot_p50_ms"] > 10.0 > errors["fit"]["tpot_p50_ms"]  # the presets miss the 1.3 x GPU
    printed = capsys.readouterr().out
    assert "step_scale.l40s" in printed and "leave_one_out" in printed
    # The file, named by a scenario, reproduces a run the fit saw.
    scenario = Scenario(**{**scenario_data(model="llama-2-7b", gpu="l40s"), "calibration": str(out)})
    assert scenario.cost.step_scale == fitted.step_scale["l40s"]
    assert math.isclose(scenario.policy("v1").frontend.latency_ms, fitted.serving["v1"]["frontend"]["latency_ms"])


def test_a_saturated_folder_is_refused(tmp_path: Path) -> None:
    from sim.calibration.serving_cli import calibrate_serving

    folder = tmp_path / "runs"
    folder.mkdir()
    many = 2000  # a burst of 2000 long requests fills the engine for minutes: load ~1
    (folder / "run.json").write_text(json.dumps(vllm_result([2000] * many, [500] * many, [1.0] * many, [60.0] * many)))
    with pytest.raises(UserError, match="every run is at or above 0.9"):
        calibrate_serving(folder, SERVER | {"gpu": "a100-80gb"}, leave_one_out=False)
