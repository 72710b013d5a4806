"""The simulator's fitted factors over the calibrated step-time model: what the deployed serving
path adds to one engine measured in-process, and the machine a probed run ran on.

Fitted on real runs by benchmarks.simulator.validation, saved with its report, and read back by
benchmarks.simulator.setup for every validated simulation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.replay.probe import PROBE_TOKENS, Probe
from benchmarks.simulator.hops import Hops
from benchmarks.simulator.step_time import StepTimeModel


@dataclass(frozen=True)
class Fit:
    const: float = 1.0
    decode: float = 1.0
    prefill: float = 1.0
    kv: float = 1.0
    delay_in_s: float = 0.0  # the hops (benchmarks.simulator.hops), flat: the fit is saved as JSON
    delay_in_per_request_s: float = 0.0
    delay_out_s: float = 0.0
    predictor: float = 1.0
    # The speed probe (benchmarks.replay.probe) as this fit times it, per probe size (requests at
    # once): the step time a probe would have measured on the fit runs' machines. A run probed
    # slower is timed that much slower. Empty: no reference, no run scaled.
    references: dict[int, float] = field(default_factory=dict)
    probe_prompt_tokens: int = 0  # the probe's prompt as the engines see it

    @property
    def hops(self) -> Hops:
        return Hops(self.delay_in_s, self.delay_in_per_request_s, self.delay_out_s)

    def model(self, base: StepTimeModel, probe: Probe | None = None) -> StepTimeModel:
        """The calibrated model with the fitted factors, on a run's machine when it was probed."""
        fixed, work = self.machine(base, probe)
        return StepTimeModel(const=base.const * self.const * fixed, decode_seqs=base.decode_seqs * self.decode * work,
                             prefill_tokens=base.prefill_tokens * self.prefill * work,
                             kv_tokens=base.kv_tokens * self.kv * work)

    def machine(self, base: StepTimeModel, probe: Probe | None) -> tuple[float, float]:
        """How much slower a run's machine is than the fit's, on a step's fixed cost and on its
        per-sequence work. One probe size: one factor for both. Two: each size's slowdown applied
        to the probe's step as the fit splits it (fixed + work at that batch), and the two factors
        that give both steps; where that needs a factor of 0 or less (the readings' noise beyond
        the batch's effect), the full probe's factor for both."""
        if probe is None or probe.requests not in self.references:
            return 1.0, 1.0
        full = probe.run_step_s / self.references[probe.requests]
        if probe.small_requests not in self.references:
            return full, full
        fixed = base.const * self.const

        def work(requests: int) -> float:  # a pure decode step of the probe, half its requests an engine
            per_engine = requests / 2
            return per_engine * (self.decode * base.decode_seqs
                                 + self.kv * base.kv_tokens * (self.probe_prompt_tokens + PROBE_TOKENS / 2))

        small = probe.run_small_step_s / self.references[probe.small_requests]
        w_small, w_full = work(probe.small_requests), work(probe.requests)
        t_small, t_full = small * (fixed + w_small), full * (fixed + w_full)
        work_factor = (t_full - t_small) / (w_full - w_small)
        fixed_factor = (t_small - work_factor * w_small) / fixed
        return (fixed_factor, work_factor) if fixed_factor > 0 and work_factor > 0 else (full, full)
