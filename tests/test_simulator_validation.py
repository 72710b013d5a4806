"""The validation's judgements: the noise floor of single real runs and the sign check (pure maths)."""

import pytest

from benchmarks.simulator.validation import AGGREGATES, merged, noise_floor, sign_agreement


def _run(jct: float) -> dict:
    return {metric: jct for metric in AGGREGATES}


def test_the_noise_floor_is_how_far_single_runs_land_from_their_repeats_mean():
    real = {"burst/a": [_run(90), _run(110)], "burst/b": [_run(200), _run(200)], "burst/c": [_run(50)]}
    floor = noise_floor(real)
    assert floor["mean_jct_s"] == pytest.approx((0.1 + 0.1 + 0 + 0) / 4)  # a policy run once has no spread
    assert noise_floor({"burst/c": [_run(50)]})["mean_jct_s"] is None


def test_a_difference_counts_only_when_every_repeat_agrees_and_the_simulator_must_share_its_sign():
    real = {"w/ray_default": [_run(100), _run(100)], "w/fast": [_run(80), _run(90)], "w/mixed": [_run(90), _run(110)],
            "w/slow": [_run(120), _run(125)]}
    sim = {"w/ray_default": [_run(100), _run(100)], "w/fast": [_run(95), _run(95)], "w/mixed": [_run(50), _run(50)],
           "w/slow": [_run(99), _run(99)]}
    result = sign_agreement(real, sim)
    rows = {row["policy"]: row for row in result["rows"]}
    assert not rows["mixed"]["resolved"]  # -10% and +10%: within the repeats' spread
    assert rows["fast"]["resolved"] and rows["fast"]["same_sign"]
    assert rows["slow"]["resolved"] and not rows["slow"]["same_sign"]
    assert (result["agree"], result["of"]) == (1, 2) and type(result["agree"]) is int  # JSON-safe


def test_the_predictors_busy_time_is_the_union_of_its_requests_waits():
    assert merged([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (3.0, 4.0)]) == [(0.0, 4.0), (5.0, 6.0)]
    assert merged([]) == []
