"""The predictor budget: when a waiting request's prediction can pay for its prefill (no server)."""

import random

import pytest

from predictor.head import LengthBins
from router.scheduling.admission import Admission
from router.scheduling.budget import LengthSpread, MovingRate, PredictorBudget
from router.scheduling.policies import POLICIES
from router.scheduling.pools import Pools
from router.scheduling.request import Request
from router.scheduling.scheduler import Ranking, Scheduler
from router.serving.config import StackConfig

SPREAD = LengthSpread((0.0, 100.0, 200.0, 300.0))


def test_a_moving_rate_follows_the_tokens_not_the_samples():
    rate = MovingRate(weight=0.5)
    assert rate.per_token is None
    rate.observe(1.0, 0)  # no tokens: nothing learned
    assert rate.per_token is None
    rate.observe(0.5, 1)  # a one-token sample: mostly its fixed cost
    rate.observe(10.0, 1000)
    assert rate.per_token == pytest.approx(5.25 / 500.5)  # the long sample sets the rate
    assert 0.0105 > rate.per_token > 0.01


def test_the_spread_is_the_mean_difference_of_two_lengths_capped():
    # Pairs of {0, 100, 200, 300}: sum of |x - y| over the 16 ordered pairs is 2000.
    assert SPREAD.mean_difference() == pytest.approx(2000 / 16)
    assert SPREAD.mean_difference(cap=100) == pytest.approx(2 * (3 * 100) / 16)  # {0, 100, 100, 100}
    assert SPREAD.mean_difference(cap=1) == pytest.approx(6 / 16)
    assert LengthSpread().mean_difference() == 0.0


def _budget(**fields) -> PredictorBudget:
    budget = PredictorBudget(**{"spread": SPREAD, "read_tokens": 256, **fields})
    budget.prefill.observe(0.001 * 100, 100)  # 1 ms a prompt token
    budget.slot.observe(0.05 * 100, 100)  # 50 ms a slot per output token
    return budget


def _request(prompt_tokens: int = 1000, **fields) -> Request:
    return Request("r", "last_work", prompt_tokens=prompt_tokens, max_tokens=fields.pop("max_tokens", None), **fields)


def test_a_prediction_is_made_only_where_its_gain_exceeds_its_cost():
    budget = _budget()
    # cost: 256 tokens read (of 1000) x 1 ms x share 1 x 32 decoding = 8.19 s
    # gain: 96 others / 32 slots x (2 x 0.7 - 1) x 125 tokens / 2 x 50 ms = 3.75 s
    skipped = budget.decide(_request(), waiting=96, slots=32, decoding=32, concordance=0.7)
    assert skipped.verdict == "skipped_by_budget"
    assert (skipped.cost_s, skipped.gain_s) == (pytest.approx(8.192), pytest.approx(3.75))
    assert budget.decide(_request(), waiting=96, slots=32, decoding=8, concordance=0.7).verdict == "predicted"
    assert budget.decide(_request(prompt_tokens=50), 96, 32, 32, 0.7).verdict == "predicted"  # a short prompt
    assert budget.decide(_request(), 96, 32, 32, 0.5).verdict == "skipped_by_budget"  # a coin toss orders nothing
    assert budget.decide(_request(), 0, 32, 1, 0.9).verdict == "skipped_by_budget"  # nobody to pass
    more = budget.decide(_request(), 300, 32, 32, 0.7)
    assert more.verdict == "predicted" and more.gain_s > skipped.gain_s  # the backlog pays for it
    capped = budget.decide(_request(max_tokens=100), 300, 32, 32, 0.7)
    assert capped.gain_s < more.gain_s  # a cap leaves less spread for the head to explain
    assert budget.decide(_request(outputs=4), 96, 32, 32, 0.7).gain_s == pytest.approx(4 * 3.75)
    unscored = budget.decide(_request(), 96, 32, 32, None)  # the floor + margin it is trusted at
    assert unscored.gain_s == pytest.approx(3.75 * (2 * 0.58 - 1) / 0.4)


def test_a_gpu_share_of_its_own_lets_every_waiting_request_be_predicted():
    budget = _budget(share=0.0)
    for waiting, concordance in ((0, 0.5), (1, 0.3), (500, None)):
        decision = budget.decide(_request(prompt_tokens=2048), waiting, 32, 64, concordance)
        assert (decision.verdict, decision.cost_s) == ("predicted", 0.0)
    gpu = StackConfig.model_validate({"predictor": {"gpus": 0.1}}).predictor
    assert gpu.predictor_budget(None, StackConfig().router.live_quality).share == 0.0
    assert StackConfig().predictor.predictor_budget(None, StackConfig().router.live_quality).share == 1.0


