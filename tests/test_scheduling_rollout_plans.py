"""The rollout plans' pure decisions: what a sample is estimated by, how a cut or partial length is
read, which samples first-k cuts, and where a continued sample asks to run."""

import math

import pytest

from router.scheduling.length_stats import censored_stats
from router.scheduling.replica_choice import ReplicaLoad
from router.scheduling.request import CUT, HistoryStats, Prediction, Request
from router.scheduling.rollout_plans import (FirstK, RolloutPlan, SiblingEstimates, call_tokens, estimate, outcome,
                                             signal)


def _sample(i, family=0, **fields) -> Request:
    return Request(id=f"s{i}", policy="rollout_fifo", family=family, max_tokens=fields.pop("max_tokens", 500), **fields)


def _prediction(tokens: float) -> Prediction:
    return Prediction("last", tokens, {"p10": tokens, "p50": tokens, "p90": tokens}, "p", {"p": 1.0})


def _ended(sample: Request, tokens: int, reason: str = "stop") -> Request:
    sample.completion_tokens, sample.finish_reason = tokens, reason
    return sample


def test_exact_lengths_give_their_mean_and_spread():
    stats = censored_stats([(10, False), (20, False)])
    assert (stats.mean_tokens, stats.spread_tokens, stats.count) == (15.0, 5.0, 2)
    assert censored_stats([]) is None


def test_a_prompt_whose_samples_were_all_cut_is_at_least_as_long_as_its_longest_cut():
    assert censored_stats([(10, True), (20, True)]).mean_tokens == 20.0  # not their average, 15


def test_a_censored_length_thins_the_risk_set_without_ending_a_sample():
    # 40 exact, 40 cut (still running at 40), 80 exact: S drops to 2/3 at 40, to 0 at 80.
    stats = censored_stats([(80, False), (40, True), (40, False)])
    assert stats.mean_tokens == pytest.approx(40 + 40 * 2 / 3)
    assert stats.count == 3


def test_told_beats_history_beats_the_head_and_every_estimate_is_capped():
    history = HistoryStats(mean_tokens=300.0, spread_tokens=20.0, count=4)
    assert signal(_sample(0, prediction=_prediction(100))) == (100, "head")
    assert signal(_sample(0, prediction=_prediction(100), history=history)) == (300, "history")
    assert signal(_sample(0, prediction=_prediction(100), history=history, told_tokens=7)) == (7, "told")
    assert signal(_sample(0)) is None and estimate(_sample(0)) is None
    assert estimate(_sample(0, history=history, max_tokens=200)) == 200


def test_a_continued_sample_is_estimated_by_what_is_left_or_as_long_again_once_it_outlived_its_estimate():
    assert estimate(_sample(0, told_tokens=300, resumed_tokens=100)) == 200
    assert estimate(_sample(0, told_tokens=300, resumed_tokens=250)) == 250


def test_the_budget_caps_the_call_and_a_sample_stopped_by_it_is_partial_not_done():
    sample = _sample(0, max_tokens=100)
    assert call_tokens(sample, None) == 100 and call_tokens(sample, 30) == 30 and call_tokens(sample, 300) == 100
    assert outcome(_ended(_sample(0, max_tokens=100), 30, "length")) == "partial"
    assert outcome(_ended(_sample(0, max_tokens=100), 100, "length")) == "done"  # its own cap: a censored done
    assert outcome(_ended(_sample(0), 12)) == "done"
    failed = _ended(_sample(0), 12)
    failed.error = "RuntimeError: boom"
    assert outcome(failed) == "failed" and outcome(_sample(0, finish_reason=CUT)) == "cut"


def test_first_k_cuts_a_prompts_other_samples_once_k_are_done_and_only_those():
    a = [_sample(i, family="a") for i in range(3)]
    b = [_sample(i + 3, family="b") for i in range(3)]
    enough = FirstK(a + b, k=1)
    for s in (a[0], a[1], b[0]):
        enough.started(s)
    assert enough.ended(_ended(a[0], 10)) == [a[1]]  # the running sibling is for the driver to abort
    assert a[1].finish_reason == CUT and a[2].finish_reason == CUT and a[2].completion_tokens == 0
    assert not enough.wanted(a[2]) and enough.wanted(b[1])
    assert b[0].finish_reason is None and enough.unstarted == 2  # b's waiting samples still run
    assert enough.ended(_ended(a[1], 4)) == []  # the cut one ending cuts nothing more


