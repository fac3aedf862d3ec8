"""Engine CPU time around the GPU work of a forward pass (a policy's ``engine_cpu``).

By default a pass costs what the cost model says, Vidur's per-pass CPU profile included
(``cost.cpu_overhead``). A policy with ``engine_cpu`` instead gets a cost model without
CPU time and this linear model of the engine's host work, which separates what a real
engine pays per *forward pass* (input preparation, sampling, detokenization) from what it
pays per *scheduling step* (the scheduler's decision: once per pass, or once per block of
``num_scheduler_steps`` passes with vLLM multi-step scheduling), R sequences in the pass:

    pass term = pass_ms + pass_us_per_seq x R            (every pass)
    step term = step_ms + step_us_per_seq x R            (the first pass of a step)
    duration  = GPU time + pass term + step term,  or with ``overlap_step`` (vLLM v1 async
                scheduling: the next step is planned while the GPU runs this one)
              = GPU time + pass term + max(0, step term - GPU time).

Pure arithmetic, no SimPy: the worker calls it once per pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.config import EngineCPUConfig

_MS = 1e-3
_US = 1e-6


@dataclass(frozen=True, slots=True)
class EngineCPUTime:
    """The engine CPU-time model in seconds.

    Attributes:
        step_s, step_s_per_seq: scheduling-step time, fixed and per sequence.
        pass_s, pass_s_per_seq: forward-pass time, fixed and per sequence.
        overlap_step: the scheduling step hides behind the pass's GPU time.
    """

    step_s: float = 0.0
    step_s_per_seq: float = 0.0
    pass_s: float = 0.0
    pass_s_per_seq: float = 0.0
    overlap_step: bool = False

    @classmethod
    def from_config(cls, config: EngineCPUConfig) -> EngineCPUTime:
        """The model of a policy's ``engine_cpu`` config (ms and µs to seconds)."""
        return cls(
            step_s=config.step_ms * _MS,
            step_s_per_seq=config.step_us_per_seq * _US,
            pass_s=config.pass_ms * _MS,
            pass_s_per_seq=config.pass_us_per_seq * _US,
            overlap_step=config.overlap_step,
        )

    def pass_overhead_s(self, seqs: int) -> float:
        """CPU time every forward pass of ``seqs`` sequences pays."""
        return self.pass_s + self.pass_s_per_seq * seqs

    def step_overhead_s(self, seqs: int) -> float:
        """CPU time of one scheduling step whose first pass has ``seqs`` sequences."""
        return self.step_s + self.step_s_per_seq * seqs

    def step_added_s(self, gpu_s: float, seqs: int) -> float:
        """What the scheduling step adds to its first pass: all of it, or (overlapped) only
        the part the pass's GPU time does not hide."""
        step_s = self.step_overhead_s(seqs)
        return max(0.0, step_s - gpu_s) if self.overlap_step else step_s

    def pass_time_s(self, gpu_s: float, seqs: int, *, first_of_step: bool) -> float:
        """Duration of a pass of ``seqs`` sequences that takes ``gpu_s`` on the GPU.

        Args:
            gpu_s: the cost model's time for the pass (built without CPU overhead).
            seqs: sequences in the pass (prefill pieces + decodes + charged idle slots).
            first_of_step: the policy was consulted for this pass (it pays the step term).
        """
        duration_s = gpu_s + self.pass_overhead_s(seqs)
        if first_of_step:
            duration_s += self.step_added_s(gpu_s, seqs)
        return duration_s
