"""Pool choice, spillover and bin mapping, without a server."""

import random

import pytest

from predictor.head import LengthBins, LengthPrediction
from router.auth import Keys
from router.length_bins import PoolBins
from router.policies import POLICIES, Job, NoDecision, PolicyChain, PolicyContext
from router.pool_load import PoolLoad

POOLS = ["short", "medium", "long"]
BINS = PoolBins(tuple(POOLS), (100.0, 300.0))
KEYS = Keys(api=frozenset(), benchmark=frozenset({"k"}))


def _ctx(capacities=None, replicas=None, seed=0) -> PolicyContext:
    load = PoolLoad(POOLS, capacities or dict.fromkeys(POOLS))
    return PolicyContext(POOLS, BINS, [50, 200], replicas or dict.fromkeys(POOLS, 1), load, random.Random(seed))


def _policy(name, ctx=None):
    return POLICIES[name](ctx or _ctx())


def _occupy(load: PoolLoad, pool: str, n: int = 1) -> None:
    for _ in range(n):
        load.queues[pool].offer(object(), now=0.0)


def test_pool_of_uses_upper_inclusive_edges():
    assert [BINS.pool_of(t) for t in (1, 100, 101, 300, 301, 10_000)] == [
        "short", "short", "medium", "medium", "long", "long"]


def test_pool_edges_must_fit_the_pools():
    with pytest.raises(ValueError):
        PoolBins(("a", "b"), (10.0, 20.0))
    with pytest.raises(ValueError):
        PoolBins(("a", "b", "c"), (30.0, 20.0))


def test_round_robin_cycles():
    policy = _policy("round_robin")
    assert [policy.choose(Job()) for _ in range(4)] == ["short", "medium", "long", "short"]


def test_input_length_buckets_and_needs_a_prompt():
    policy = _policy("input_length")
    assert [policy.choose(Job(prompt_tokens=t)) for t in (10, 50, 51, 500)] == ["short", "short", "medium", "long"]
    with pytest.raises(NoDecision):
        policy.choose(Job())


@pytest.mark.parametrize("name", ["estp", "egtp"])
def test_predicted_policies_take_the_predicted_bin(name):
    policy = _policy(name)
    assert policy.choose(Job(prediction={"bin": "long", "expected_tokens": 400})) == "long"
    with pytest.raises(NoDecision, match="no_prediction"):
        policy.choose(Job(prompt_tokens=10))
    with pytest.raises(NoDecision, match="timeout"):  # the fallback is labelled with the predictor's failure
        policy.choose(Job(prompt_tokens=10, prediction_failure="timeout"))


def test_oracle_bins_the_true_length_and_needs_it():
    policy = _policy("oracle")
    assert policy.choose(Job(true_tokens=250)) == "medium"
    with pytest.raises(NoDecision, match="no_oracle_header"):
        policy.choose(Job())


def test_ray_default_prefers_the_less_loaded_of_two_samples():
    ctx = _ctx()
    _occupy(ctx.load, "short", 5)
    _occupy(ctx.load, "medium", 5)
    policy = _policy("ray_default", ctx)
    # Two of the three possible pairs contain the idle long pool, and it wins them.
    share = sum(policy.choose(Job()) == "long" for _ in range(600)) / 600
    assert share == pytest.approx(2 / 3, abs=0.08)


def test_ray_default_weights_pools_by_replicas():
    policy = _policy("ray_default", _ctx(replicas={"short": 8, "medium": 1, "long": 1}, seed=1))
    picks = [policy.choose(Job()) for _ in range(400)]
    assert picks.count("short") > picks.count("medium") + picks.count("long")


def test_spillover_goes_to_the_nearest_pool_with_room_longer_first():
    load = PoolLoad(POOLS, {"short": 1, "medium": 1, "long": 1})
    assert load.spill("medium") == "medium"
    _occupy(load, "medium")
    assert load.spill("medium") == "long"  # both neighbours free: the longer one
    _occupy(load, "long")
    assert load.spill("medium") == "short"
    _occupy(load, "short")
    assert load.spill("medium") == "medium"  # everything full: stay and queue
    load.queues["long"].release(now=1.0)
    assert load.spill("short") == "long"  # medium full: the next free pool further away


def test_unlimited_pools_never_spill():
    load = PoolLoad(POOLS, {"short": None, "medium": 2, "long": 2})
    _occupy(load, "short", 100)
    assert load.spill("short") == "short"


