"""Pool choice, spillover, ranks and the pools' edges: the scheduling core's decisions, without a server."""

import random

import pytest

from predictor.head import LengthBins, LengthPrediction
from router.scheduling.admission import QueueOrder
from router.scheduling.policies import POLICIES, NoDecision, PolicyChain, PolicyContext
from router.scheduling.pools import Pools
from router.scheduling.request import Prediction, Request
from router.scheduling.scheduler import Ranking, Scheduler

POOLS = ["short", "medium", "long"]
EDGES = Pools(tuple(POOLS), (100.0, 300.0))


def _scheduler(slots=None, replicas=None, seed=0, **kwargs) -> Scheduler:
    return Scheduler(EDGES, slots or dict.fromkeys(POOLS), POLICIES, "input_length", input_edges=[50, 200],
                     replicas=replicas or dict.fromkeys(POOLS, 1), rng=random.Random(seed), **kwargs)


def _ctx(scheduler: Scheduler) -> PolicyContext:
    return PolicyContext(EDGES, [50, 200], dict.fromkeys(POOLS, 1), scheduler.inflight, scheduler.estimate,
                         random.Random(0))


def _prediction(pool: str, expected: float, **quantiles) -> Prediction:
    return Prediction("estp", expected, quantiles, pool, {})


def _occupy(scheduler: Scheduler, pool: str, n: int = 1) -> None:
    for i in range(n):
        scheduler.admit(Request(id=f"{pool}{i}{random.random()}", policy="round_robin", pool=pool), now=0.0)


def _choose(name: str, request: Request, scheduler: Scheduler | None = None) -> str:
    return POLICIES[name].chooser(_ctx(scheduler or _scheduler())).choose(request)


def test_pool_of_uses_upper_inclusive_edges():
    assert [EDGES.pool_of(t) for t in (1, 100, 101, 300, 301, 10_000)] == [
        "short", "short", "medium", "medium", "long", "long"]


def test_pool_edges_must_fit_the_pools():
    with pytest.raises(ValueError):
        Pools(("a", "b"), (10.0, 20.0))
    with pytest.raises(ValueError):
        Pools(("a", "b", "c"), (30.0, 20.0))


def test_round_robin_cycles():
    chooser = POLICIES["round_robin"].chooser(_ctx(_scheduler()))
    assert [chooser.choose(Request("r", "round_robin")) for _ in range(4)] == ["short", "medium", "long", "short"]


def test_input_length_buckets_and_needs_a_prompt():
    assert [_choose("input_length", Request("r", "input_length", prompt_tokens=t)) for t in (10, 50, 51, 500)] == [
        "short", "short", "medium", "long"]
    with pytest.raises(NoDecision):
        _choose("input_length", Request("r", "input_length"))


@pytest.mark.parametrize("name", ["estp", "egtp", "last"])
def test_predicted_policies_take_the_predicted_pool(name):
    assert _choose(name, Request("r", name, prediction=_prediction("long", 400))) == "long"
    with pytest.raises(NoDecision, match="no_prediction"):
        _choose(name, Request("r", name, prompt_tokens=10))
    with pytest.raises(NoDecision, match="timeout"):  # the fallback is labelled with the predictor's failure
        _choose(name, Request("r", name, prompt_tokens=10, prediction_failure="timeout"))


@pytest.mark.parametrize("name", ["estp", "egtp", "last"])
def test_predicted_policies_pool_by_a_cheaper_signal_first(name):
    long = _prediction("long", 400)
    # A hint, or a max_tokens that is the length (short_cap_tokens), picks the pool, prediction or not.
    assert _choose(name, Request("r", name, prediction=long, hint_tokens=250)) == "medium"
    assert _choose(name, Request("r", name, hint_tokens=40)) == "short"
    capped = _scheduler(ranking=Ranking(short_cap_tokens=50))
    assert _choose(name, Request("r", name, prediction=long, max_tokens=30), capped) == "short"
    # A cap above short_cap_tokens is no length: the head's pool.
    assert _choose(name, Request("r", name, prediction=long, max_tokens=2000), capped) == "long"
    # A hint live quality distrusts is passed over for the head.
    distrusting = _scheduler()
    distrusting.trust("hint", False)
    assert _choose(name, Request("r", name, prediction=long, hint_tokens=40), distrusting) == "long"


