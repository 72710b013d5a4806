"""The validation path: the replay's records in, per-run metric errors out (no Ray, no model)."""

from dataclasses import replace

import pytest

from benchmarks.replay.records import write_records
from benchmarks.simulator.experiment import run
from benchmarks.simulator.step_time import StepTimeModel
from benchmarks.simulator.validate import against_replay
from tests.sim_setup import tiny_setup, tiny_trace

@pytest.mark.parametrize("mode", ["open", "batch"])
def test_the_simulator_validated_against_its_own_records_shows_no_error(tmp_path, mode):
    setup, trace = tiny_setup(), tiny_trace()
    records = run(setup, trace, "oracle", 3, mode, batch_size=4).records + run(setup, trace, "round_robin", 3, mode, batch_size=4).records
    write_records(tmp_path / "replay.jsonl", records)
    result = against_replay(setup, tmp_path / "replay.jsonl")
    assert set(result["runs"]) == {f"oracle/{mode}", f"round_robin/{mode}"}
    assert result["fitted_slowdown"] == pytest.approx(1.0, abs=1e-3)  # nothing left out to stand for
    assert result["shared_cores_slowdown"] == 1.5  # three one-thread engines on two cores
    for run_result in result["runs"].values():
        assert run_result["requests"] == len(trace)
        assert {"mean_jct_s", "throughput_tok_s"} <= set(run_result["errors"])
        assert all(abs(e["rel_error"]) < 1e-9 for e in run_result["errors"].values())
        assert run_result["errors_shared_cores"]["mean_jct_s"]["rel_error"] > 0.2  # every step 1.5x longer


def test_the_fitted_slowdown_recovers_an_engine_twice_as_slow_as_calibrated(tmp_path):
    setup, trace = tiny_setup(), tiny_trace()
    slow = StepTimeModel(**{k: 2 * v for k, v in setup.model.model_dump().items()})
    records = run(replace(setup, model=slow), trace, "oracle", 3, "open", batch_size=4).records
    write_records(tmp_path / "replay.jsonl", records)
    result = against_replay(setup, tmp_path / "replay.jsonl")
    assert result["fitted_slowdown"] == pytest.approx(2.0, rel=1e-3)
    assert abs(result["runs"]["oracle/open"]["errors_fitted"]["mean_jct_s"]["rel_error"]) < 1e-3
    assert result["runs"]["oracle/open"]["errors"]["mean_jct_s"]["rel_error"] < -0.4