def _head_bins():
    return LengthBins(edges=[0, 50, 100, 200, 400, 1024], centres=[25, 75, 150, 300, 700], max_tokens=1024)


def test_pool_edges_from_training_quantiles():
    # 5 equal-mass bins: the 1/3 quantile is 2/3 of the way through bin 1, the 2/3 one 1/3 into bin 3.
    bins = PoolBins.from_quantiles(POOLS, _head_bins())
    assert bins.edges == pytest.approx((83.0, 267.0), abs=1)


def test_pool_masses_follow_the_distribution_and_the_cap():
    head = _head_bins()
    probs = [0.0, 0.0, 0.0, 0.5, 0.5]  # all mass above 200
    masses = BINS.masses(head, probs)
    assert masses["short"] == pytest.approx(0.0)
    assert masses["medium"] == pytest.approx(0.25)  # half of the 200-400 bin lies below 300
    assert masses["long"] == pytest.approx(0.75)
    capped = BINS.masses(head, probs, cap=64)  # max_tokens 64: every output ends in short
    assert capped == pytest.approx({"short": 1.0, "medium": 0.0, "long": 0.0})


def test_describe_caps_expectation_and_quantiles_and_names_the_pool():
    head = _head_bins()
    prediction = LengthPrediction(
        expected_tokens=500.0, quantiles={"p10": 220.0, "p50": 400.0, "p90": 900.0}, bin=4,
        probabilities=[0.0, 0.0, 0.0, 0.5, 0.5],
    )
    free = BINS.describe(prediction, head, cap=None)
    assert free["bin"] == "long" and free["expected_tokens"] == 500.0 and free["quantiles"]["p90"] == 900.0
    capped = BINS.describe(prediction, head, cap=64)
    assert capped["bin"] == "short"
    assert capped["expected_tokens"] == pytest.approx(64.0)
    assert capped["quantiles"] == {"p10": 64.0, "p50": 64.0, "p90": 64.0}
    # A cap inside the distribution: E[min(U(200, 400), 300)] = 275 for half the mass, 300 for the rest.
    assert BINS.describe(prediction, head, cap=300)["expected_tokens"] == pytest.approx(0.5 * 275 + 150, abs=0.1)


def _headers(**values) -> dict:
    return {f"x-{k.replace('_', '-')}": v for k, v in values.items()}


def test_benchmark_headers_pick_policy_oracle_length_and_pool():
    from router.routing import benchmark_overrides

    got = benchmark_overrides(_headers(routing_policy="egtp", true_output_tokens="42", target_pool="long",
                                       benchmark_key="k"), True, POLICIES, POOLS, KEYS)
    assert (got.policy, got.true_tokens, got.pool) == ("egtp", 42, "long")
    assert benchmark_overrides({}, True, POLICIES, POOLS, KEYS) == benchmark_overrides({}, False, POLICIES, POOLS, KEYS)


@pytest.mark.parametrize("enabled,headers,fragment", [
    (True, {"routing_policy": "fastest"}, "Unknown routing policy"),
    (True, {"true_output_tokens": "-3"}, "non-negative integer"),
    (True, {"target_pool": "huge"}, "Unknown pool"),
    (False, {"routing_policy": "oracle"}, "benchmark headers are off"),
    (False, {"true_output_tokens": "7"}, "benchmark headers are off"),
])
def test_bad_or_unexpected_benchmark_headers_are_400(enabled, headers, fragment):
    from router.errors import APIError
    from router.routing import benchmark_overrides

    with pytest.raises(APIError, match=fragment) as err:
        benchmark_overrides(_headers(**headers, benchmark_key="k"), enabled, POLICIES, POOLS, KEYS)
    assert err.value.status == 400


def test_benchmark_headers_need_their_own_key():
    """Without it any client could claim its request is 0 tokens long and jump the queue."""
    from router.errors import APIError
    from router.routing import benchmark_overrides

    for key in (None, "wrong"):
        headers = _headers(routing_policy="oracle", true_output_tokens="0", **({"benchmark_key": key} if key else {}))
        with pytest.raises(APIError) as err:
            benchmark_overrides(headers, True, POLICIES, POOLS, KEYS)
        assert err.value.status == 401


