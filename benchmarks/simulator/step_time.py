"""How long one engine step takes, from what the step computes.

A continuous-batching engine step runs every running sequence's next decode token plus the
prefill chunks scheduled with them, so its time is close to linear in three counts:

    t_step = a + b * decode_seqs + c * prefill_tokens + d * kv_tokens

a: fixed per-step cost (scheduling, sampling, Python, IPC); b: per decoded sequence (the MLPs
and LM head on one token); c: per prompt token prefilled; d: attention reads over the KV cache
(the context of every running sequence). The coefficients are a parameter file
(benchmarks/results/step_time_calibration.json): `python -m benchmarks.simulator calibrate`
refits them on whatever machine and model it runs on, a GPU included.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

TERMS = ("const", "decode_seqs", "prefill_tokens", "kv_tokens")


class StepTimeModel(BaseModel):
    const: float
    decode_seqs: float
    prefill_tokens: float
    kv_tokens: float

    def step(self, decode_seqs: float, prefill_tokens: float, kv_tokens: float) -> float:
        return self.const + self.decode_seqs * decode_seqs + self.prefill_tokens * prefill_tokens \
            + self.kv_tokens * kv_tokens

    def decode_run(self, seqs: int, kv_tokens: float, steps: int) -> float:
        """Time of `steps` pure decode steps of `seqs` sequences; the KV cache grows by `seqs` a step."""
        per_step = self.const + self.decode_seqs * seqs + self.kv_tokens * kv_tokens
        return steps * per_step + self.kv_tokens * seqs * steps * (steps - 1) / 2

    def decode_steps_within(self, seqs: int, kv_tokens: float, budget: float) -> int:
        """How many whole decode steps of `seqs` sequences end within `budget` seconds."""
        base = self.const + self.decode_seqs * seqs + self.kv_tokens * kv_tokens
        growth = self.kv_tokens * seqs
        if growth <= 0:
            return int(budget // base)
        # growth/2 k^2 + (base - growth/2) k - budget <= 0
        half = growth / 2
        k = (-(base - half) + np.sqrt((base - half) ** 2 + 4 * half * budget)) / (2 * half)
        k = int(k)
        while k > 0 and self.decode_run(seqs, kv_tokens, k) > budget:
            k -= 1
        while self.decode_run(seqs, kv_tokens, k + 1) <= budget:
            k += 1
        return k


def fit(rows: list[dict]) -> tuple[StepTimeModel, dict]:
    """Least squares over measured steps, coefficients held non-negative; returns the fit's errors.

    A term whose unconstrained coefficient comes out negative (noise where its effect is tiny) is
    dropped and the rest refitted, so the model never predicts faster steps for more work.
    """
    x = np.array([[1.0, r["decode_seqs"], r["prefill_tokens"], r["kv_tokens"]] for r in rows])
    y = np.array([r["seconds"] for r in rows])
    active = list(range(len(TERMS)))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        negative = [a for a, c in zip(active, coef) if c < 0]
        if not negative:
            break
        active.remove(negative[0])
    full = np.zeros(len(TERMS))
    full[active] = coef
    model = StepTimeModel(**dict(zip(TERMS, full.tolist())))
    pred = x @ full
    rel = np.abs(pred - y) / y
    r2 = 1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    return model, {"steps": len(rows), "r2": float(r2), "median_rel_error": float(np.median(rel)),
                   "mean_rel_error": float(rel.mean()), "p90_rel_error": float(np.quantile(rel, 0.9))}