def test_oracle_pools_the_told_length_and_needs_it():
    assert _choose("oracle", Request("r", "oracle", told_tokens=250)) == "medium"
    with pytest.raises(NoDecision, match="no_oracle_header"):
        _choose("oracle", Request("r", "oracle"))


def test_ray_default_prefers_the_less_loaded_of_two_samples():
    scheduler = _scheduler()
    _occupy(scheduler, "short", 5)
    _occupy(scheduler, "medium", 5)
    chooser = POLICIES["ray_default"].chooser(_ctx(scheduler))
    # Two of the three possible pairs contain the idle long pool, and it wins them.
    share = sum(chooser.choose(Request("r", "ray_default")) == "long" for _ in range(600)) / 600
    assert share == pytest.approx(2 / 3, abs=0.08)


def test_ray_default_weights_pools_by_replicas():
    scheduler = _scheduler()
    ctx = PolicyContext(EDGES, [], {"short": 8, "medium": 1, "long": 1}, scheduler.inflight, scheduler.estimate,
                        random.Random(1))
    chooser = POLICIES["ray_default"].chooser(ctx)
    picks = [chooser.choose(Request("r", "ray_default")) for _ in range(400)]
    assert picks.count("short") > picks.count("medium") + picks.count("long")


def test_spillover_goes_to_the_nearest_pool_with_room_longer_first():
    scheduler = _scheduler(slots=dict.fromkeys(POOLS, 1))
    assert scheduler.spill("medium") == "medium"
    _occupy(scheduler, "medium")
    assert scheduler.spill("medium") == "long"  # both neighbours free: the longer one
    _occupy(scheduler, "long")
    assert scheduler.spill("medium") == "short"
    _occupy(scheduler, "short")
    assert scheduler.spill("medium") == "medium"  # everything full: stay and queue
    scheduler.release("long", now=1.0)
    assert scheduler.spill("short") == "long"  # medium full: the next free pool further away


def test_unlimited_pools_never_spill():
    scheduler = _scheduler(slots={"short": None, "medium": 2, "long": 2})
    _occupy(scheduler, "short", 100)
    assert scheduler.spill("short") == "short"


def _head_bins():
    return LengthBins(edges=[0, 50, 100, 200, 400, 1024], centres=[25, 75, 150, 300, 700], max_tokens=1024)


def test_pool_edges_from_training_quantiles():
    # 5 equal-mass bins: the 1/3 quantile is 2/3 of the way through bin 1, the 2/3 one 1/3 into bin 3.
    assert Pools.from_quantiles(POOLS, _head_bins()).edges == pytest.approx((83.0, 267.0), abs=1)


def test_pool_masses_follow_the_distribution_and_the_cap():
    head = _head_bins()
    probs = [0.0, 0.0, 0.0, 0.5, 0.5]  # all mass above 200
    masses = EDGES.masses(head, probs)
    assert masses["short"] == pytest.approx(0.0)
    assert masses["medium"] == pytest.approx(0.25)  # half of the 200-400 bin lies below 300
    assert masses["long"] == pytest.approx(0.75)
    capped = EDGES.masses(head, probs, cap=64)  # max_tokens 64: every output ends in short
    assert capped == pytest.approx({"short": 1.0, "medium": 0.0, "long": 0.0})


