"""Every pair of features either simulates or is refused by ``validate`` and ``run`` alike (issue 24).

The features: the policy kind (static, continuous, paged, chunked_prefill), prefix caching,
speculative decoding, multi-step scheduling, a disaggregated deployment, an API front end,
closed-loop clients, a mixture-of-experts model and pipeline parallelism (two stages; it applies to
the colocated policy, a disaggregated pool keeps one stage). ``REFUSED`` is the expected list, written
out here (not read from :mod:`sim.config.compat`), so a refusal that silently disappears, or
a new one, fails. A refused pair is one line naming both fields, the same from both commands,
and nothing is written; an accepted pair completes every request with the engine auditing its
KV blocks every pass. A hypothesis property does the same for random combinations.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.config import Scenario
from sim.errors import UserError
from sim.metrics.summary import model_passes
from sim.resolve import resolve
from sim.runner import check_servable
from sim.serving.engine import Engine

KINDS = ("static", "continuous", "paged", "chunked_prefill")
FEATURES = (
    "prefix_caching", "speculation", "multi_step", "disaggregation", "frontend", "closed_loop", "moe", "pipeline",
)  # fmt: skip

REFUSED: dict[frozenset[str], tuple[str, ...]] = {
    frozenset({"static", "prefix_caching"}): ("prefix_caching", "static"),
    frozenset({"continuous", "prefix_caching"}): ("prefix_caching", "continuous"),
    frozenset({"static", "speculation"}): ("speculative", "static"),
    frozenset({"static", "multi_step"}): ("num_scheduler_steps", "static"),
    frozenset({"continuous", "multi_step"}): ("num_scheduler_steps", "continuous"),
    frozenset({"chunked_prefill", "multi_step"}): ("num_scheduler_steps", "chunked_prefill"),
    frozenset({"static", "disaggregation"}): ("disaggregation.decode.policy.kind", "static"),
    frozenset({"speculation", "multi_step"}): ("speculative", "num_scheduler_steps"),
    frozenset({"speculation", "pipeline"}): ("speculative", "pipeline_parallel"),
}
"""Pairs refused, and what the one error line must name (both fields)."""

BASE: dict[str, Any] = {
    "name": "matrix",
    "seed": 2,
    "model": "llama-3-8b",
    "gpu": "a100-80gb",
    "workload": {
        "requests": 12,
        "arrival": {"kind": "poisson", "rate": 20.0},
        "prompt_tokens": {"kind": "uniform", "low": 40, "high": 400},
        "output_tokens": {"kind": "uniform", "low": 2, "high": 30},
        "shared_prefix": {"tokens": 200, "fraction": 0.8, "variants": 2},
    },
}


def _policy(kind: str) -> dict[str, Any]:
    return {"name": "p", "kind": kind, "max_batch_size": 16, "prefix_caching": False}


def build(kind: str, features: set[str]) -> dict[str, Any]:
    """A scenario of one policy of ``kind`` with ``features`` on."""
    data = copy.deepcopy(BASE)
    policy = _policy(kind)
    if "prefix_caching" in features:
        policy["prefix_caching"] = True
    if "speculation" in features:
        policy["speculative"] = {"method": "eagle", "num_speculative_tokens": 2, "acceptance_rate": 0.6}
    if "multi_step" in features:
        policy["num_scheduler_steps"] = 4
    if "frontend" in features:
        data["frontend"] = {"per_request_ms": 2.0, "startup_ms": 0}
    if "closed_loop" in features:
        data["workload"]["arrival"] = {"kind": "closed_loop", "clients": 3}
    if "moe" in features:
        data["model"] = "qwen3-30b-a3b"
    if "pipeline" in features:
        data["pipeline_parallel"] = 2
    if "disaggregation" in features:  # the policy under test runs the decode pool
        prefill = {"name": "prefill", "kind": "paged", "max_batch_size": 16,
                   "prefix_caching": "prefix_caching" in features}  # fmt: skip
        data["disaggregation"] = {
            "name": "pools", "prefill": {"policy": prefill}, "decode": {"policy": {**policy, "name": "decode"}},
        }  # fmt: skip
        policy = _policy("paged")  # the colocated row stays plain
    data["policies"] = [policy]
    return data


def _kind_for(features: set[str]) -> str:
    return "paged" if "multi_step" in features else "chunked_prefill"


CASES = [(kind, {feature}) for kind in KINDS for feature in FEATURES]
CASES += [(_kind_for(set(pair)), set(pair)) for pair in itertools.combinations(FEATURES, 2)]


def _expected(kind: str, features: set[str]) -> tuple[str, ...] | None:
    for pair, names in REFUSED.items():
        if pair <= features | {kind}:
            return names
    return None


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize(("kind", "features"), CASES, ids=lambda v: v if isinstance(v, str) else "+".join(sorted(v)))
def test_every_pair_simulates_or_is_refused_alike(
    kind: str, features: set[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(build(kind, features)))
    out = tmp_path / "out"
    validate_code, validate_err = _cli(capsys, "validate", str(path))
    run_code, run_err = _cli(capsys, "run", str(path), "--out", str(out), "--no-plots", "--quiet")
    names = _expected(kind, features)
    if names is not None:
        assert validate_code == run_code == 2
        assert validate_err == run_err, "validate and run must refuse with the same line"
        assert validate_err.count("\n") == 1 and validate_err.startswith("error: ")
        assert all(name in validate_err for name in names), validate_err
        assert not out.exists()
        return
    assert validate_code == 0, validate_err
    assert run_code == 0, run_err
    summary = (out / "summary.csv").read_text().splitlines()
    assert len(summary) == 1 + 1 + ("disaggregation" in features)  # header, the policy, the pools row


def test_the_refused_list_matches_the_pairs_the_matrix_walks() -> None:
    walked = {frozenset(features | {kind}) for kind, features in CASES}
    assert all(any(pair <= case for case in walked) for pair in REFUSED)


# --------------------------------------------------------------------------- random combinations
@st.composite
def combinations(draw: st.DrawFn) -> tuple[str, set[str], int]:
    kind = draw(st.sampled_from(KINDS))
    features = set(draw(st.lists(st.sampled_from(FEATURES), max_size=4, unique=True)))
    return kind, features, draw(st.integers(0, 2**16))


@settings(max_examples=examples(0.25))
@given(combinations())
def test_random_combinations_conserve_requests_tokens_and_kv(case: tuple[str, set[str], int]) -> None:
    """Refused at validation with one line, or every request ends completed with all its tokens,
    the prefill work accounted for, and the KV blocks audited after every pass and all returned."""
    kind, features, seed = case
    data = build(kind, features) | {"seed": seed}
    try:
        scenario = Scenario.from_data(data)
    except UserError as exc:
        assert _expected(kind, features) is not None, str(exc)
        assert "\n" not in str(exc)
        return
    assert _expected(kind, features) is None
    resolved = resolve(scenario)
    check_servable(resolved, list(scenario.policies))
    for policy in scenario.policies:
        engine = Engine(resolved.stream, policy, resolved.engine_setup(policy), audit_every=1)
        out = engine.run()  # audits every pass; raises if a request or a KV block is left
        requests = out.requests
        assert (requests["status"] == "completed").all()
        assert (requests["first_token_s"] <= requests["completion_s"]).all()
        if "speculation" not in features and not requests["preemptions"].any():
            computed = int(model_passes(out.iterations)["prefill_tokens"].sum())
            assert computed == int((requests["prompt_tokens"] - requests["cached_prompt_tokens"]).sum())
