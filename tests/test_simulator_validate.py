"""The validation path: the replay's records in, per-run metric errors out (no Ray, no model)."""

from dataclasses import replace

import numpy as np
import pytest

from benchmarks.replay.records import write_records
from benchmarks.replay.trace import TraceRequest
from benchmarks.simulator.engine import EngineLimits
from benchmarks.simulator.experiment import run
from benchmarks.simulator.setup import Setup
from benchmarks.simulator.step_time import StepTimeModel
from benchmarks.simulator.validate import against_replay
from deployments.config import StackConfig
from router.length_bins import PoolBins

POOLS = ["short", "medium", "long"]


def _setup() -> Setup:
    config = StackConfig.model_validate({
        "pools": [{"name": p, "deployment": {"num_replicas": 1, "max_ongoing_requests": 4}} for p in POOLS],
        "predictor": None,
        "router": {"policy": "round_robin", "output_edges": [50, 200], "input_edges": [100, 250]},
    })
    return Setup(
        config=config, model=StepTimeModel(const=0.02, decode_seqs=0.002, prefill_tokens=0.0002, kv_tokens=1e-6),
        limits=EngineLimits(max_num_seqs=64, max_num_batched_tokens=512, kv_cache_tokens=20_000),
        pool_bins=PoolBins(tuple(POOLS), (50.0, 200.0)), head_bins={"estp": None, "egtp": None},
        predictions={"estp": {}, "egtp": {}}, calibration={"settings": {"cpus": 2}},
    )


def _trace(n=60, seed=0) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.3, n))
    return [TraceRequest(request_id=f"r{i:05d}", arrival_s=float(t), prompt_id=f"p{i}", scenario="chat",
                         messages=[{"role": "user", "content": "hi"}], max_tokens=1024,
                         true_output_tokens=int(rng.integers(1, 400)), prompt_tokens=int(rng.integers(5, 300)))
            for i, t in enumerate(arrivals)]


@pytest.mark.parametrize("mode", ["open", "batch"])
def test_the_simulator_validated_against_its_own_records_shows_no_error(tmp_path, mode):
    setup, trace = _setup(), _trace()
    records = run(setup, trace, "oracle", 3, mode, batch_size=4) + run(setup, trace, "round_robin", 3, mode, batch_size=4)
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
    setup, trace = _setup(), _trace()
    slow = StepTimeModel(**{k: 2 * v for k, v in setup.model.model_dump().items()})
    records = run(replace(setup, model=slow), trace, "oracle", 3, "open", batch_size=4)
    write_records(tmp_path / "replay.jsonl", records)
    result = against_replay(setup, tmp_path / "replay.jsonl")
    assert result["fitted_slowdown"] == pytest.approx(2.0, rel=1e-3)
    assert abs(result["runs"]["oracle/open"]["errors_fitted"]["mean_jct_s"]["rel_error"]) < 1e-3
    assert result["runs"]["oracle/open"]["errors"]["mean_jct_s"]["rel_error"] < -0.4