def test_a_sample_whose_last_token_is_in_is_never_cut():
    family = [_sample(i, max_tokens=100) for i in range(2)]
    enough = FirstK(family, k=1)
    for s in family:
        enough.started(s)
    family[1].finish_reason, family[1].completion_tokens = "length", 100  # its stream not yet closed
    assert enough.ended(_ended(family[0], 10)) == [] and family[1].finish_reason == "length"
    assert enough.ended(family[1]) == [] and outcome(family[1]) == "done"


def test_partial_and_failed_samples_never_count_towards_k():
    family = [_sample(i, max_tokens=100) for i in range(3)]
    enough = FirstK(family, k=1)
    for s in family:
        enough.started(s)
    assert enough.ended(_ended(family[0], 30, "length")) == []  # partial: stopped by a budget of 30
    failed = _ended(family[1], 5)
    failed.error = "RuntimeError: replica died"
    assert enough.ended(failed) == []
    assert enough.ended(_ended(family[2], 7)) == []  # the first done one: nothing left to cut


def test_a_share_of_the_batch_cuts_everything_else_when_it_is_reached():
    samples = [_sample(i, family=i % 2) for i in range(4)]
    enough = FirstK(samples, share=0.5)
    for s in samples[:3]:
        enough.started(s)
    assert enough.ended(_ended(samples[0], 10)) == []
    assert enough.ended(_ended(samples[1], 20)) == [samples[2]]
    assert samples[3].finish_reason == CUT and enough.unstarted == 0
    with pytest.raises(ValueError):
        FirstK(samples, k=1, share=0.5)


def test_without_k_every_sample_runs_to_its_end():
    samples = [_sample(i) for i in range(2)]
    enough = FirstK(samples)
    for s in samples:
        enough.started(s)
    assert enough.ended(_ended(samples[0], 1)) == [] and samples[1].finish_reason is None


def test_siblings_read_a_cut_sibling_as_at_least_its_length_and_a_history_by_its_count():
    siblings = SiblingEstimates()
    siblings.finished("p", 100, censored=True)
    siblings.finished("p", 200, censored=True)
    assert siblings.estimate("p", 50.0, weight=2) == pytest.approx((2 * 50 + 2 * 200) / 4)
    plan = RolloutPlan([], "makespan", siblings=True)
    waiting = _sample(0, family="q", history=HistoryStats(300.0, 0.0, 8))
    plan.finished(_ended(_sample(1, family="q"), 100))
    assert plan.current_estimate(waiting) == pytest.approx((8 * 300 + 100) / 9)


def test_a_plan_never_starts_a_cut_sample_and_caps_its_estimates_at_the_budget():
    samples = [_sample(i, told_tokens=t) for i, t in enumerate([50, 400, 100])]
    plan = RolloutPlan(samples, "makespan", budget=120)
    samples[1].finish_reason = CUT
    assert len(plan) == 2 and plan.next() is samples[2] and plan.current_estimate(samples[0]) == 50
    assert math.isclose(plan.current_estimate(_sample(9, told_tokens=400)), 120)


def test_a_continued_sample_keeps_the_replica_that_holds_its_prefix_while_it_has_room():
    plan = RolloutPlan([], "makespan")
    loads = [ReplicaLoad("r1", 0, 0.0), ReplicaLoad("r2", 3, 900.0)]
    assert plan.place(_sample(0, told_tokens=10, pinned="r2"), loads) == "r2"
    assert plan.place(_sample(0, told_tokens=10, pinned="gone"), loads) == "r1"  # least work instead
    assert RolloutPlan([], "fifo").place(_sample(0, pinned="gone"), loads) is None


def test_a_first_k_plan_starts_every_prompts_first_k_before_any_extra():
    """RollPacker's tail batching: the samples past each prompt's k, the likeliest to be cut, start
    last, so the last prompts' k do not wait behind the first prompts' extras."""
    samples = [_sample(i, family=i // 3) for i in range(6)]  # two prompts x 3 samples, k = 2
    enough = FirstK(samples, k=2)
    assert enough.tail == {"s2", "s5"}
    plan = RolloutPlan(samples, "fifo", tail=enough.tail)
    assert [plan.next().id for _ in range(6)] == ["s0", "s1", "s3", "s4", "s2", "s5"]
    makespan = RolloutPlan([s for s in samples], "makespan", tail=enough.tail)
    for s, tokens in zip(samples, (10, 20, 90, 30, 40, 80)):
        s.told_tokens = tokens
    assert [makespan.next().id for _ in range(6)] == ["s4", "s3", "s1", "s0", "s2", "s5"]
    assert FirstK(samples, share=0.5).tail == frozenset() and FirstK(samples).tail == frozenset()
