"""The benchmark suite's own logic: the scenario table, the apps its sides run on, the interleaving,
the workloads' traces, and the report and README table built from records on disk."""

import json

import pytest

from benchmarks import apps, report, runner, workloads
from benchmarks.replay import runs
from benchmarks.replay.actors import benchmark_headers
from benchmarks.replay.runs import RunRecord, run_path, runs_of
from benchmarks.replay.trace import TraceRequest
from benchmarks.scenarios import SCENARIOS, Scenario, Side, Target, Workload
from router.scheduling.policies import POLICIES


def test_every_scenario_is_well_formed():
    for s in SCENARIOS.values():
        names = [side.name for side in s.sides]
        assert len(set(names)) == len(names) and s.baseline in names, s.name
        assert all(t.side in names and t.side != s.baseline for t in s.targets), s.name
        assert all(side.policy is None or side.policy in POLICIES for side in s.sides), s.name
        assert s.report in {"pays_live", "queueing", "rollout"} and s.repeats >= 1
        if s.kind == "rollout":
            assert all(side.schedule for side in s.sides) and all(side.app == "stack" for side in s.sides)


def test_the_stock_comparisons_run_ray_serve_llms_app_beside_ours():
    for name in ("overhead", "natural", "hints", "calm"):
        s = SCENARIOS[name]
        assert s.baseline == "stock" and s.side("stock").app == "stock" and s.report == "pays_live"
    assert SCENARIOS["natural"].repeats >= 5 and SCENARIOS["overhead"].repeats >= 3
    assert SCENARIOS["overhead"].workload.lengths == "fixed" and SCENARIOS["natural"].workload.lengths == "natural"


def _scenario(*sides, repeats=2):
    return Scenario("t", "queueing", "q", sides, sides[0].name, repeats, Workload())


def test_a_stack_serves_only_the_heads_its_sides_read(tmp_path):
    log = tmp_path / "requests.jsonl"
    early = apps.stack_app(_scenario(Side("ray_default", policy="ray_default"),
                                     Side("early_work", policy="early_work", heads=("early",))), tmp_path)
    router = early.overrides["router"]
    assert router["policy"] == "early_work" and early.overrides["predictor"]["extra_heads"] == []
    assert router["benchmark_headers"] and router["request_log"] == str(log) and router["request_timeout_s"] == 3600
    both = apps.stack_app(_scenario(Side("last_work", policy="last_work"), Side("estp_work", policy="estp_work")), tmp_path)
    assert both.overrides["router"]["policy"] == "last_work" and both.overrides["predictor"]["extra_heads"] == ["estp"]
    # A side with no policy is served by ray_config's own: the stack keeps it.
    default = apps.stack_app(_scenario(Side("stock", app="stock"), Side("default"), Side("ray_default", policy="ray_default")), tmp_path)
    assert "policy" not in default.overrides["router"] and default.overrides["predictor"]["extra_heads"] == []
    assert "history" not in default.overrides["router"]  # online sides never inherit each other's lengths
    history = apps.stack_app(SCENARIOS["rollout_history"], tmp_path).overrides["router"]["history"]
    assert history == {"path": str(tmp_path / "length_history.json"), "lengths_per_prompt": 8}  # the last epoch


def test_the_stock_app_has_the_stacks_engines_and_rays_own_router():
    app = apps.stock_app().application
    llm = app["args"]["llm_configs"][0]
    assert app["import_path"] == "ray.serve.llm:build_openai_app"
    assert "request_router_config" not in llm["deployment_config"]
    assert "scheduling_policy" not in llm["engine_kwargs"]  # no priorities: it sends none
    assert llm["deployment_config"]["num_replicas"] == 2 and llm["deployment_config"]["max_ongoing_requests"] == 16


def test_repeats_interleave_the_apps_and_alternate_which_goes_first():
    s = _scenario(Side("stock", app="stock"), Side("default"), Side("ray_default", policy="ray_default"), repeats=4)
    assert [[side.name for side in runner.order(s, k)] for k in range(4)] == [
        ["stock", "default", "ray_default"], ["default", "ray_default", "stock"],
        ["stock", "ray_default", "default"], ["ray_default", "default", "stock"]]


def test_pending_runs_skip_what_is_on_disk_and_cap_a_reference_side(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "RUNS", tmp_path)
    s = _scenario(Side("a"), Side("oracle", repeats=1), repeats=3)
    path = run_path("t/a/r0")
    path.parent.mkdir(parents=True)
    path.write_text("")
    assert [(k, side.name) for k, side in runner.pending(s)] == [(0, "oracle"), (1, "a"), (2, "a")]
    assert runs_of("t/a") == ["t/a/r0"] and runs_of("t/b") == []


