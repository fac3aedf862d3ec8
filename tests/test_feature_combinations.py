"""Features that used to exclude each other now compose through one memory model (issue 24).

* Speculative decoding with prefix caching: an EAGLE-style drafter drops the last block of every
  prefix hit (vLLM ``find_longest_cache_hit(use_eagle=True)``), a draft model does not.
* EAGLE's draft steps cost real time, so with nothing accepted it decodes slower than no speculation.
* Acceptance is a property of the workload's text when a policy does not set it.
* Disaggregated pools run the same engine: prefix caching and speculation work on them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sim
from sim.config import Scenario
from sim.errors import UserError

BLOCK = 16


def _scenario(policies: list[dict[str, Any]], **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "combo",
        "seed": 3,
        "model": "llama-3-8b",
        "gpu": "a100-80gb",
        "workload": {
            "requests": 40,
            "arrival": {"kind": "closed_loop", "clients": 1},
            "prompt_tokens": {"kind": "uniform", "low": 50, "high": 300},
            "output_tokens": {"kind": "uniform", "low": 5, "high": 40},
            "shared_prefix": {"tokens": 1000, "fraction": 1.0, "variants": 2},
        },
        "policies": policies,
    }
    return {**base, **over}


def _paged(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "kind": "chunked_prefill", "max_batch_size": 64, "chunk_size": 2048,
            "prefix_caching": True, **fields}  # fmt: skip


def _requests(result: sim.RunResult, policy: str) -> Any:
    frame = result.requests
    return frame[frame["policy"] == policy].set_index("request_id").sort_index()


def test_eagle_drops_the_last_block_of_every_prefix_hit_and_a_draft_model_does_not() -> None:
    """One client: every request sees the same cache whatever the policy (nothing is evicted), so
    each EAGLE request's hit is exactly one block shorter than without speculation."""
    eagle = {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.6}
    draft = {"method": "draft_model", "draft_model": "llama-3-8b", "acceptance_rate": 0.6}
    result = sim.run(Scenario.from_data(_scenario(
        [_paged("plain"), _paged("eagle", speculative=eagle), _paged("draft", speculative=draft)]
    )))  # fmt: skip
    plain = _requests(result, "plain")["cached_prompt_tokens"].to_numpy()
    with_eagle = _requests(result, "eagle")["cached_prompt_tokens"].to_numpy()
    with_draft = _requests(result, "draft")["cached_prompt_tokens"].to_numpy()
    assert (plain > 0).sum() >= 30  # the shared prefix is hit by almost every request
    assert np.array_equal(with_eagle, np.maximum(plain - BLOCK, 0))
    assert np.array_equal(with_draft, plain)
    rows = result.summary.set_index("policy")
    assert rows.loc["eagle", "spec_acceptance"] > 0 and rows.loc["draft", "spec_acceptance"] > 0


def test_eagle_accepting_nothing_decodes_slower_than_no_speculation() -> None:
    """Each step drafts gamma tokens (one head forward each) and verifies gamma + 1 for one token."""
    policies = [
        {"name": "plain", "preset": "vllm-v1", "prefix_caching": False},
        {"name": "eagle0", "preset": "vllm-v1", "prefix_caching": False,
         "speculative": {"method": "eagle", "num_speculative_tokens": 4, "acceptance_rate": 0.0}},
        {"name": "eagle8", "preset": "vllm-v1", "prefix_caching": False,
         "speculative": {"method": "eagle", "num_speculative_tokens": 4, "acceptance_rate": 0.8}},
    ]  # fmt: skip
    data = _scenario(policies)
    data["workload"] = {
        "requests": 30, "arrival": {"kind": "poisson", "rate": 1.0},
        "prompt_tokens": {"kind": "fixed", "value": 500}, "output_tokens": {"kind": "fixed", "value": 100},
    }  # fmt: skip
    tpot = sim.run(Scenario.from_data(data)).summary.set_index("policy")["tpot_p50_s"]
    assert tpot["eagle0"] > 1.3 * tpot["plain"]  # vLLM 0.11 EAGLE-3 on random text: 10.7 vs 7.1 ms
    assert tpot["eagle8"] < tpot["plain"]


@pytest.mark.parametrize(("text", "eagle", "ngram"), [("random", 0.0, 0.0), ("chat", 0.7, 0.3), ("code", 0.8, 0.5)])
def test_acceptance_comes_from_the_workload_text_unless_set(text: str, eagle: float, ngram: float) -> None:
    policies = [
        _paged("eagle", speculative={"method": "eagle"}),
        _paged("ngram", speculative={"method": "ngram"}),
        _paged("own", speculative={"method": "eagle", "acceptance_rate": 0.5}),
    ]
    data = _scenario(policies)
    data["workload"] = {**data["workload"], "text": text}
    scenario = Scenario.from_data(data)
    rates = {p.name: p.speculative.acceptance_rate for p in scenario.policies}
    assert rates == {"eagle": eagle, "ngram": ngram, "own": 0.5}


