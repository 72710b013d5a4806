"""The step-time model: its fit on synthetic measurements and its closed forms for runs of steps."""

import numpy as np
import pytest

from benchmarks.simulator.step_time import StepTimeModel, fit

TRUE = StepTimeModel(const=0.015, decode_seqs=0.0012, prefill_tokens=0.00009, kv_tokens=4e-7)


def _measurements(model, n=300, noise=0.02, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        d, p, k = int(rng.integers(0, 64)), int(rng.integers(0, 2048)) * int(rng.random() < 0.3), int(rng.integers(0, 20_000))
        rows.append({"decode_seqs": d, "prefill_tokens": p, "kv_tokens": k,
                     "seconds": model.step(d, p, k) * (1 + noise * rng.standard_normal())})
    return rows


def test_fit_recovers_the_coefficients_of_noisy_synthetic_steps():
    model, errors = fit(_measurements(TRUE, noise=0.01))
    for term in ("const", "decode_seqs", "prefill_tokens", "kv_tokens"):
        assert getattr(model, term) == pytest.approx(getattr(TRUE, term), rel=0.15)
    assert errors["r2"] > 0.99 and errors["median_rel_error"] < 0.03


def test_fit_drops_a_term_that_comes_out_negative_instead_of_rewarding_work():
    no_kv = StepTimeModel(const=0.01, decode_seqs=0.001, prefill_tokens=0.0001, kv_tokens=0.0)
    rows = _measurements(no_kv, noise=0.05, seed=3)
    for r in rows:  # make more KV look slightly cheaper: an unconstrained fit goes negative
        r["seconds"] -= 1e-7 * r["kv_tokens"]
    model, _ = fit(rows)
    assert min(model.model_dump().values()) >= 0.0
    assert model.kv_tokens == 0.0


def test_a_decode_run_costs_the_sum_of_its_steps():
    seqs, kv = 7, 3_000
    steps = [TRUE.step(seqs, 0, kv + i * seqs) for i in range(25)]
    assert TRUE.decode_run(seqs, kv, 25) == pytest.approx(sum(steps))
    assert TRUE.decode_run(seqs, kv, 0) == 0.0


@pytest.mark.parametrize("steps", [0, 1, 2, 17, 400])
def test_steps_within_a_time_inverts_the_run_time(steps):
    seqs, kv = 5, 1_200
    t = TRUE.decode_run(seqs, kv, steps)
    assert TRUE.decode_steps_within(seqs, kv, t + 1e-12) == steps
    if steps:
        assert TRUE.decode_steps_within(seqs, kv, t - 1e-9) == steps - 1