def _req(i, true=100, ceiling=90):
    return TraceRequest(request_id=f"r{i}", arrival_s=0.0, prompt_id=f"p{i}", scenario="chat",
                        messages=[{"role": "user", "content": "hi"}], max_tokens=1024, true_output_tokens=true,
                        prompt_tokens=5, ceiling_tokens=ceiling)


def test_a_fixed_length_reaches_the_stock_app_as_ignore_eos_and_hints_go_to_a_seeded_share():
    trace = [_req(i).model_copy(update={"fixed_tokens": 40 + i}) for i in range(10)]
    stock = workloads.for_side(trace, Side("stock", app="stock"))
    assert all(r.fixed_tokens is None and r.ignore_eos and r.max_tokens == 40 + i for i, r in enumerate(stock))
    assert stock[0].body("m")["extra_body"] == {"ignore_eos": True}
    half = workloads.for_side(trace, Side("hints", hints=0.5))
    assert sum(r.hint_tokens == 90 for r in half) == 5
    assert [r.hint_tokens for r in half] == [r.hint_tokens for r in workloads.for_side(trace, Side("h", hints=0.5))]
    assert all(r.hint_tokens == 90 for r in workloads.for_side(trace, Side("ceiling", hints=1.0)))
    assert half[next(i for i, r in enumerate(half) if r.hint_tokens)].body("m")["metadata"] == {"expected_output_tokens": "90"}


def test_a_budget_side_names_its_budget_on_every_request_and_the_stock_app_never_does(monkeypatch):
    monkeypatch.delenv("LENGTHSERVE_BENCHMARK_KEY", raising=False)
    trace = [_req(i) for i in range(3)]
    never = workloads.for_side(trace, Side("never", budget="never"))
    assert [benchmark_headers(r, None) for r in never] == [{"X-Predictor-Budget": "never"}] * 3
    assert all(r.predictor_budget is None for r in workloads.for_side(trace, Side("default")))
    assert all(r.predictor_budget is None for r in workloads.for_side(trace, Side("stock", app="stock")))


def test_a_loads_capacity_is_kept_and_a_later_session_replays_its_trace_at_its_own_speed(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "RUNS", tmp_path)
    monkeypatch.setattr(workloads, "capacity_per_step", lambda: 0.04)
    load = Workload(requests=20, arrivals="poisson", share=0.95, lengths="fixed")
    first = workloads.trace(load, "load", lambda: 0.4)
    again = workloads.trace(load, "load", lambda: 0.4)
    faster = workloads.trace(load, "load", lambda: 0.2)  # a later session's machine twice as fast
    assert first == again and first[-1].arrival_s > 0
    assert [r.arrival_s / 2 for r in first] == pytest.approx([r.arrival_s for r in faster])
    assert all(r.fixed_tokens == max(1, r.true_output_tokens) for r in first)
    kept = json.loads((tmp_path / "load" / "capacity.json").read_text())
    assert kept == {"capacity_rps": pytest.approx(0.1), "probe_step_s": 0.4, "requests": 20}
    with pytest.raises(ValueError, match="20 requests"):
        workloads.trace(Workload(requests=30, arrivals="poisson", share=0.95), "load", lambda: 0.4)
    burst = workloads.trace(Workload(requests=5), "burst")
    # in trace order, spaced, so both replay actors' halves reach the server interleaved as the trace has them
    assert [r.arrival_s for r in burst] == pytest.approx([i * workloads.BURST_SPACING_S for i in range(5)])
    assert all(r.fixed_tokens is None for r in burst)


def test_a_run_says_whether_the_router_saw_the_trace_in_its_order():
    def run(router_order, spacing=0.02):
        return [RunRecord(run="r", policy="p", mode="open", request_id=f"r{i}", scenario="chat", arrival_s=i * spacing,
                          prompt_tokens=5, true_output_tokens=10,
                          status="ok", router_arrival_s=None if router_order is None else 1.0 + router_order.index(i))
                for i in range(8)]

    assert runs.arrival_order_kept(run(list(range(8)))) == pytest.approx(1.0)
    # the two replay actors' halves one after the other: the odd positions first
    assert runs.arrival_order_kept(run([1, 3, 5, 7, 0, 2, 4, 6])) < 0.5
    assert runs.arrival_order_kept(run(None)) is None  # the stock app keeps no router record
    assert runs.arrival_order_kept(run(list(range(8)), spacing=0.0)) is None  # one instant: no order to keep


def _write_run(name, jcts, tokens=100):
    path = run_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [RunRecord(run=name, policy="p", mode="open", request_id=f"r{i}", scenario="chat", arrival_s=0.0,
                         first_token_s=1.0, finish_s=jct, prompt_tokens=5, completion_tokens=tokens,
                         true_output_tokens=10 * (i + 1), status="ok") for i, jct in enumerate(jcts)]
    path.write_text("".join(r.model_dump_json() + "\n" for r in records))