def test_describe_caps_expectation_and_quantiles_and_names_the_pool():
    head = _head_bins()
    prediction = LengthPrediction(expected_tokens=500.0, quantiles={"p10": 220.0, "p50": 400.0, "p90": 900.0}, bin=4,
                                  probabilities=[0.0, 0.0, 0.0, 0.5, 0.5])
    free = EDGES.describe("estp", prediction, head, cap=None)
    assert (free.pool, free.expected_tokens, free.quantiles["p90"], free.head) == ("long", 500.0, 900.0, "estp")
    capped = EDGES.describe("estp", prediction, head, cap=64)
    assert capped.pool == "short"
    assert capped.expected_tokens == pytest.approx(64.0)
    assert capped.quantiles == {"p10": 64.0, "p50": 64.0, "p90": 64.0}
    # A cap inside the distribution: E[min(U(200, 400), 300)] = 275 for half the mass, 300 for the rest.
    assert EDGES.describe("estp", prediction, head, cap=300).expected_tokens == pytest.approx(0.5 * 275 + 150, abs=0.1)


def _decided(scheduler: Scheduler, **fields) -> Request:
    request = Request("r", **fields)
    scheduler.decide(request)
    return request


def test_engine_priority_is_the_rank_or_the_pools_longest():
    scheduler = _scheduler()
    prediction = _prediction("short", 42.4, p90=80.0)
    assert scheduler.priority(_decided(scheduler, policy="estp", prediction=prediction, told_tokens=500), 4096) == 42
    assert scheduler.priority(_decided(scheduler, policy="oracle", prediction=prediction, told_tokens=500), 4096) == 500
    assert scheduler.priority(_decided(scheduler, policy="oracle", told_tokens=500, max_tokens=64), 4096) == 64
    blind = [_decided(scheduler, policy="input_length", prompt_tokens=t) for t in (10, 100, 500)]
    assert [r.rank_tokens for r in blind] == [None] * 3
    assert [scheduler.priority(r, 4096) for r in blind] == [100, 300, 4096]


def test_rank_by_a_quantile_and_length_blind_policies_rank_nothing():
    prediction = _prediction("short", 40.0, p90=90.0)
    assert _decided(_scheduler(ranking=Ranking(rank_by="p90")), policy="estp_work", prompt_tokens=5,
                    prediction=prediction).rank_tokens == 90.0
    assert _decided(_scheduler(), policy="ray_default", prediction=prediction).rank_tokens is None
    assert _decided(_scheduler(ranking=Ranking(shortest_first=False)), policy="estp",
                    prediction=prediction).rank_tokens is None


def test_a_work_policy_without_its_prediction_ranks_on_the_prior_until_it_lands():
    scheduler = _scheduler(ranking=Ranking(prior_tokens=256.0))
    waiting = _decided(scheduler, policy="last_work", prompt_tokens=5, max_tokens=100)
    assert (waiting.rank_tokens, waiting.on_prior) == (100.0, True)  # the prior, bounded by max_tokens
    scheduler.landed(waiting, _prediction("short", 40.0), now=1.0)
    assert (waiting.rank_tokens, waiting.on_prior, waiting.predicted_at) == (40.0, False, 1.0)
    assert _decided(scheduler, policy="ray_default", prompt_tokens=5).rank_tokens is None


def test_a_late_prediction_reranks_a_waiting_request_in_its_queue():
    scheduler = _scheduler(slots=dict.fromkeys(POOLS, 1), ranking=Ranking(prior_tokens=500.0),
                           order=QueueOrder(100.0))
    running = _decided(scheduler, policy="last_work", prompt_tokens=5)
    scheduler.admit(running, 0.0)
    known = Request("known", "last_work", prompt_tokens=5, prediction=_prediction("short", 300.0))
    late = Request("late", "last_work", prompt_tokens=5)
    for r in (known, late):
        scheduler.decide(r, spill=False)
        r.pool = running.pool
        scheduler.admit(r, 0.0)
    scheduler.landed(late, _prediction("short", 10.0), now=0.5)
    assert scheduler.release(running.pool, 1.0) is late


