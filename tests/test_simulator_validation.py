"""The validation's judgements: the noise floor of single real runs and the sign check (pure maths)."""

import numpy as np
import pytest

from benchmarks.simulator.validation import (AGGREGATES, decoding_per_engine, merged, metrics, noise_floor,
                                             rollout_run, sign_agreement, tpot_by_batch)


def _run(jct: float) -> dict:
    return {metric: jct for metric in AGGREGATES}


def test_the_noise_floor_is_how_far_single_runs_land_from_their_repeats_mean():
    real = {"burst/a": [_run(90), _run(110)], "burst/b": [_run(200), _run(200)], "burst/c": [_run(50)]}
    floor = noise_floor(real)
    assert floor["mean_jct_s"] == pytest.approx((0.1 + 0.1 + 0 + 0) / 4)  # a policy run once has no spread
    assert noise_floor({"burst/c": [_run(50)]})["mean_jct_s"] is None


def test_a_difference_counts_only_when_every_repeat_agrees_and_the_simulator_must_share_its_sign():
    real = {"w/ray_default": [_run(100), _run(100)], "w/fast": [_run(80), _run(90)], "w/mixed": [_run(90), _run(110)],
            "w/slow": [_run(120), _run(125)]}
    sim = {"w/ray_default": [_run(100), _run(100)], "w/fast": [_run(95), _run(95)], "w/mixed": [_run(50), _run(50)],
           "w/slow": [_run(99), _run(99)]}
    result = sign_agreement(real, sim)
    rows = {row["policy"]: row for row in result["rows"]}
    assert not rows["mixed"]["resolved"]  # -10% and +10%: within the repeats' spread
    assert rows["fast"]["resolved"] and rows["fast"]["same_sign"]
    assert rows["slow"]["resolved"] and not rows["slow"]["same_sign"]
    assert (result["agree"], result["of"]) == (1, 2) and type(result["agree"]) is int  # JSON-safe


def test_the_predictors_busy_time_is_the_union_of_its_requests_waits():
    assert merged([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (3.0, 4.0)]) == [(0.0, 4.0), (5.0, 6.0)]
    assert merged([]) == []


def _timed_run(name: str, seed: int, n: int, span_s: float, machine):
    """n requests arriving over span_s, timed by the simulator itself on a machine of known factors."""
    import numpy as np

    from benchmarks.simulator.setup import load_setup
    from benchmarks.simulator.validation import Run, simulated
    from router.scheduling.request import Request

    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, span_s, n))
    requests = [Request(f"r{i}", "ray_default", arrival=float(t), prompt_tokens=int(rng.integers(20, 400)),
                        max_tokens=1024) for i, t in enumerate(arrival)]
    run = Run(name, "online", "ray_default", "least_inflight", requests, rng.integers(20, 400, n),
              arrival, np.zeros(n), np.zeros(n), [])
    run.first_token, run.finish = simulated(run, load_setup(), machine, 2, 16)
    return run


def test_the_fit_finds_the_step_time_factors_a_run_was_timed_with():
    """A run timed by the simulator itself with known factors: the fit must leave its starting point
    (it once stopped there at once: scipy's first simplex around 0 is 0.00025 wide) and time the
    run as it was timed."""
    import numpy as np

    from benchmarks.simulator.setup import load_setup
    from benchmarks.simulator.hops import Hops
    from benchmarks.simulator.fit import Fit
    from benchmarks.simulator.validation import fit_scales, simulated

    setup, run = load_setup(), _timed_run("synthetic", 0, 60, 40, Fit(0.4, 0.6, 0.5))
    fit = fit_scales([run], setup, Hops(), probe_tokens=40, probe_sizes=set())
    assert abs(fit.const - 1) > 0.2
    _, finish = simulated(run, setup, fit, 2, 16)
    assert np.median(np.abs(finish - run.finish) / (run.finish - run.arrival)) < 0.05