def test_eagle_pricing_fields_are_refused_for_other_methods() -> None:
    data = _scenario([_paged("n", speculative={"method": "ngram", "draft_step_ms": 1.0})])
    with pytest.raises(UserError, match="draft_step_ms price an eagle head, not method 'ngram'"):
        Scenario.from_data(data)


# --------------------------------------------------------------------------- disaggregated pools
def _disaggregated(prefill: dict[str, Any], decode: dict[str, Any], **workload: Any) -> dict[str, Any]:
    data = _scenario([_paged("colocated")])
    data["workload"] = {**data["workload"], "arrival": {"kind": "poisson", "rate": 4.0}, **workload}
    data["disaggregation"] = {
        "name": "pools",
        "prefill": {"replicas": 1, "policy": prefill},
        "decode": {"replicas": 1, "policy": decode},
    }
    return data


def test_prefix_caching_on_a_prefill_pool_skips_the_cached_prefix() -> None:
    """Before issue 24 the pool's prefix_caching was accepted and ignored (results byte-identical)."""
    on = _paged("prefill", kind="paged", max_num_batched_tokens=8192)
    on.pop("chunk_size")
    off = {**on, "prefix_caching": False}
    decode = {"name": "decode", "kind": "paged", "max_batch_size": 64}
    runs = {}
    for label, prefill in (("on", on), ("off", off)):
        result = sim.run(Scenario.from_data(_disaggregated(prefill, decode)), policies=["pools"])
        requests = _requests(result, "pools")
        iterations = result.iterations
        prefill_rows = iterations[(iterations["policy"] == "pools") & (iterations["replica"] == 0)]
        runs[label] = (requests, int(prefill_rows["prefill_tokens"].sum()))
    requests_on, computed_on = runs["on"]
    requests_off, computed_off = runs["off"]
    assert (requests_off["cached_prompt_tokens"] == 0).all()
    assert requests_on["cached_prompt_tokens"].sum() > 0
    # Conservation: the prefill pool computed every prompt token it did not find in its cache.
    assert computed_on == int((requests_on["prompt_tokens"] - requests_on["cached_prompt_tokens"]).sum())
    assert computed_off == int(requests_off["prompt_tokens"].sum())
    assert (requests_on["status"] == "completed").all()


def test_prefix_caching_on_a_decode_pool_sends_only_what_it_does_not_hold() -> None:
    """The decode replica looks its cache up first (vLLM's KV connector fetches the rest): with a
    shared prefix, later transfers carry only the uncached part and take less link time."""
    prefill = {"name": "prefill", "kind": "paged", "max_batch_size": 64, "prefix_caching": False}
    times = {}
    for caching in (False, True):
        decode = {"name": "decode", "kind": "paged", "max_batch_size": 64, "prefix_caching": caching}
        result = sim.run(Scenario.from_data(_disaggregated(prefill, decode)), policies=["pools"])
        requests = _requests(result, "pools")
        assert (requests["status"] == "completed").all()
        times[caching] = requests["kv_transfer_s"].to_numpy()
    assert times[True].mean() < 0.5 * times[False].mean()
    assert times[True][0] == times[False][0]  # the first request finds nothing cached


def test_speculation_on_a_decode_pool_speculates_and_on_a_prefill_pool_is_refused() -> None:
    spec = {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 1.0}
    prefill = {"name": "prefill", "kind": "paged", "max_batch_size": 64}
    decode = {"name": "decode", "kind": "paged", "max_batch_size": 64}
    with_spec = sim.run(Scenario.from_data(_disaggregated(prefill, {**decode, "speculative": spec})),
                        policies=["pools"])  # fmt: skip
    plain = sim.run(Scenario.from_data(_disaggregated(prefill, decode)), policies=["pools"])
    spec_requests = _requests(with_spec, "pools")
    long_enough = spec_requests["output_tokens"] > 2
    assert (spec_requests.loc[long_enough, "spec_steps"] > 0).all()
    # Every draft accepted: each decode step yields gamma + 1 tokens, so far fewer decode passes.
    decode_passes = {
        label: int((run.iterations["replica"] == 1).sum()) for label, run in (("spec", with_spec), ("plain", plain))
    }
    assert decode_passes["spec"] < 0.5 * decode_passes["plain"]
    with pytest.raises(UserError, match=r"disaggregation\.prefill\.policy\.speculative"):
        Scenario.from_data(_disaggregated({**prefill, "speculative": spec}, decode))
