"""`python -m benchmarks.simulator <command>`

  predict    ESTP/EGTP predictions for every dataset prompt (cached; torch prefill)
  calibrate  measure a vLLM engine's step times, fit the step-time model (vLLM)
  measure    a small real engine replay to validate against (vLLM)
  run        validation against the real runs, the scale runs, simulator.{json,md,png}
  sweep      routing gains vs predictor accuracy (a blurred oracle beside the heads),
             simulator_accuracy_sweep.{json,md,png}

predict, calibrate and measure run the real model: on a shared machine wrap them in the
heavy-run lock. `run` and `sweep` only simulate.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
READING_NOTE = (
    "How to read: ESTP and EGTP route on the committed checkpoints' predictions (see the prediction table: "
    "the pool accuracy of each head on the test split); the oracle routes on the true lengths, so its "
    "columns are what a perfect predictor would give with the same pools. Open loop is continuous "
    "batching, where a short request never waits for a long one inside a batch: length-aware routing can "
    "only help through queueing, and it costs statistical multiplexing (three smaller pools). Batch mode "
    "decodes fixed groups, where length-homogeneous groups cut the padding. With pools sized evenly the "
    "long pool gets most of the decode work; sized by work, round-robin overloads the small short pool "
    "and ray_default is the fair length-blind baseline."
)
GPU_NOTE = (
    "What a GPU changes: the step-time model is a parameter file. On a GPU a decode step is bound by "
    "reading the weights, so the fixed cost per step dominates and each extra sequence in the batch costs "
    "little: batching is nearly free, the barrel effect of batch mode costs slots rather than compute, and "
    "KV capacity (not max_ongoing_requests) limits the batch. Calibrate there with the same command "
    "(ray_config.yaml with accelerator: gpu) and rerun `run`; nothing in the simulator is CPU-specific."
)


def _run(args) -> None:
    from benchmarks.simulator.report import write
    from benchmarks.simulator.scale import replica_capacity_rps, scale_runs
    from benchmarks.simulator.setup import load_setup
    from benchmarks.simulator.validate import against_engine, against_replay

    setup = load_setup()
    validation = {}
    if args.replay.exists():
        validation["real replay (HTTP stack, 3 pools x 1 replica)"] = against_replay(setup, args.replay)
    if args.engine.exists():
        validation["engine replay (one vLLM engine, no Ray)"] = against_engine(setup, args.engine)
    cal = setup.calibration
    result = {
        "calibration": {"model": cal["model"], "fit": cal["fit"], "limits": cal["limits"]},
        "prediction_quality_test_split": setup.prediction_quality("test"),
        "pool_edges": list(setup.pool_bins.edges),
        "validation": validation,
        "scale": None,
        "notes": [READING_NOTE, GPU_NOTE],
    }
    if args.replicas:
        capacity = replica_capacity_rps(setup)
        rps = round(args.load * capacity, 4)
        result["scale"] = {
            "requests": args.requests, "load": args.load, "replica_capacity_rps": capacity, "rps_per_replica": rps,
            "batch_size": args.batch_size, "modes": args.modes, "replicas": args.replicas, "sizings": args.sizing,
            "results": scale_runs(setup, args.replicas, args.requests, rps, args.modes, args.batch_size, args.sizing,
                                  seed=args.seed, workers=args.workers),
        }
    elif (args.out / "simulator.json").exists():  # validation only: keep the last scale runs
        result["scale"] = json.loads((args.out / "simulator.json").read_text()).get("scale")
    write(result, args.out)
    print(json.dumps({k: v for k, v in result.items() if k != "scale"}, indent=1))


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simulator", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("predict", help="ESTP/EGTP predictions for every dataset prompt (cached)")
    p.add_argument("--threads", type=int, default=2)
    sub.add_parser("calibrate", help="measure vLLM step times, fit the step-time model")
    p = sub.add_parser("measure", help="a small real engine replay to validate the simulator on")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--rate", type=float, default=0.4, help="requests/s")
    p.add_argument("--max-tokens", type=int, default=384)
    p = sub.add_parser("run", help="validation + scale runs -> benchmarks/results/simulator.*")
    p.add_argument("--replicas", type=int, nargs="*", default=[10, 100, 1000],
                   help="cluster sizes; none (`--replicas` alone): validation only, keeping the last scale runs")
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--load", type=float, default=0.8,
                   help="offered load per replica as a fraction of a full replica's capacity (step-time model)")
    p.add_argument("--modes", nargs="+", default=["open", "batch"], choices=["open", "batch"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--sizing", nargs="+", default=["even", "work"], choices=["even", "work"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="parallel simulation processes")
    p.add_argument("--replay", type=Path, default=RESULTS / "replay_requests.jsonl")
    p.add_argument("--engine", type=Path, default=RESULTS / "simulator_engine_replay.json")
    p.add_argument("--out", type=Path, default=RESULTS)
    p = sub.add_parser("sweep", help="routing gains vs predictor accuracy -> simulator_accuracy_sweep.*")
    p.add_argument("--replicas", type=int, default=100)
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--load", type=float, default=0.8)
    p.add_argument("--modes", nargs="+", default=["open", "batch"], choices=["open", "batch"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--sizing", default="work", choices=["even", "work"])
    p.add_argument("--noise", type=float, nargs="+", help="log-normal widths for the blurred oracle")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.command == "predict":
        from benchmarks.simulator.calibrate import stack_model
        from benchmarks.simulator.predictions import predict_all

        config, _ = stack_model()
        print(json.dumps(predict_all(config.predictor.max_prompt_tokens, threads=args.threads)))
    elif args.command == "calibrate":
        from benchmarks.simulator.calibrate import calibrate

        print(json.dumps(calibrate(), indent=1))
    elif args.command == "measure":
        from benchmarks.simulator.engine_replay import measure

        print(json.dumps(measure(n=args.requests, rate=args.rate, max_tokens=args.max_tokens)))
    elif args.command == "sweep":
        from benchmarks.simulator.setup import load_setup
        from benchmarks.simulator.sweep import NOISE, sweep, write

        result = sweep(load_setup(), args.replicas, args.requests, args.load, args.modes, args.batch_size, args.sizing,
                       tuple(args.noise or NOISE), seed=args.seed, workers=args.workers)
        write(result, args.out)
        print(json.dumps({m: r["break_even_accuracy"] for m, r in result["modes"].items()}))
    else:
        _run(args)


if __name__ == "__main__":
    main()