def test_the_same_workload_comparison_replays_a_run_both_ways():
    """A burst of 4x the slots with exact predictions: shortest-first must beat arrival order on
    that very workload, and a run of ray_default itself is no comparison."""
    import numpy as np

    from benchmarks.simulator.setup import SINGLE_POOL, load_setup
    from benchmarks.simulator.fit import Fit
    from benchmarks.simulator.validation import Run, same_workload
    from router.scheduling.request import Prediction, Request

    setup, rng, n = load_setup(), np.random.default_rng(1), 128
    output = rng.choice([20, 1000], n)
    requests = [Request(f"r{i}", "early_work", arrival=0.0, prompt_tokens=50, max_tokens=1024,
                        prediction=Prediction("early", float(out), {}, SINGLE_POOL, {})) for i, out in enumerate(output)]
    run = Run("burst/early_work/r0", "online", "early_work", "least_inflight", requests, output,
              np.zeros(n), np.zeros(n), np.zeros(n), [])
    blind = Run("burst/ray_default/r0", "online", "ray_default", "least_inflight", requests, output,
                np.zeros(n), np.zeros(n), np.zeros(n), [])
    changes = same_workload({run.name: run, blind.name: blind}, setup, Fit())
    assert list(changes) == ["burst/early_work"] and len(changes["burst/early_work"]) == 1
    assert changes["burst/early_work"][0] < -0.1


def test_a_longest_first_rollout_is_replayed_in_the_batchs_order_on_its_own_lengths():
    """40 samples on 32 slots, the 4 long ones last in the batch: longest-first starts them at once
    and must end the batch sooner than fifo on those very lengths; a fifo run is no comparison."""
    from benchmarks.simulator.fit import Fit
    from benchmarks.simulator.setup import load_setup
    from benchmarks.simulator.validation import same_workload

    lengths = [30] * 36 + [400] * 4
    samples = [{"prompt_index": i // 8, "sample_index": i % 8, "status": "done", "completion_tokens": n,
                "error": None, "estimated_tokens": n, "first_token_s": 0.1, "finished_s": 1.0}
               for i, n in enumerate(lengths)]
    runs = {name: rollout_run(name, samples, schedule, [40] * 5, max_tokens=512)
            for name, schedule in (("rl/history/r0", "makespan"), ("rl/fifo/r0", "fifo"))}
    changes = same_workload(runs, load_setup(), Fit())
    assert list(changes) == ["rl/history"] and changes["rl/history"][0] < -0.1


def test_where_nothing_waits_the_same_workload_shows_no_order_effect_whatever_the_probe():
    """Calm arrivals never fill a slot, so no order acts: both replays of a run probed at two sizes
    (whose split times it unlike its full probe alone) must come out the same."""
    import numpy as np

    from benchmarks.replay.probe import Probe
    from benchmarks.simulator.setup import SINGLE_POOL, load_setup
    from benchmarks.simulator.fit import Fit
    from benchmarks.simulator.validation import Run, same_workload
    from router.scheduling.request import Prediction, Request

    setup, n = load_setup(), 20
    output = np.full(n, 50)
    requests = [Request(f"r{i}", "last_work", arrival=30.0 * i, prompt_tokens=50, max_tokens=1024,
                        prediction=Prediction("last", 50.0, {}, SINGLE_POOL, {})) for i in range(n)]
    run = Run("calm/last_work/r0", "online", "last_work", "least_inflight", requests, output,
              30.0 * np.arange(n), np.zeros(n), np.zeros(n), [], probe=Probe(32, 0.3, None, 8, 0.1))
    fit = Fit(references={8: 0.05, 32: 0.08}, probe_prompt_tokens=40)
    assert fit.machine(setup.model, run.probe)[0] != pytest.approx(fit.machine(setup.model, run.probe)[1])
    assert same_workload({run.name: run}, setup, fit)["calm/last_work"] == [pytest.approx(0.0, abs=1e-9)]


