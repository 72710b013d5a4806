"""A tiny simulator setup and trace for unit tests: three pools, a made-up step-time model, no model files."""

import numpy as np

from benchmarks.replay.trace import TraceRequest
from benchmarks.simulator.engine import EngineLimits
from benchmarks.simulator.setup import Setup
from benchmarks.simulator.step_time import StepTimeModel
from predictor.head import LengthBins
from router.scheduling.pools import Pools
from router.serving.config import RoutingPlan, StackConfig

POOLS = ["short", "medium", "long"]
BINS = LengthBins(edges=[0, 50, 200, 1024], centres=[25, 120, 600], max_tokens=1024)


def tiny_setup() -> Setup:
    config = StackConfig.model_validate({
        "pools": [{"name": p, "deployment": {"num_replicas": 1, "max_ongoing_requests": 4}} for p in POOLS],
        "predictor": None,
        "router": {"policy": "round_robin", "output_edges": [50, 200], "input_edges": [100, 250]},
    })
    plan = RoutingPlan("", Pools(tuple(POOLS), (50.0, 200.0)), {"last": BINS, "estp": BINS, "egtp": BINS}, None, 256.0)
    return Setup(
        config=config, model=StepTimeModel(const=0.02, decode_seqs=0.002, prefill_tokens=0.0002, kv_tokens=1e-6),
        limits=EngineLimits(max_num_seqs=64, max_num_batched_tokens=512, kv_cache_tokens=20_000), plan=plan,
        predictions={"estp": {}, "egtp": {}, "last": {}}, calibration={"settings": {"cpus": 2}},
    )


def tiny_trace(n=60, seed=0) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.3, n))
    return [TraceRequest(request_id=f"r{i:05d}", arrival_s=float(t), prompt_id=f"p{i}", scenario="chat",
                         messages=[{"role": "user", "content": "hi"}], max_tokens=1024,
                         true_output_tokens=int(rng.integers(1, 400)), prompt_tokens=int(rng.integers(5, 300)))
            for i, t in enumerate(arrivals)]