def test_the_report_takes_each_sides_change_per_repeat_and_judges_the_targets(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "RUNS", tmp_path)
    s = Scenario("t", "queueing", "q", (Side("base"), Side("new")), "base", 3, Workload(),
                 (Target("new", "mean_jct_s", -0.10), Target("new", "mean_jct_s", 0.0, each=True)))
    for k, factor in enumerate((0.8, 0.9, 1.05)):
        _write_run(f"t/base/r{k}", [10.0, 20.0, 30.0, 40.0])
        _write_run(f"t/new/r{k}", [factor * x for x in (10.0, 20.0, 30.0, 40.0)])
    block = report.scenario_result(s)
    change = block["changes"]["new"]["mean_jct_s"]
    assert change["median"] == pytest.approx(-0.1) and change["min"] == pytest.approx(-0.2)
    assert change["max"] == pytest.approx(0.05) and len(block["repeats"]) == 3
    assert [t["held"] for t in block["targets"]] == [True, False]  # the median held, one repeat lost
    assert [t["value"] for t in block["targets"]] == [pytest.approx(-0.1), pytest.approx(0.05)]  # that repeat
    assert block["repeats"][0]["base"]["output_tokens"] == 400 and block["lost_requests"] == 0
    paired = report.scenario_result(Scenario("t", "pays_live", "q", s.sides, "base", 3, Workload()))
    assert paired["pairs"][0]["generated_tokens"] == {"base": 400, "new": 400}  # the results schema
    table = report.markdown("pays_live", [s], {"t": paired})
    assert "| 0 | base |" in table and "| generated_tokens |" not in table  # the tally is not a side


def test_short_requests_are_those_at_or_below_the_traces_25th_percentile():
    from benchmarks.replay.metrics import short_ids

    records = [RunRecord(run="x/y/r0", policy="p", mode="open", request_id=f"r{i}", scenario="chat", arrival_s=0.0,
                         prompt_tokens=5, true_output_tokens=n, status="failed") for i, n in enumerate(range(1, 9))]
    assert short_ids(records) == {"r0", "r1"}  # 8 lengths 1..8: the 25th percentile is 2.75


def test_the_readme_table_is_rebuilt_between_its_markers(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    (tmp_path / "queueing.json").write_text(json.dumps({"fixed_burst": {
        "baseline": "ray_default", "changes": {"last_work": {"mean_jct_s": {"median": -0.1, "min": -0.13, "max": 0.008,
                                                                            "each": [-0.1, -0.13, 0.008, -0.1]}}},
        "targets": [{"target": "last_work mean_jct_s <= -10% (median)", "value": -0.1, "held": True}]}}))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{report.BEGIN}\nold\n{report.END}\nafter\n")
    report.update_readme(readme)
    text = readme.read_text()
    assert "old" not in text and text.endswith(f"{report.END}\nafter\n")
    row = next(line for line in text.splitlines() if "fixed lengths" in line)
    assert "-10.0% [-13.0%, +0.8%], 4 repeats | held | [queueing.md](benchmarks/results/queueing.md#fixed_burst)" in row


def test_the_calm_budget_row_judges_the_skipped_share_and_is_left_out_where_nothing_was_priced():
    calm = {"budget_skipped_share": 26 / 27, "budget_priced_requests": 27, "unpredicted_share": 0.998}
    assert "96.3% of 27 (99.8% of all requests served without one) | held (90%)" in report._budget_row({"calm": calm})
    assert "| missed (90%) |" in report._budget_row({"calm": {**calm, "budget_skipped_share": 0.5}})
    assert report._budget_row({"calm": {**calm, "budget_skipped_share": None}}) is None


def test_a_first_k_batch_ends_with_its_last_started_sample_and_a_partial_one_adds_its_calls():
    from benchmarks.rollouts import batch_metrics

    def sample(finished, tokens, status="done", call=1):
        return {"finished_s": finished, "completion_tokens": tokens, "status": status, "error": None,
                "replica": "a", "call": call}

    cut_unstarted = sample(None, 0, "cut")  # first-k cut it before it started: no finish
    first_k = batch_metrics([sample(10.0, 100), sample(12.0, 40, "cut"), cut_unstarted])
    assert first_k["makespan_s"] == 12.0 and first_k["output_tokens"] == 140 and first_k["cut_samples"] == 2
    partial = batch_metrics([sample(8.0, 50, "partial"), sample(5.0, 20), sample(3.0, 30, call=2)])
    assert partial["calls"] == [8.0, 3.0] and partial["makespan_s"] == 11.0 and partial["output_tokens"] == 100


def test_the_default_policy_is_read_from_each_profiles_config():
    assert apps.default_policy("cpu") == "early_work"  # ray_config.yaml: the CPU figures chose it
    assert apps.default_policy("gpu") == "last_work"  # cluster/ray_config.gpu.yaml
