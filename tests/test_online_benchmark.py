"""The online-learning benchmark's replay logic on a tiny synthetic dataset: no model, no cache."""

import json

import pytest
import torch

from benchmarks.online import report
from benchmarks.online.__main__ import references
from benchmarks.online.features import Request
from benchmarks.online.stream import ablation, aggregate, arrival_order, boundary, drift, learning_curve, recovery
from predictor.fit import FitConfig
from predictor.online import OnlineLearner

torch.set_num_threads(1)
D = 6


def synthetic(prompts: int = 90, seed: int = 0) -> list[Request]:
    """chat prompts answered once, rl prompts sampled 4 times; length grows with the first feature,
    and rl answers are longer, some cut at the cap."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for p in range(prompts):
        scenario = "rl" if p % 3 == 0 else "chat"
        x = torch.randn(D, generator=g)
        x[1] = 3.0 if scenario == "rl" else -3.0
        for s in range(4 if scenario == "rl" else 1):
            natural = int((300 + 150 * x[0] + (400 if scenario == "rl" else 0) + 30 * torch.randn(1, generator=g))
                          .clamp(5, 1500))
            out.append(Request(f"p{p}#{s}", f"p{p}", scenario, 40 + p, min(natural, 1024), x))
    return out


def make(state_dir):
    return OnlineLearner(state_dir, D, model_id="toy", model_hash="toy", floor=0.5,
                         fit=FitConfig(members=1, epochs=25, patience=8, hidden=16))


def test_arrival_keeps_a_prompts_samples_together_and_is_seeded():
    requests = synthetic()
    a, b, c = arrival_order(requests, 0), arrival_order(requests, 0), arrival_order(requests, 1)
    assert [r.request_id for r in a] == [r.request_id for r in b] != [r.request_id for r in c]
    assert sorted(r.request_id for r in a) == sorted(r.request_id for r in requests)
    runs = [r.prompt_id for i, r in enumerate(a) if i == 0 or a[i - 1].prompt_id != r.prompt_id]
    assert len(runs) == len(set(runs))  # every prompt arrives in one run
    for n in range(len(a) + 1):
        at = boundary(a, n)
        assert at >= n and (at in (0, len(a)) or a[at].prompt_id != a[at - 1].prompt_id)


def test_learning_curve_points_are_scored_on_unseen_requests_with_censored_labels():
    requests = synthetic()
    result = learning_curve(requests, make, [0, 1], [20, 60, 120], 40, 1024)
    points = result["points"]
    assert [p["observed"] for p in points] == [20, 60, 120] and set(result["seeds"]) == {"0", "1"}
    last = points[-1]
    assert last["seeds_serving"] == 2 and last["mae"] < 200 and last["concordance"] > 0.7
    assert last["mae_range"][0] <= last["mae"] <= last["mae_range"][1]
    assert set(last["scenario_mae"]) == {"chat", "rl"}
    run = result["seeds"]["0"]
    assert all(p["observed_exactly"] >= p["observed"] for p in run)
    assert run[-1]["samples"] == run[-1]["observed_exactly"]  # every request fed was joined and kept
    json.dumps(result)  # the JSON part


def test_drift_scores_every_checkpoint_on_the_same_held_back_new_requests():
    requests = synthetic(120)  # 80 chat requests, 40 rl prompts x 4 = 160 rl requests
    result = drift(requests, "chat", "rl", make, [0], 40, [0, 20, 40, 80, 120, 200], 40, 1024, steady_points=2)
    run = result["seeds"]["0"]
    assert [p["observed"] for p in result["points"]] == [0, 20, 40, 80, 120]  # 120 of 160 rl requests streamed
    assert run["scored_on"] == 40 and run["before"]  # the old traffic was learned and scored first
    assert run["after"][-1]["samples"] == 80 + run["after"][-1]["observed_exactly"]
    assert result["steady_mae"] is not None and "recovered_after" in result


def test_recovery_needs_the_mae_to_stay_within_tolerance():
    pts = [{"observed": n, "mae": m} for n, m in [(0, 300), (50, 150), (100, 200), (150, 160), (200, 150), (300, 150)]]
    r = recovery(pts, 3, 0.10)
    assert r["steady_mae"] == pytest.approx(460 / 3) and r["first_within"] == 50 and r["recovered_after"] == 150
    assert recovery([{"observed": 0, "mae": None}], 3, 0.1)["recovered_after"] is None


def test_aggregate_averages_seeds_that_serve_and_keeps_the_spread():
    point = lambda mae, cand: {"observed": 10, "mae": mae, "concordance": None if mae is None else 0.6,  # noqa: E731
                               "candidate_mae": cand, "candidate_concordance": 0.5, "refit_seconds": 1.0,
                               "samples": 8, "scenario_mae": {} if mae is None else {"chat": mae}}
    [p] = aggregate({0: [point(100.0, 110.0)], 1: [point(None, 130.0)], 2: [point(140.0, 90.0)]})
    assert p["seeds_serving"] == 2 and p["mae"] == 120 and p["mae_range"] == [100, 140] and p["mae_sd"] == 20
    assert p["candidate_mae"] == pytest.approx(110) and p["scenario_avg_mae"] == 120


def test_report_renders_targets_tables_and_plots(tmp_path):
    requests = synthetic()
    curve = learning_curve(requests, make, [0], [60, 120], 40, 1024)
    for p in curve["points"]:
        p["observed"] = {60: 300, 120: 1000}[p["observed"]]
    curve.update(offline_cv_mae=210.0, offline_cv_mae_traffic_weighted=200.0,
                 noise_floor_traffic_weighted={"in_sample": 150.0, "leave_one_out": 220.0})
    dr = {"chat_to_rl": {"steady_mae": 100.0, "recovered_after": 200, "first_within": 100, "steady_before": 90,
                         "steady_from": [400], "points": curve["points"]},
          "rl_to_chat": {"steady_mae": 100.0, "recovered_after": None, "first_within": None, "steady_before": 90,
                         "steady_from": [400], "points": curve["points"]}}
    curve["offline_cv_mae_by_scenario"] = {"chat": 290.0, "rl": 140.0}
    result = {"learning_curve": curve, "drift": dr, "settings": {"window": 40, "capacity": 100},
              "feature_extraction": {"prompts": 9, "extracted": 9, "seconds": 120.0, "threads": 1, "tokens": 99},
              "refit_seconds": {"100": 1.5}, "run_minutes": {"learning_curve": 3.0},
              "recency": {"chat_to_rl": {**dr["chat_to_rl"], "recovered_after": 400}},
              "ablation": {"default": {"300": {"mae": 200.0, "concordance": 0.7}}}, "notes": ["why it missed"]}
    md = report.markdown(result)
    assert "After 300 requests" in md and "After 1,000 requests" in md and "chat to rl" in md
    assert "recovered after 400 requests" in md and "learning curve 3.0 min" in md
    assert "CV MAE on rl is 140.0" in md and "| default | 200.0 / 0.700 |" in md and "- why it missed" in md
    assert "met (target 300)" in md and "never stayed within 10%" in md and "2.0 min" in md
    report.plot(result, tmp_path)
    assert (tmp_path / "online_learning_curve.png").stat().st_size > 0 and (tmp_path / "online_drift.png").exists()


def test_references_weight_the_offline_figures_by_the_traffic_mix(tmp_path):
    per = {"chat": 300.0, "rl": 100.0}
    (tmp_path / "predictor_accuracy.json").write_text(json.dumps({
        "toward_ceiling": {"last_ens5": {"avg": {"mae": 200.0}, **{s: {"mae": v} for s, v in per.items()}}},
        "noise_floor_mae_leave_one_out": {"chat": 250.0, "rl": 150.0}}))
    (tmp_path / "forelen_dataset.json").write_text(json.dumps({"noise_floor_mae": {"chat": 200.0, "rl": 100.0}}))
    requests = synthetic(90)  # 60 chat requests, 30 rl prompts x 4 = 120 rl requests
    refs = references(tmp_path, requests)
    assert refs["offline_cv_mae"] == 200 and refs["offline_cv_mae_traffic_weighted"] == pytest.approx(
        (60 * 300 + 120 * 100) / 180)
    assert refs["noise_floor_traffic_weighted"]["in_sample"] == pytest.approx((60 * 200 + 120 * 100) / 180)


def test_ablation_scores_every_variant_on_the_same_held_back_requests():
    variants = {"a": lambda d, seen: make(d), "b": lambda d, seen: make(d)}
    out = ablation(synthetic(120), variants, [0], [60, 120], 60, 1024)
    assert out["a"] == out["b"] and set(out["a"]) == {"60", "120"}  # same learner and data: same rows, same score
    assert out["a"]["120"]["mae"] < 250 and out["a"]["120"]["concordance"] > 0.6


def test_refit_time_is_measured_on_a_full_reservoir():
    from benchmarks.online.__main__ import refit_at_capacity

    made = []

    def tracked(state_dir):
        made.append(make(state_dir))
        return made[-1]

    assert refit_at_capacity(tracked, synthetic(30), 100, 1024) > 0
    assert made[0].status()["samples"] == 100  # 40 requests repeated under new ids fill it


def test_the_real_runs_trust_point_and_live_blocks_come_from_the_router_log():
    from benchmarks.online.real import live_blocks, trusted_after

    log = [{"finished_at": float(i), "completion_tokens": 10 * (i + 1), "finish_reason": "length" if i == 3 else "stop",
            "prediction": None if i == 0 else {"expected_tokens": 10.0 * (i + 1) + 5}} for i in range(150)]
    polls = [{"t": 40.5, "trusted": False}, {"t": 99.5, "trusted": True}, {"t": 120.0, "trusted": True}]
    assert trusted_after(polls, log) == 100  # requests finished at t = 0..99 when the switch was first seen on
    assert trusted_after(polls[:1], log) is None
    first, second = live_blocks(log)
    assert (first["requests"], first["predicted"], second["requests"]) == (100, 99, 150)
    assert first["mae"] == 5.0 and first["concordance"] == 1.0  # the cut answer and the unpredicted one left out


def test_the_cold_start_result_compares_learning_on_and_off_over_the_same_requests(monkeypatch):
    """cold_start's own bookkeeping, with the two stack runs replaced (a real run takes 40 minutes)."""

    from benchmarks.online import real
    from benchmarks.replay import trace as traces
    from benchmarks.replay.records import RequestRecord
    from benchmarks.replay.trace import TraceRequest

    prompts = [TraceRequest(request_id=f"r{i}", arrival_s=0.0, prompt_id=f"p{i}", scenario="chat",
                            messages=[{"role": "user", "content": "hi"}], max_tokens=8, true_output_tokens=0,
                            prompt_tokens=5) for i in range(6)]
    monkeypatch.setattr(traces, "held_out_chat", lambda n, seed: prompts[:n])
    runs = []

    def fake_run_stack(run, trace, overrides):
        slow = 2.0 if "predictor" in overrides else 1.0  # the learning stack takes twice as long per request
        runs.append((len(trace), overrides, run))
        records = [RequestRecord(policy="last_work", mode="open", request_id=r.request_id, scenario="chat",
                                 arrival_s=r.arrival_s, first_token_s=r.arrival_s + 0.1 * slow,
                                 finish_s=r.arrival_s + slow, prompt_tokens=5, completion_tokens=10,
                                 true_output_tokens=0, status="ok") for r in trace]
        polls = [{"t": 1.0, "learner": {"version": None}, "trusted": False},
                 {"t": 2.0, "learner": {"version": 1}, "trusted": True}]
        log = [{"finished_at": 1.5, "completion_tokens": 10, "finish_reason": "stop", "prediction": None}]
        return {"records": records, "failed": 0, "polls": polls, "log": log, "rss_growth": {}}

    monkeypatch.setattr(real, "run_stack", fake_run_stack)
    out = real.cold_start(6, 1.0, 1.0, compare=3)
    assert [n for n, _, _ in runs] == [6, 3] and runs[0][1]["predictor"]["checkpoint"] == "online" and "predictor" not in runs[1][1]
    assert runs[0][2] != runs[1][2]  # each side keeps its own per-request records
    assert out["compared_requests"] == 3 and out["on"]["requests"] == out["off"]["requests"] == 3
    assert out["throughput_ratio_vs_off"] < 1 and out["trusted_after_requests"] == 1
    assert out["first_head_after_s"] == 1.0 and out["failed"] == 0
    assert out["p50_tpot_ratio_vs_off"] == pytest.approx(2.0)  # (finish - first token) / 9 tokens, twice as slow
    assert report.real_lines(out)[0] == "## A cold start on the real stack"
