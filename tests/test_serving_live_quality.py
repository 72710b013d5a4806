"""Live prediction quality and the trust switch, without a server."""

import random

import pytest

from router.serving.live_quality import LiveQuality


def _feed(quality: LiveQuality, n: int, informative: bool, rng: random.Random) -> list[bool]:
    flips = []
    for _ in range(n):
        actual = rng.randint(1, 1000)
        predicted = actual + rng.gauss(0, 50) if informative else rng.randint(1, 1000)
        flips.append(quality.observe(predicted, actual, pool_hit=informative))
    return flips


def test_concordance_is_the_share_of_pairs_in_the_right_order():
    q = LiveQuality(window=10, min_samples=2)
    for predicted, actual in [(1, 10), (2, 20), (3, 5)]:  # pairs: (a,b) right, (a,c) wrong, (b,c) wrong
        q.observe(predicted, actual, pool_hit=True)
    assert q.concordance() == pytest.approx(1 / 3)
    r = q.report()
    assert r["mae_tokens"] == pytest.approx((9 + 18 + 2) / 3, abs=0.1) and r["signed_error_tokens"] < 0


def test_the_window_forgets_old_pairs_exactly():
    rng = random.Random(0)
    q = LiveQuality(window=30, min_samples=2)
    samples = [(rng.random(), rng.randint(1, 50)) for _ in range(100)]
    for p, a in samples:
        q.observe(p, a, pool_hit=False)
    fresh = LiveQuality(window=30, min_samples=2)
    for p, a in samples[-30:]:
        fresh.observe(p, a, pool_hit=False)
    assert q.concordance() == pytest.approx(fresh.concordance())


def test_noise_switches_the_router_length_blind_and_signal_wins_trust_back():
    rng = random.Random(1)
    q = LiveQuality(window=100, floor=0.6, margin=0.05, min_samples=50)
    assert not any(_feed(q, 200, informative=True, rng=rng)) and q.trusted
    flips = _feed(q, 200, informative=False, rng=rng)
    assert sum(flips) == 1 and not q.trusted and q.concordance() < 0.6
    flips = _feed(q, 200, informative=True, rng=rng)
    assert sum(flips) == 1 and q.trusted and q.switches == 2


def test_no_switch_before_enough_samples():
    q = LiveQuality(window=100, floor=0.99, min_samples=50)
    _feed(q, 49, informative=False, rng=random.Random(2))
    assert q.trusted