def test_effective_length_counts_forced_tokens_and_every_sequence():
    assert Request("r", "x", max_tokens=500).work_tokens(30) == 30
    assert Request("r", "x", max_tokens=500, ignore_eos=True).work_tokens(30) == 500  # ignore_eos runs to the cap
    assert Request("r", "x", max_tokens=500, min_tokens=200).work_tokens(30) == 200
    assert Request("r", "x", max_tokens=100).work_tokens(300) == 100
    assert Request("r", "x", max_tokens=100, outputs=8).work_tokens(30) == 240  # n = 8


def test_a_forced_length_cannot_land_in_the_short_pool():
    scheduler = _scheduler(spillover=False)
    short = _prediction("short", 10.0)
    assert _decided(scheduler, policy="estp", prediction=short, max_tokens=2000).pool == "short"
    assert _decided(scheduler, policy="estp", prediction=short, max_tokens=2000, ignore_eos=True).pool == "long"
    assert _decided(scheduler, policy="estp", prediction=short, max_tokens=2000, min_tokens=150).pool == "medium"
    # Whoever decides: the fallback too (a short prompt, no prediction).
    assert _decided(scheduler, policy="estp", prompt_tokens=5, max_tokens=2000, ignore_eos=True).pool == "long"


def test_work_policies_never_fall_back_and_pick_pools_as_ray_does():
    chain = PolicyChain(_ctx(_scheduler()), ["estp_work"], "input_length")
    pool, policy, reason = chain.choose(Request("r", "estp_work", prediction_failure="timeout"), "estp_work")
    assert (policy, reason) == ("estp_work", None) and pool in POOLS


def test_policy_chain_falls_back_to_the_fallback_then_round_robin():
    chain = PolicyChain(_ctx(_scheduler()), ["estp"], "input_length")
    predicted = Request("r", "estp", prompt_tokens=5, prediction=_prediction("long", 500.0))
    assert chain.choose(predicted, "estp") == ("long", "estp", None)
    assert chain.choose(Request("r", "estp", prompt_tokens=5, prediction_failure="timeout"), "estp")[1:] == (
        "input_length", "timeout")
    pool, policy, reason = chain.choose(Request("r", "estp", prediction_failure="unsupported_prompt"), "estp")
    assert (policy, reason) == ("round_robin", "unsupported_prompt") and pool in POOLS


def test_an_untrusted_head_hands_the_decision_to_the_fallback():
    request = Request("r", "estp", prompt_tokens=5, prediction=_prediction("long", 500.0))
    scheduler = _scheduler()
    scheduler.trust("estp", False)
    scheduler.decide(request)
    assert (request.decided_by, request.fallback, request.pool) == ("input_length", "low_live_quality", "short")


def test_an_untrusted_head_still_pools_a_request_by_its_trusted_hint():
    scheduler = _scheduler()
    scheduler.trust("estp", False)
    hinted = Request("r", "estp", prompt_tokens=5, prediction=_prediction("short", 20.0), hint_tokens=500)
    scheduler.decide(hinted)
    assert (hinted.decided_by, hinted.fallback, hinted.pool) == ("estp", None, "long")
    scheduler.trust("hint", False)  # a distrusted hint gives nothing either: the fallback decides
    again = Request("r2", "estp", prompt_tokens=5, prediction=_prediction("short", 20.0), hint_tokens=500)
    scheduler.decide(again)
    assert (again.decided_by, again.fallback, again.pool) == ("input_length", "low_live_quality", "short")


def test_a_planned_pool_is_kept_without_spillover():
    scheduler = _scheduler(slots=dict.fromkeys(POOLS, 1))
    _occupy(scheduler, "long")
    request = _decided(scheduler, policy="estp", target_pool="long", prediction=_prediction("short", 10.0))
    assert (request.pool, request.decided_by, request.rank_tokens) == ("long", "estp", 10.0)
