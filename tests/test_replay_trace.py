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


def test_a_run_stack_serves_only_the_heads_its_policies_read(tmp_path):
    from benchmarks.continuous.bursts import stack_overrides

    log = tmp_path / "log.jsonl"
    early = stack_overrides(["ray_default", "early_work"], log)
    assert early["router"]["policy"] == "early_work" and early["predictor"]["extra_heads"] == []
    assert early["router"]["benchmark_headers"] and early["router"]["request_log"] == str(log)
    assert early["router"]["request_timeout_s"] == 3600  # a slow machine's burst waits, never 503s
    both = stack_overrides(["last_work", "estp_work", "ceiling", "last_told"], log)
    assert both["router"]["policy"] == "last_work" and both["predictor"]["extra_heads"] == ["estp"]
    blind = stack_overrides(["ray_default", "ceiling"], log)
    assert "policy" not in blind["router"] and blind["predictor"]["extra_heads"] == []


def test_a_workloads_repeats_span_every_run_on_disk_not_the_commands_repeats(tmp_path, monkeypatch):
    from benchmarks.continuous import bursts

    monkeypatch.setattr(bursts, "RUNS", tmp_path)
    for name in ("dataset_burst_early__ray_default__r0.jsonl", "dataset_burst_early__early_work__r4.jsonl",
                 "dataset_burst__ray_default__r2.jsonl", "dataset_burst_early__early_work__r4.probe.json"):
        (tmp_path / name).write_text("")
    assert bursts.repeats_on_disk("dataset_burst_early") == 5  # r4 of one policy: five slots
    assert bursts.repeats_on_disk("dataset_burst") == 3  # not dataset_burst_early's runs
    assert bursts.repeats_on_disk("sharegpt_burst") == 0


def test_a_loads_capacity_is_kept_and_a_later_session_replays_its_trace_at_its_own_speed(tmp_path, monkeypatch):
    from benchmarks.continuous import bursts

    monkeypatch.setattr(bursts, "RUNS", tmp_path)
    monkeypatch.setattr(bursts, "capacity_per_step", lambda: 0.04)
    steps = iter([0.4, 0.4, 0.2, 0.2])  # a later session's machine twice as fast

    first = bursts.load_trace("load_fixed_poisson@0.95", "poisson", 0.95, 20, lambda: next(steps))
    again = bursts.load_trace("load_fixed_poisson@0.95", "poisson", 0.95, 20, lambda: next(steps))
    faster = bursts.load_trace("load_fixed_poisson@0.95", "poisson", 0.95, 20, lambda: next(steps))
    assert first == again and first[-1].arrival_s > 0
    assert [r.arrival_s / 2 for r in first] == pytest.approx([r.arrival_s for r in faster])
    assert [r.request_id for r in first] == [r.request_id for r in faster]
    assert all(r.fixed_tokens == max(1, r.true_output_tokens) for r in first)
    kept = bursts.kept_capacity("load_fixed_poisson@0.95")
    assert kept["capacity_rps"] == pytest.approx(0.1) and kept["probe_step_s"] == 0.4 and kept["capacity_from"] == "probe"
    with pytest.raises(ValueError, match="20 requests"):
        bursts.load_trace("load_fixed_poisson@0.95", "poisson", 0.95, 30, lambda: next(steps))


def test_a_load_of_a_new_size_is_a_workload_of_its_own():
    from benchmarks.continuous import bursts

    assert bursts.load_name("poisson", 0.95, 150) == "load_fixed_poisson@0.95"  # the first loads' names
    assert bursts.load_name("azure", 0.95, 300) == "load_fixed_azure@0.95_300"
    assert bursts.load_name("poisson", 1.05, 300) != bursts.load_name("poisson", 1.05, 150)
