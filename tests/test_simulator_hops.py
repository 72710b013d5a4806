"""The hops before the router: a request sent alone arrives at once, one of a burst waits for the proxy."""

import numpy as np
import pytest

from benchmarks.simulator.hops import Hops, measure, near


def test_requests_sent_together_reach_the_router_later_than_one_sent_alone():
    hops = Hops(in_s=0.02, in_per_request_s=0.008)
    sent = np.concatenate([np.zeros(128), [100.0]])  # a burst of 128, then one alone
    arrivals = hops.router_arrivals(sent)
    assert arrivals[-1] == pytest.approx(100.02)
    assert arrivals[0] == pytest.approx(0.02 + 127 * 0.008)
    # a cluster of 64 nodes has 64 proxies taking the same burst
    assert hops.router_arrivals(sent, proxies=64)[0] == pytest.approx(0.02 + 127 * 0.008 / 64)


def test_near_counts_the_requests_within_the_window_either_side():
    assert near(np.array([0.0, 0.5, 1.2, 5.0])).tolist() == [2, 3, 2, 1]


def test_measure_recovers_the_delays_runs_were_made_with():
    rng = np.random.default_rng(0)
    burst = np.sort(rng.uniform(0, 0.2, 100))
    load = np.cumsum(rng.exponential(10.0, 50))
    truth = Hops(0.03, 0.007, 0.01)
    sent = [burst, load]
    arrived = [truth.router_arrivals(s) + rng.normal(0, 0.002, len(s)) for s in sent]
    hops = measure(sent, arrived, np.full(10, 0.01))
    assert hops.in_s == pytest.approx(0.03, abs=0.005)
    assert hops.in_per_request_s == pytest.approx(0.007, rel=0.05)
    assert hops.out_s == pytest.approx(0.01)


def test_runs_that_never_sent_together_measure_only_the_lone_delay():
    sent = [np.arange(0.0, 100.0, 5.0)]
    hops = measure(sent, [sent[0] + 0.04], np.array([]))
    assert hops.in_s == pytest.approx(0.04) and hops.in_per_request_s == 0.0 and hops.out_s == 0.0