def test_engine_priority_is_the_rank_or_the_pools_longest():
    from router.decision import Decider

    decider = Decider(_ctx(), POLICIES, "input_length")
    predicted = Job(prediction={"expected_tokens": 42.4, "bin": "short", "quantiles": {"p90": 80.0}}, true_tokens=500)
    assert decider.engine_priority(decider.decide(predicted, "estp"), 4096) == 42
    assert decider.engine_priority(decider.decide(predicted, "oracle"), 4096) == 500
    capped = Job(true_tokens=500, max_tokens=64)
    assert decider.engine_priority(decider.decide(capped, "oracle"), 4096) == 64
    blind = [decider.decide(Job(prompt_tokens=t), "input_length") for t in (10, 100, 500)]
    assert [d.rank_tokens for d in blind] == [None] * 3
    assert [decider.engine_priority(d, 4096) for d in blind] == [100, 300, 4096]


def test_rank_by_a_quantile_and_length_blind_policies_rank_nothing():
    from router.decision import Decider

    job = Job(prompt_tokens=5, prediction={"expected_tokens": 40.0, "bin": "short", "quantiles": {"p90": 90.0}})
    assert Decider(_ctx(), POLICIES, "input_length", rank_by="p90").decide(job, "estp_work").rank_tokens == 90.0
    assert Decider(_ctx(), POLICIES, "input_length").decide(job, "ray_default").rank_tokens is None
    assert Decider(_ctx(), POLICIES, "input_length", shortest_first=False).decide(job, "estp").rank_tokens is None


def test_a_work_policy_without_its_prediction_ranks_on_the_prior_and_says_so():
    from router.decision import Decider

    decider = Decider(_ctx(), POLICIES, "input_length", prior_tokens=256.0)
    waiting = decider.decide(Job(prompt_tokens=5, max_tokens=100), "last_work")
    assert (waiting.rank_tokens, waiting.on_prior) == (100.0, True)  # the prior, bounded by max_tokens
    predicted = Job(prompt_tokens=5, max_tokens=100, prediction={"expected_tokens": 40.0, "bin": "short", "quantiles": {}})
    assert decider.ranking(predicted, "last_work") == (40.0, False)
    assert decider.ranking(Job(prompt_tokens=5), "ray_default") == (None, False)


def test_effective_length_counts_forced_tokens_and_every_sequence():
    from router.policies import work_tokens

    assert work_tokens(Job(max_tokens=500), 30) == 30
    assert work_tokens(Job(max_tokens=500, ignore_eos=True), 30) == 500  # ignore_eos runs to the cap
    assert work_tokens(Job(max_tokens=500, min_tokens=200), 30) == 200
    assert work_tokens(Job(max_tokens=100), 300) == 100
    assert work_tokens(Job(max_tokens=100, outputs=8), 30) == 240  # n = 8


def test_a_forced_length_cannot_land_in_the_short_pool():
    from router.decision import Decider

    decider = Decider(_ctx(), POLICIES, "input_length", spillover=False)
    short = {"bin": "short", "expected_tokens": 10.0, "quantiles": {}}
    assert decider.decide(Job(prediction=short, max_tokens=2000), "estp").pool == "short"
    assert decider.decide(Job(prediction=short, max_tokens=2000, ignore_eos=True), "estp").pool == "long"
    assert decider.decide(Job(prediction=short, max_tokens=2000, min_tokens=150), "estp").pool == "medium"
    # Whoever decides: the fallback too (a short prompt, no prediction).
    assert decider.decide(Job(prompt_tokens=5, max_tokens=2000, ignore_eos=True), "estp").pool == "long"


def test_work_policies_never_fall_back_and_pick_pools_as_ray_does():
    chain = PolicyChain(_ctx(), ["estp_work"], "input_length")
    pool, policy, reason = chain.choose(Job(prediction_failure="timeout"), "estp_work")
    assert (policy, reason) == ("estp_work", None) and pool in POOLS


def test_policy_chain_falls_back_to_the_fallback_then_round_robin():
    chain = PolicyChain(_ctx(), ["estp"], "input_length")
    predicted = Job(prompt_tokens=5, prediction={"bin": "long", "expected_tokens": 500.0})
    assert chain.choose(predicted, "estp") == ("long", "estp", None)
    assert chain.choose(Job(prompt_tokens=5, prediction_failure="timeout"), "estp")[1:] == ("input_length", "timeout")
    pool, policy, reason = chain.choose(Job(prediction_failure="unsupported_prompt"), "estp")
    assert (policy, reason) == ("round_robin", "unsupported_prompt") and pool in ("short", "medium", "long")
