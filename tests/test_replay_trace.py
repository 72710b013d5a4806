"""Replay traces: seeded, rate-scaled, and carrying the dataset's true lengths."""

import random

import pytest

from benchmarks.replay.trace import arrival_times, build_trace, read_trace, trace_gaps, write_trace
from tests import FORELEN_TINY as TINY



def test_same_seed_same_trace_and_other_seed_differs():
    a = build_trace(TINY, split="train", n=12, rate=2.0, seed=3)
    assert a == build_trace(TINY, split="train", n=12, rate=2.0, seed=3)
    assert a != build_trace(TINY, split="train", n=12, rate=2.0, seed=4)


def test_requests_carry_capped_true_lengths_from_their_split():
    from predictor.dataset import load_samples

    rows = load_samples(TINY, split="train")
    trace = build_trace(TINY, split="train", n=20, max_tokens=50, seed=0)
    assert [r.request_id for r in trace] == sorted({r.request_id for r in trace})
    for req in trace:
        same = [r for r in rows if (r["prompt_id"], r["prompt"]) == (req.prompt_id, req.messages[0]["content"])]
        assert req.true_output_tokens in {min(r["output_tokens"], 50) for r in same} and req.max_tokens == 50
        assert req.prompt_tokens == same[0]["prompt_tokens"] and req.scenario == same[0]["scenario"]


def test_ceiling_is_the_median_of_the_prompts_other_samples_never_its_own():
    from predictor.dataset import load_samples

    rows = load_samples(TINY, split="train")
    for req in build_trace(TINY, split="train", n=20, max_tokens=50, seed=0):
        siblings = [min(r["output_tokens"], 50) for r in rows if r["prompt_id"] == req.prompt_id]
        if len(siblings) < 3:
            assert req.ceiling_tokens is None
            continue
        others = sorted(siblings)
        others.remove(req.true_output_tokens)
        mid = len(others) // 2
        expected = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
        assert req.ceiling_tokens == round(expected)


def test_draws_without_replacement_until_the_split_is_used_up():
    trace = build_trace(TINY, split="train", n=27, seed=1)
    assert len({(r.prompt_id, r.messages[0]["content"], r.true_output_tokens) for r in trace}) >= 20
    assert len(build_trace(TINY, split="test", n=5, seed=1)) == 5  # 2 test rows, reused


@pytest.mark.parametrize("arrival", ["poisson", "azure", "mooncake"])
def test_arrivals_start_at_zero_increase_and_match_the_target_rate(arrival):
    times = arrival_times(400, arrival, rate=4.0, rng=random.Random(0))
    assert times[0] == 0 and all(b >= a for a, b in zip(times, times[1:]))
    assert 399 / times[-1] == pytest.approx(4.0, rel=0.15 if arrival == "poisson" else 1e-6)


def test_real_trace_gaps_keep_their_burstiness():
    gaps = trace_gaps("azure")
    mean = sum(gaps) / len(gaps)
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert len(gaps) > 10_000 and cv > 1.0  # burstier than Poisson (cv = 1)


def test_bad_arguments_fail_fast():
    with pytest.raises(ValueError):
        arrival_times(3, "uniform", 1.0, random.Random(0))
    with pytest.raises(ValueError):
        arrival_times(3, "poisson", 0.0, random.Random(0))
    with pytest.raises(ValueError):
        build_trace(TINY, split="test", n=3, scenarios=["chat"])


def test_trace_round_trips_through_jsonl(tmp_path):
    trace = build_trace(TINY, split="train", n=6, arrival="azure", rate=1.5, seed=2)
    write_trace(tmp_path / "t.jsonl", trace)
    assert read_trace(tmp_path / "t.jsonl") == trace
    assert trace[0].body("m")["messages"] == trace[0].messages


def test_max_true_tokens_keeps_only_answers_that_ended_within_it():
    from predictor.dataset import load_samples

    limit = sorted(r["output_tokens"] for r in load_samples(TINY, split="train"))[10]
    trace = build_trace(TINY, split="train", n=30, max_true_tokens=limit, seed=0)
    assert all(r.true_output_tokens <= limit for r in trace)
    assert len({r.true_output_tokens for r in trace}) > 1