def test_a_run_probed_slower_than_the_fit_runs_is_timed_that_much_slower():
    """Sessions get machines 2-3x apart: a run's probed step time scales the model against the probe
    as the fit times it; an unprobed run keeps the fit's speed."""
    from dataclasses import replace

    import numpy as np

    from benchmarks.simulator.setup import load_setup
    from benchmarks.replay.probe import Probe
    from benchmarks.simulator.hops import Hops
    from benchmarks.simulator.fit import Fit
    from benchmarks.simulator.validation import Run, fit_scales, probe_step_s, simulated
    from router.scheduling.request import Request

    setup = load_setup()
    requests = [Request("r0", "ray_default", arrival=0.0, prompt_tokens=50, max_tokens=1024)]
    run = Run("probe/ray_default/r0", "online", "ray_default", "least_inflight", requests, np.array([200]),
              np.zeros(1), np.zeros(1), np.zeros(1), [])
    fit = Fit(references={32: 0.1})
    first, finish = simulated(run, setup, fit, 2, 16)
    slow_first, slow_finish = simulated(replace(run, probe=Probe(32, 0.2)), setup, fit, 2, 16)
    assert (slow_finish - slow_first)[0] == pytest.approx(2 * (finish - first)[0], rel=1e-6)
    assert simulated(replace(run, probe=Probe(32, 0.2)), setup, Fit(), 2, 16)[1][0] == pytest.approx(finish[0])  # no reference
    # A probe of another size is judged only against the fit's probe of that size.
    assert simulated(replace(run, probe=Probe(16, 0.2)), setup, fit, 2, 16)[1][0] == pytest.approx(finish[0])
    run.first_token, run.finish = first, finish
    fit = fit_scales([run], setup, Hops(), probe_tokens=40, probe_sizes={16, 32})
    # The reference is the probe as the fitted factors time it, whether or not a fit run was probed.
    slower = replace(fit, const=2 * fit.const, decode=2 * fit.decode, prefill=2 * fit.prefill, kv=2 * fit.kv)
    for size in (16, 32):
        assert fit.references[size] == pytest.approx(probe_step_s(setup, replace(fit, references={}), 40, size))
        assert probe_step_s(setup, slower, 40, size) == pytest.approx(2 * fit.references[size], rel=0.05)
    assert fit.references[32] > fit.references[16]  # more sequences a step: a longer step


def test_a_machine_probed_at_two_sizes_is_split_into_fixed_cost_and_per_sequence_work():
    """A machine slower only on the fixed cost slows the small probe more than the full one, and the
    split gives back 3x on the fixed cost and 1x on the work; an even slowdown is the one-size factor."""
    from benchmarks.replay.probe import Probe
    from benchmarks.simulator.setup import load_setup
    from benchmarks.simulator.fit import Fit

    base = load_setup().model
    fit = Fit(0.8, 0.4, 0.5, references={8: 0.05, 32: 0.08}, probe_prompt_tokens=40)
    step = lambda model, requests: model.step(requests / 2, 0, requests / 2 * (40 + 32))
    fast, slow = fit.model(base), fit.model(base, Probe(32, 0.16, None, 8, 0.10))
    assert fit.machine(base, Probe(32, 0.16, None, 8, 0.10)) == pytest.approx((2.0, 2.0))  # evenly 2x slower
    # A machine whose fixed cost is 3x and whose work is unchanged, as its two probes would read it:
    for_probe = {n: fit.references[n] * (3 * fast.const + step(fast, n) - fast.const) / step(fast, n) for n in (8, 32)}
    fixed, work = fit.machine(base, Probe(32, for_probe[32], None, 8, for_probe[8]))
    assert fixed == pytest.approx(3.0) and work == pytest.approx(1.0)
    assert slow.const == pytest.approx(2 * fast.const)
    # Readings no split explains (the small probe slower than the full one): the full probe's factor.
    assert fit.machine(base, Probe(32, 0.08, None, 8, 0.2)) == pytest.approx((1.0, 1.0))
    assert fit.machine(base, Probe(32, 0.16)) == pytest.approx((2.0, 2.0))  # one size


def test_a_fit_on_unprobed_runs_times_a_run_probed_on_a_slower_machine():
    """The cross-session case: the fit runs were made before runs were probed, and a later run on a
    machine twice as slow probed twice the step time the fit's factors give the probe: it is timed
    twice as slow, as it ran."""
    from dataclasses import replace

    import numpy as np

    from benchmarks.simulator.setup import load_setup
    from benchmarks.replay.probe import Probe
    from benchmarks.simulator.hops import Hops
    from benchmarks.simulator.fit import Fit
    from benchmarks.simulator.validation import fit_scales, probe_step_s, simulated

    setup, machine, slow_machine = load_setup(), Fit(0.5, 0.7, 0.6, 0.7), Fit(1.0, 1.4, 1.2, 1.4)
    old = _timed_run("old", 1, 40, 30, machine)
    # A burst alone cannot split a step's fixed cost from its per-sequence cost, which a probe reads
    # in its own proportion: the real fit has a calm run for that too.
    calm = _timed_run("calm", 2, 40, 400, machine)
    new = replace(_timed_run("new", 1, 40, 30, slow_machine), probe=Probe(32, probe_step_s(setup, slow_machine, 40, 32)))
    fit = fit_scales([old, calm], setup, Hops(), probe_tokens=40, probe_sizes={32})
    for scaled, error in ((new, lambda e: e < 0.05), (replace(new, probe=None), lambda e: e > 0.3)):
        _, finish = simulated(scaled, setup, fit, 2, 16)
        assert error(np.median(np.abs(finish - new.finish) / (new.finish - new.arrival)))