def test_unmeasured_speeds_and_the_fixed_modes():
    blind = PredictorBudget(spread=SPREAD)
    assert blind.decide(_request(), 96, 32, 32, 0.7).verdict == "predicted"  # cannot price it yet
    blind.prefill.observe(1.0, 1000)
    assert blind.decide(_request(), 96, 32, 32, 0.7).verdict == "predicted"  # no slot speed yet
    budget = _budget()
    assert budget.decide(_request(), 96, 32, 32, 0.7, mode="always").verdict == "predicted"
    assert _budget(mode="always").decide(_request(), 0, 32, 32, 0.5).verdict == "predicted"
    assert _budget(mode="never").decide(_request(prompt_tokens=1), 999, 1, 0, 1.0).verdict == "skipped_by_budget"
    assert budget.decide(_request(), 999, 1, 0, 1.0, mode="never").verdict == "skipped_by_budget"


def test_a_finished_request_times_a_slot():
    budget = PredictorBudget()
    budget.served(Request("r", "x", dispatched_at=10.0, finished_at=12.0, completion_tokens=40))
    budget.served(Request("r", "x", dispatched_at=10.0, finished_at=99.0, completion_tokens=40, error="timeout"))
    budget.served(Request("r", "x", dispatched_at=10.0, finished_at=99.0, completion_tokens=40, outputs=2))
    assert budget.slot.per_token == pytest.approx(0.05)
    assert budget.report() == {"mode": "auto", "share": 1.0, "prefill_s_per_token": None, "slot_s_per_token": 0.05}


def test_the_scheduler_skips_what_a_signal_ranks_and_prices_the_rest_against_its_queue():
    pools = Pools(("default",), ())
    scheduler = Scheduler(pools, {"default": 1}, POLICIES, "ray_default", rng=random.Random(0),
                          ranking=Ranking(short_cap_tokens=48.0), budget=_budget())
    running = Request("run", "last_work", prompt_tokens=10, max_tokens=1000)
    scheduler.decide(running)
    assert scheduler.admit(running, 0.0) is Admission.DISPATCH
    waiting = []
    for i, fields in enumerate([{}, {"hint_tokens": 20}, {"max_tokens": 8}, {}]):
        request = Request(f"w{i}", "last_work", prompt_tokens=100, **{"max_tokens": 1000, **fields})
        scheduler.decide(request)
        assert scheduler.admit(request, 0.0) is Admission.QUEUED
        waiting.append(request)
    verdicts = [scheduler.worth_predicting(r, 0.9).verdict for r in waiting]
    assert verdicts[1:3] == ["skipped_by_signal", "skipped_by_signal"]
    # The last one waits with three others for one slot while one request decodes:
    # gain 3 / 1 x 0.8 x 125 / 2 x 0.05 = 7.5 s against a cost of 100 x 1 ms x 1 x 1 = 0.1 s.
    last = scheduler.worth_predicting(waiting[3], 0.9)
    assert (last.verdict, last.gain_s, last.cost_s) == ("predicted", pytest.approx(7.5), pytest.approx(0.1))
    assert scheduler.worth_predicting(waiting[3], 0.9, mode="never").verdict == "skipped_by_budget"


def test_the_stack_budgets_with_its_default_heads_training_lengths():
    from router.serving.config import RoutingPlan, build_scheduler

    bins = LengthBins(edges=[0, 20, 100, 400, 1024], centres=[10, 60, 250, 700], max_tokens=1024)
    config = StackConfig.model_validate({"predictor": {"budget": "never", "truncate_prompt_tokens": 64}})
    plan = RoutingPlan("m", Pools(("default",), ()), {"last": bins}, "last", prior_tokens=250.0)
    scheduler = build_scheduler(config, plan, ["last_work"])
    assert (scheduler.budget.mode, scheduler.budget.read_tokens, scheduler.budget.share) == ("never", 64, 1.0)
    assert scheduler.ranking.short_cap_tokens == pytest.approx(8.0)  # 40% of the first quarter-mass bin
    assert scheduler.budget.spread.mean_difference() > 100
    assert scheduler.budget.unscored_concordance == pytest.approx(0.58)
    assert build_scheduler(StackConfig.model_validate({"predictor": None, "router": {"policy": "ray_default"}}),
                           plan, ["ray_default"]).budget.mode == "always"
    with pytest.raises(ValueError):
        StackConfig.model_validate({"predictor": {"budget": "sometimes"}})
