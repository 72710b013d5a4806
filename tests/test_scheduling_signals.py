"""The length signal chain (told > max_tokens > hint > history > head) and the rank it gives, without a server."""

import random

import pytest

from router.scheduling.policies import POLICIES
from router.scheduling.pools import Pools
from router.scheduling.request import HistoryStats, Prediction, Request
from router.scheduling.scheduler import Ranking, Scheduler
from router.scheduling.signals import Signals

POOLS = Pools(("short", "long"), (100.0,))
SIGNALS = Signals(POOLS, short_cap_tokens=48.0)
HEAD = Prediction("last", 400.0, {"p10": 100.0, "p50": 350.0, "p90": 900.0}, "long", {"short": 0.2, "long": 0.8})
HISTORY = HistoryStats(mean_tokens=200.0, spread_tokens=50.0, count=4)


def _request(**fields) -> Request:
    return Request("r", "last_work", **{"max_tokens": 1000, **fields})


def _source(request: Request, **kwargs) -> str | None:
    estimate = SIGNALS.estimate(request, **kwargs)
    return None if estimate is None else estimate.source


def test_the_cheapest_present_signal_wins():
    every = dict(told_tokens=7, hint_tokens=30, history=HISTORY, prediction=HEAD)
    assert _source(_request(**every), told=True) == "told"
    assert _source(_request(**every)) == "hint"  # told only for the policies that read it
    assert _source(_request(**every, max_tokens=40)) == "max_tokens"  # a cap under the 10th percentile
    assert _source(_request(**every, max_tokens=500, ignore_eos=True)) == "max_tokens"  # it runs to the cap
    assert _source(_request(**every, max_tokens=500, min_tokens=500)) == "max_tokens"
    assert _source(_request(history=HISTORY, prediction=HEAD)) == "history"
    assert _source(_request(prediction=HEAD)) == "head"
    assert _source(_request()) is None
    assert _source(_request(max_tokens=None, hint_tokens=30)) == "hint"  # no cap: no cap signal either


def test_a_distrusted_source_is_passed_over_and_facts_never_are():
    every = dict(hint_tokens=30, history=HISTORY, prediction=HEAD)
    assert _source(_request(**every), distrusted={"hint"}) == "history"
    assert _source(_request(**every), distrusted={"hint", "history"}) == "head"
    assert _source(_request(**every), distrusted={"hint", "history", "last"}) is None
    assert _source(_request(**every, max_tokens=8), distrusted={"hint", "history", "last"}) == "max_tokens"
    assert _source(_request(prediction=HEAD), predicted=False) is None  # a length-blind decider reads no head


def test_every_source_has_the_same_shape_capped_at_max_tokens():
    cap = SIGNALS.estimate(_request(max_tokens=40))
    assert (cap.expected_tokens, cap.quantiles, cap.pool, cap.head) == (40.0, {"p10": 40.0, "p50": 40.0, "p90": 40.0},
                                                                        "short", None)
    hint = SIGNALS.estimate(_request(hint_tokens=3000, max_tokens=500))
    assert (hint.source, hint.expected_tokens) == ("hint", 500.0)
    assert hint.quantiles == {"p10": None, "p50": 500.0, "p90": None}
    assert hint.pool_probabilities is None and hint.tokens("p90") == 500.0  # no spread told: the point stands for it
    history = SIGNALS.estimate(_request(history=HISTORY))
    assert history.expected_tokens == 200.0 and history.quantiles["p10"] == pytest.approx(200 - 1.2816 * 50, abs=0.1)
    assert history.quantiles["p90"] == pytest.approx(200 + 1.2816 * 50, abs=0.1) and history.pool == "long"
    one = SIGNALS.estimate(_request(history=HistoryStats(80.0, 0.0, 1)))
    assert one.quantiles == {"p10": None, "p50": 80.0, "p90": None} and one.pool == "short"  # one length: no spread
    assert SIGNALS.estimate(_request(prediction=HEAD)) is HEAD


def test_live_quality_scores_every_signal_the_request_had_trusted_or_not():
    request = _request(hint_tokens=30, history=HISTORY, prediction=HEAD, max_tokens=40)
    assert [(name, s.expected_tokens) for name, s in SIGNALS.scored(request)] == [
        ("hint", 30.0), ("history", 40.0), ("last", 400.0)]
    assert SIGNALS.scored(_request()) == []


def _scheduler(**ranking) -> Scheduler:
    return Scheduler(POOLS, {"short": 1, "long": 1}, POLICIES, "ray_default", rng=random.Random(0), input_edges=[50],
                     ranking=Ranking(prior_tokens=256.0, short_cap_tokens=48.0, **ranking))


def _decided(scheduler: Scheduler, policy: str = "last_work", **fields) -> Request:
    request = _request(prompt_tokens=5, **fields)
    request.policy = policy
    scheduler.decide(request)
    return request


def test_the_rank_reads_the_estimate_and_a_hint_needs_no_prediction():
    scheduler = _scheduler()
    hinted = _decided(scheduler, hint_tokens=30, prediction=HEAD)
    assert (hinted.rank_tokens, hinted.on_prior, hinted.estimate.source) == (30.0, False, "hint")
    waiting = _decided(scheduler)
    assert (waiting.rank_tokens, waiting.on_prior, waiting.estimate) == (256.0, True, None)
    scheduler.landed(waiting, HEAD, now=1.0)
    assert (waiting.rank_tokens, waiting.estimate.source) == (400.0, "head")
    quantile = _decided(_scheduler(rank_by="p90"), hint_tokens=30)
    assert quantile.rank_tokens == 30.0  # a point ranks as itself whatever the statistic
    blind = _decided(scheduler, policy="ray_default", hint_tokens=30)
    assert blind.rank_tokens is None and blind.estimate.source == "hint"  # told, never ranked


def test_a_distrusted_head_leaves_the_request_to_its_cheap_signals():
    """A trusted hint still decides and ranks the request through its policy; without one the
    fallback decides and it waits in arrival order. A shadow prediction landing later ranks nothing."""
    scheduler = _scheduler()
    scheduler.trust("last", False)
    hinted = _decided(scheduler, hint_tokens=30, prediction=HEAD)
    assert (hinted.decided_by, hinted.fallback, hinted.rank_tokens) == ("last_work", None, 30.0)
    bare = _decided(scheduler, prediction=HEAD)
    assert (bare.decided_by, bare.fallback, bare.rank_tokens) == ("ray_default", "low_live_quality", None)
    bare = _decided(scheduler)
    scheduler.landed(bare, HEAD, now=1.0)
    assert (bare.rank_tokens, bare.estimate) == (None, None)
    scheduler.trust("last", True)
    scheduler.trust("hint", False)
    assert _decided(scheduler, hint_tokens=30, prediction=HEAD).estimate.source == "head"
    assert scheduler.distrusted == {"hint"}