def test_a_run_whose_router_turned_requests_away_is_not_replayed(tmp_path):
    """The simulator has no queue bound: a run with 503s would be replayed as a smaller workload."""
    import json

    from benchmarks.replay.runs import RUNS
    from benchmarks.simulator.validation import load_runs

    lines = (RUNS / "fixed_burst" / "ray_default__r0.jsonl").read_text().splitlines()[:4]
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "ray_default__r0.jsonl").write_text("\n".join(lines) + "\n")
    turned_away = [json.loads(line) for line in lines]
    turned_away[-1].update(status="failed", error="InternalServerError: Error code: 503")
    (tmp_path / "w" / "ray_default__r1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in turned_away))
    runs = load_runs(tmp_path)
    assert list(runs) == ["w/ray_default/r0"] and len(runs["w/ray_default/r0"].requests) == 4


def test_the_validated_setup_reads_the_saved_fit_back(tmp_path):
    """JSON keeps the probe sizes as strings; the fit read back prices the same probe."""
    import json

    from benchmarks.simulator.hops import Hops
    from benchmarks.simulator.setup import validated_setup

    saved = {"const": 0.5, "decode": 0.6, "prefill": 0.7, "kv": 0.3, "delay_in_s": 0.02, "delay_in_per_request_s": 0.008,
             "delay_out_s": 0.01, "predictor": 1.5, "references": {"32": 0.4}}
    (tmp_path / "v.json").write_text(json.dumps({"fit": saved}))
    setup = validated_setup(validation=tmp_path / "v.json")
    assert setup.validated and setup.hops == Hops(0.02, 0.008, 0.01)


def test_the_decoding_batch_is_the_runs_decode_time_over_its_span_per_engine():
    first, finish = np.array([0.0, 0.0, 5.0]), np.array([10.0, 5.0, 10.0])  # 20 s of decoding in 10 s
    assert decoding_per_engine(first, finish, replicas=2) == pytest.approx(1.0)
    assert decoding_per_engine(first, finish, replicas=1) == pytest.approx(2.0)


def test_a_first_k_sample_cut_before_it_started_is_replayed_at_its_cap_and_timed_nowhere():
    def sample(i, status, tokens, first, finish):
        return {"prompt_index": 0, "sample_index": i, "status": status, "completion_tokens": tokens, "error": None,
                "estimated_tokens": None, "first_token_s": first, "finished_s": finish}

    run = rollout_run("first_k/r0", [sample(0, "done", 30, 0.5, 9.0), sample(1, "cut", 12, 0.5, 9.1),
                                     sample(2, "cut", 0, None, None)], "fifo", [40], max_tokens=64, k=1)
    assert list(run.output) == [30, 64, 64] and run.k == 1  # a cut sample would have run on to its cap
    real = metrics(run.arrival, run.first_token, run.finish, run.output)
    assert real["makespan_s"] == pytest.approx(9.1) and real["mean_jct_s"] == pytest.approx(9.05)
    assert decoding_per_engine(run.first_token, run.finish, replicas=1) == pytest.approx((8.5 + 8.6) / 8.6)


def test_tpot_errors_are_split_into_full_and_partial_batch_runs():
    run = lambda batch, err: {"decoding_per_engine": batch, "per_request": {"tpot": {"signed_median": err}}}
    compared = {"burst": run(15.0, 0.02), "calm": run(3.0, 0.4), "half": run(8.0, 0.3), "fit": run(2.0, -0.9)}
    bands = tpot_by_batch(compared, ["burst", "calm", "half"])
    assert bands["full"] == {"runs": 1, "signed_median": pytest.approx(0.02)}
    assert bands["partial"] == {"runs": 2, "signed_median": pytest.approx(0.35)}


def test_a_hinted_run_is_replayed_with_the_hints_its_router_ranked_by():
    from benchmarks.replay.runs import read_run
    from benchmarks.simulator.validation import online_run

    records = read_run("natural/default/r0")[:3]
    hinted = [records[0].model_copy(update={"hint_tokens": 40}), *records[1:]]
    run = online_run("natural/hinted/r0", hinted)
    hints = {r.id: r.hint_tokens for r in run.requests}
    assert hints[records[0].request_id] == 40 and {hints[r.request_id] for r in records[1:]} == {None}
